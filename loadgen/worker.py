"""One publishing worker: its share of the sensors over one MQTT connection.

The worker walks its message plan round-robin, ``--per-message`` readings per message,
paced by a :class:`Pacer` holding its share of ``--rate``, joins messages into few socket
writes, collects PUBACKs (QoS 1), reconnects on errors and drains at the end. Its
counters go to shared memory for the progress line; its :class:`WorkerResult` is what
it did.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loadgen import payloads, sparkplug
from loadgen.ratelimit import Pacer
from loadgen.wire import Connection, publish_packet, remaining_length

if TYPE_CHECKING:
    from types import FrameType

    from loadgen.config import PublishSettings

logger = logging.getLogger(__name__)
# Messages joined into one socket write at most: big enough to amortise the system call.
MAX_BATCH_MESSAGES = 256
DRAIN_TIMEOUT = 30.0
CONNECT_TIMEOUT = 30.0
FIELDS = 5  # shared counters per worker: readings, messages, acked, errors, backlog


@dataclass
class WorkerResult:
    """What one worker did."""

    worker: int
    counts: dict[int, int]
    readings: int = 0
    messages: int = 0
    acked: int = 0
    errors: int = 0
    lost_messages: int = 0
    backlog: int = 0
    drained: bool = True
    started: float = 0.0
    sent_until: float = 0.0
    finished: float = 0.0


class StopFlag:
    """Set by SIGINT/SIGTERM: finish the current write, drain, report."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:  # noqa: ARG002
        """The signal handler: note the request."""
        self.requested = True


class Worker:
    """Publishes one share of the sensors over one connection."""

    def __init__(self, settings: PublishSettings, worker: int, counters: Any) -> None:  # noqa: ANN401 - a multiprocessing RawArray
        s = settings
        self.s = settings
        self.worker = worker
        self.counters = counters
        self.sensors = payloads.worker_sensors(s.sensors, s.processes, worker)
        self.run = payloads.Run(
            s.seed,
            s.sensor_prefix,
            s.sensors,
            s.per_message,
            s.start_ms,
            s.step_ms,
            s.topic_prefix,
            s.separator,
            s.untimed_every,
        )
        self.model = payloads.Model(s.seed)
        self.shapes = [self.model.shape(i) for i in self.sensors]
        # Sparkplug B: one edge node per sensor, an NBIRTH each before its NDATA.
        self.sparkplug = s.payload_format == "sparkplug"
        self.spb_seq = dict.fromkeys(self.sensors, 0)  # the NBIRTH is seq 0
        topics = [
            (
                sparkplug.fleet_topic(s.sensor_prefix, i) if self.sparkplug else self.run.topic(i)
            ).encode()
            for i in self.sensors
        ]
        self.heads = [len(t).to_bytes(2, "big") + t for t in topics]
        share = len(self.sensors) / s.sensors
        self.pacer = Pacer(s.rate * share, burst=max(1000, s.per_message))
        limits = None
        if s.count is not None:
            split = payloads.split_count(s.count, s.sensors)
            limits = [split[i] for i in self.sensors]
        plan = payloads.message_plan(self.sensors, limits, s.per_message)
        self.plan = payloads.late_plan(plan, s.per_message, s.late_every)
        self.planned = sum(limits) if limits is not None else None
        self.result = WorkerResult(worker, dict.fromkeys(self.sensors, 0))
        self.conn = Connection(
            s.host,
            s.port,
            f"loadgen-{s.sensor_prefix}-{worker}",
            username=s.username,
            password=s.password,
        )
        self.inflight: set[int] = set()
        self.next_id = 0
        self.stop = StopFlag()

    def connect(self) -> None:
        """Connect to the broker (before the common start)."""
        self.conn.connect()

    def publish(self) -> WorkerResult:
        """Publish until the plan ends, the duration passes or a signal arrives."""
        s, r = self.s, self.result
        r.started = time.monotonic()
        self.pacer.restart()
        deadline = r.started + s.duration if s.duration is not None else float("inf")
        done = self.planned == 0
        if self.sparkplug and not done:
            self._births()
        while not done and not self.stop.requested:
            now = time.monotonic()
            if now >= deadline:
                break
            allowance = self.pacer.allowance(now)
            if allowance == 0:
                time.sleep(self.pacer.wait_time(now))
                continue
            room = MAX_BATCH_MESSAGES
            if s.qos == 1:
                room = min(room, s.max_inflight - len(self.inflight))
                if room <= 0:
                    self._collect_acks(0.05)
                    continue
            batch, readings, done = self._build(allowance, room)
            if batch:
                self._send(batch, readings)
            done = done or r.readings == self.planned
        r.sent_until = min(time.monotonic(), deadline)
        r.backlog = 0 if done else self.pacer.backlog(r.sent_until)
        self._drain()
        r.finished = time.monotonic()
        self.conn.close()
        return r

    def _births(self) -> None:
        """Publish each edge node's NBIRTH first, on the same connection as its NDATA.

        Not counted as messages or readings (they carry null values only); at QoS 1 their
        PUBACKs are not tracked (packet ids above the data's range).
        """
        payload = sparkplug.fleet_birth(self.run.start_ms)
        births = []
        for n, index in enumerate(self.sensors):
            name = sparkplug.fleet_topic(self.s.sensor_prefix, index, "NBIRTH").encode()
            births.append(publish_packet(name, payload, self.s.qos, 65535 - n % 1000))
        for start in range(0, len(births), MAX_BATCH_MESSAGES):
            self.conn.write(b"".join(births[start : start + MAX_BATCH_MESSAGES]))

    def _sparkplug_data(self, pos: int, first: int, count: int) -> bytes:
        run, shape = self.run, self.shapes[pos]
        readings = []
        for seq in range(first, first + count):
            ts_ms = run.ts_ms(seq)
            readings.append((ts_ms, *self.model.values(shape, seq, ts_ms)))
        index = self.sensors[pos]
        self.spb_seq[index] = spb_seq = (self.spb_seq[index] + 1) % 256
        return sparkplug.fleet_data(readings, spb_seq)

    def _build(self, allowance: int, room: int) -> tuple[list[bytes], int, bool]:
        """Encode up to ``room`` messages holding about ``allowance`` readings."""
        batch: list[bytes] = []
        readings = 0
        qos1 = self.s.qos == 1
        run, model, shapes, heads = self.run, self.model, self.shapes, self.heads
        counts, sensors = self.result.counts, self.sensors
        while readings < allowance and len(batch) < room:
            item = next(self.plan, None)
            if item is None:
                return batch, readings, True
            pos, first, k = item
            payload = (
                self._sparkplug_data(pos, first, k)
                if self.sparkplug
                else payloads.message(run, model, shapes[pos], first, k)
            )
            index = sensors[pos]
            repeat = self.s.repeat_every
            copies = (
                2
                if repeat and run.timed(index) and (first // self.s.per_message) % repeat == 0
                else 1
            )
            for _ in range(copies):
                if qos1:
                    self.next_id = self.next_id % 65535 + 1
                    self.inflight.add(self.next_id)
                    batch.append(publish_packet(heads[pos][2:], payload, 1, self.next_id))
                else:
                    head = heads[pos]
                    batch.append(
                        b"\x30" + remaining_length(len(head) + len(payload)) + head + payload
                    )
            readings += k
            # late messages come after higher seqs: keep the max
            counts[index] = max(counts[index], first + k)
        return batch, readings, False

    def _send(self, batch: list[bytes], readings: int) -> None:
        r = self.result
        try:
            self.conn.write(b"".join(batch))
        except OSError as exc:
            logger.warning("worker %d: write failed (%s); reconnecting", self.worker, exc)
            r.errors += 1
            r.lost_messages += len(batch) + len(self.inflight)
            self.inflight.clear()
            self._reconnect()
        r.readings += readings
        r.messages += len(batch)
        self.pacer.record(readings)
        if self.s.qos == 1:
            self._collect_acks(0.0)
        elif r.messages % (MAX_BATCH_MESSAGES * 64) < len(batch):
            self._poll_quietly()
        base = self.worker * FIELDS
        self.counters[base] = r.readings
        self.counters[base + 1] = r.messages
        self.counters[base + 2] = r.acked
        self.counters[base + 3] = r.errors
        self.counters[base + 4] = self.pacer.backlog()

    def _poll_quietly(self) -> None:
        try:
            self.conn.poll(0.0)
            self.conn.keep_alive(time.monotonic())
        except OSError:
            self.result.errors += 1
            self._reconnect()

    def _collect_acks(self, timeout: float) -> None:
        try:
            self.conn.poll(timeout)
        except OSError:
            self.result.errors += 1
            self.result.lost_messages += len(self.inflight)
            self.inflight.clear()
            self._reconnect()
            return
        for packet_id in self.conn.acked:
            if packet_id in self.inflight:
                self.inflight.discard(packet_id)
                self.result.acked += 1
        self.conn.acked.clear()

    def _reconnect(self) -> None:
        self.conn.close(clean=False)
        delay = 0.1
        deadline = time.monotonic() + CONNECT_TIMEOUT
        while not self.stop.requested and time.monotonic() < deadline:
            try:
                self.conn.connect()
            except OSError:
                self.result.errors += 1
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
            else:
                return
        # Give up: end this worker's run; its summary says what was sent and lost.
        logger.warning("worker %d: cannot reconnect to the broker; stopping", self.worker)
        self.stop.requested = True

    def _drain(self) -> None:
        """Wait until the broker has everything: all PUBACKs (QoS 1) or a PINGRESP (QoS 0)."""
        deadline = time.monotonic() + DRAIN_TIMEOUT
        try:
            while self.inflight and time.monotonic() < deadline:
                self._collect_acks(min(0.1, max(0.0, deadline - time.monotonic())))
            caught_up = not self.inflight and self.conn.ping(deadline - time.monotonic())
        except OSError:
            caught_up = False
        self.result.drained = caught_up

"""Publish a simulated fleet: worker processes, each with its own MQTT connection.

Sensors are split over ``--processes`` workers (spawned, so nothing is inherited but the
settings). Each worker connects, waits for the common start, then publishes its sensors
round-robin, ``--per-message`` readings per message, paced by a :class:`Pacer` holding its
share of ``--rate``. Counters live in shared memory for the progress line; each worker
sends its result (readings per sensor, acks, errors, timings) back at the end.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import queue
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loadgen import payloads
from loadgen.ratelimit import Pacer
from loadgen.wire import Connection, publish_packet, remaining_length

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import FrameType

    from loadgen.config import PublishSettings

logger = logging.getLogger(__name__)
# Messages joined into one socket write at most: big enough to amortise the system call.
MAX_BATCH_MESSAGES = 256
DRAIN_TIMEOUT = 30.0
CONNECT_TIMEOUT = 30.0
FIELDS = 5  # shared counters per worker: readings, messages, acked, errors, backlog


class PublishError(RuntimeError):
    """The run could not start (broker unreachable, a worker died)."""


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


@dataclass
class Summary:
    """The whole run, as printed and written with ``--json``."""

    settings: PublishSettings
    results: list[WorkerResult] = field(default_factory=list)
    interrupted: bool = False

    @property
    def elapsed(self) -> float:
        """Seconds from the common start to the last worker done (broker caught up)."""
        if not self.results:
            return 0.0
        return max(r.finished for r in self.results) - min(r.started for r in self.results)

    @property
    def sending(self) -> float:
        """Seconds from the common start to the end of sending (the paced window)."""
        if not self.results:
            return 0.0
        return max(r.sent_until for r in self.results) - min(r.started for r in self.results)

    def total(self, name: str) -> int:
        """Sum of one counter over the workers."""
        return sum(int(getattr(r, name)) for r in self.results)

    def counts(self) -> list[int]:
        """Readings published per sensor index (seq 0 .. n-1 each)."""
        out = [0] * self.settings.sensors
        for result in self.results:
            for index, count in result.counts.items():
                out[index] = count
        return out

    @property
    def ok(self) -> bool:
        """No errors, everything acknowledged (QoS 1) and the broker caught up."""
        acked = self.settings.qos == 0 or self.total("acked") == self.total("messages")
        return (self.total("errors") == 0 and acked
                and all(r.drained for r in self.results) and bool(self.results))

    def as_dict(self) -> dict[str, Any]:
        """The summary as JSON-able data."""
        s = self.settings
        elapsed, sending = self.elapsed, self.sending
        readings, messages = self.total("readings"), self.total("messages")
        rate = readings / sending if sending > 0 else 0.0
        return {
            "ok": self.ok, "interrupted": self.interrupted,
            "sensor_prefix": s.sensor_prefix, "seed": s.seed, "sensors": s.sensors,
            "per_message": s.per_message, "qos": s.qos, "processes": s.processes,
            "readings": readings, "messages": messages,
            "acked": self.total("acked") if s.qos == 1 else None,
            "errors": self.total("errors"), "lost_messages": self.total("lost_messages"),
            "sending_s": round(sending, 4), "elapsed_s": round(elapsed, 4),
            "readings_per_s": round(rate, 1),
            "messages_per_s": round(messages / sending, 1) if sending > 0 else 0.0,
            "confirmed_messages_per_s": round(messages / elapsed, 1) if elapsed > 0 else 0.0,
            "target_rate": s.rate or None,
            "rate_ratio": round(rate / s.rate, 4) if s.rate else None,
            "backlog_readings": self.total("backlog"),
            "broker_caught_up": all(r.drained for r in self.results),
            "manifest": s.manifest,
        }


def message_plan(sensors: list[int], limits: list[int] | None, per_message: int
                 ) -> Iterator[tuple[int, int, int]]:
    """Messages as ``(position in sensors, first seq, readings)``, round-robin over sensors.

    With ``limits`` (readings per position) the plan ends when each sensor has sent its
    share; without, it never ends (``--duration`` stops it).
    """
    seq = 0
    while True:
        active = False
        for pos in range(len(sensors)):
            remaining = per_message if limits is None else min(per_message, limits[pos] - seq)
            if remaining > 0:
                active = True
                yield pos, seq, remaining
        if not active:
            return
        seq += per_message


def late_plan(plan: Iterator[tuple[int, int, int]], per_message: int, every: int
              ) -> Iterator[tuple[int, int, int]]:
    """``plan`` with every ``every``-th message of each sensor held back and sent at the end.

    The held-back messages arrive after all others: late and out of order, as from sensors
    that buffered while offline. Only for finite plans (``--count``).
    """
    if every <= 0:
        yield from plan
        return
    held: list[tuple[int, int, int]] = []
    for item in plan:
        if (item[1] // per_message) % every == every - 1:
            held.append(item)
        else:
            yield item
    yield from held


class _Stop:
    """Set by SIGINT/SIGTERM: finish the current write, drain, report."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:  # noqa: ARG002
        self.requested = True


class Worker:
    """Publishes one share of the sensors over one connection."""

    def __init__(self, settings: PublishSettings, worker: int, counters: Any) -> None:  # noqa: ANN401 - a multiprocessing RawArray
        s = settings
        self.s = settings
        self.worker = worker
        self.counters = counters
        self.sensors = payloads.worker_sensors(s.sensors, s.processes, worker)
        self.run = payloads.Run(s.seed, s.sensor_prefix, s.sensors, s.per_message,
                                s.start_ms, s.step_ms, s.topic_prefix)
        self.model = payloads.Model(s.seed)
        self.shapes = [self.model.shape(i) for i in self.sensors]
        topics = [self.run.topic(i).encode() for i in self.sensors]
        self.heads = [len(t).to_bytes(2, "big") + t for t in topics]
        share = len(self.sensors) / s.sensors
        self.pacer = Pacer(s.rate * share, burst=max(1000, s.per_message))
        limits = None
        if s.count is not None:
            split = payloads.split_count(s.count, s.sensors)
            limits = [split[i] for i in self.sensors]
        self.plan = late_plan(message_plan(self.sensors, limits, s.per_message),
                              s.per_message, s.late_every)
        self.planned = sum(limits) if limits is not None else None
        self.result = WorkerResult(worker, dict.fromkeys(self.sensors, 0))
        self.conn = Connection(s.host, s.port, f"loadgen-{s.sensor_prefix}-{worker}",
                               username=s.username, password=s.password)
        self.inflight: set[int] = set()
        self.next_id = 0
        self.stop = _Stop()

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
            payload = payloads.message(run, model, shapes[pos], first, k)
            if qos1:
                self.next_id = self.next_id % 65535 + 1
                self.inflight.add(self.next_id)
                batch.append(publish_packet(heads[pos][2:], payload, 1, self.next_id))
            else:
                head = heads[pos]
                batch.append(b"\x30" + remaining_length(len(head) + len(payload)) + head
                             + payload)
            readings += k
            index = sensors[pos]  # late messages come after higher seqs: keep the max
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


def worker_main(settings: PublishSettings, worker: int, counters: Any,  # noqa: ANN401
                events: Any, go: Any) -> None:  # noqa: ANN401 - multiprocessing objects
    """Entry point of a worker process: connect, report ready, wait for go, publish."""
    instance = Worker(settings, worker, counters)
    signal.signal(signal.SIGINT, instance.stop)
    signal.signal(signal.SIGTERM, instance.stop)
    try:
        instance.connect()
    except OSError as exc:
        detail = f"cannot connect to {settings.host}:{settings.port}: {exc}"
        events.put(("error", worker, detail))
        return
    events.put(("ready", worker, None))
    if not go.wait(CONNECT_TIMEOUT) or instance.stop.requested:
        instance.conn.close()
        return
    try:
        result = instance.publish()
    except (OSError, PublishError) as exc:
        events.put(("error", worker, str(exc)))
        return
    events.put(("result", worker, result))


def run_publish(settings: PublishSettings, progress: Any = None) -> Summary:  # noqa: ANN401
    """Run the workers; ``progress(counters_totals)`` is called about twice a second."""
    ctx = mp.get_context("spawn")
    counters = ctx.RawArray("d", settings.processes * FIELDS)
    events = ctx.Queue()
    go = ctx.Event()
    procs = [ctx.Process(target=worker_main, args=(settings, w, counters, events, go),
                         name=f"loadgen-{w}", daemon=True) for w in range(settings.processes)]
    summary = Summary(settings)
    stop = _Stop()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for proc in procs:
            proc.start()
        _wait_ready(events, procs, stop)
        go.set()
        summary.results = _collect(events, procs, counters, settings.processes, progress,
                                   stop)
        summary.interrupted = stop.requested
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return summary


def _wait_ready(events: Any, procs: list[Any], stop: _Stop) -> None:  # noqa: ANN401
    ready = 0
    deadline = time.monotonic() + CONNECT_TIMEOUT + 30
    while ready < len(procs):
        if stop.requested or time.monotonic() > deadline:
            raise PublishError("interrupted before the start" if stop.requested
                               else "workers did not connect in time")
        try:
            kind, worker, detail = events.get(timeout=0.5)
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                raise PublishError("a worker process died while starting") from None
            continue
        if kind == "error":
            raise PublishError(f"worker {worker}: {detail}")
        ready += 1


def _collect(events: Any, procs: list[Any], counters: Any, workers: int,  # noqa: ANN401
             progress: Any, stop: _Stop) -> list[WorkerResult]:  # noqa: ANN401
    results: dict[int, WorkerResult] = {}
    errors: list[str] = []
    forwarded = False
    while len(results) + len(errors) < workers:
        if stop.requested and not forwarded:
            _forward_stop(procs)
            forwarded = True
        try:
            kind, worker, detail = events.get(timeout=0.5)
        except queue.Empty:
            if all(not p.is_alive() for p in procs):
                _drain_events(events, results, errors)
                break
        else:
            _store(kind, worker, detail, results, errors)
        if progress is not None:
            progress(totals(counters, workers))
    if errors:
        raise PublishError("; ".join(errors))
    return [results[w] for w in sorted(results)]


def _forward_stop(procs: list[Any]) -> None:
    """A signal to this process alone (``kill PID``): pass it on so the workers drain."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()


def _drain_events(events: Any, results: dict[int, WorkerResult],  # noqa: ANN401
                  errors: list[str]) -> None:
    with contextlib.suppress(queue.Empty):
        while True:
            kind, worker, detail = events.get(timeout=0.2)
            _store(kind, worker, detail, results, errors)


def _store(kind: str, worker: int, detail: Any, results: dict[int, WorkerResult],  # noqa: ANN401
           errors: list[str]) -> None:
    if kind == "result":
        results[worker] = detail
    elif kind == "error":
        errors.append(f"worker {worker}: {detail}")


def totals(counters: Any, workers: int) -> list[float]:  # noqa: ANN401
    """Counters summed over workers: readings, messages, acked, errors, backlog."""
    return [sum(counters[w * FIELDS + i] for w in range(workers)) for i in range(FIELDS)]

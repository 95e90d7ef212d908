"""End-to-end benchmark: the daemon against the broker's own limit on the same confirmed
backlog.

For every case (readings per message x QoS), round and fleet size, each consumer in turn
(the order alternates between rounds) gets a fresh mosquitto holding the same backlog: a
persistent session is created for the consumer's client id, then ``qos1pub`` (C)
publishes every message at QoS 1 and must count a PUBACK for each, so the backlog is
known to be in the broker before the consumer connects. The consumers:

- ``idealsub``: the reference, a C consumer written for speed (bench/idealsub.c: MQTT 5,
  persistent session, 4 MiB reads, each read's messages written to a file with one
  ``write()`` and only then their PUBACKs with one more); every consumer's rate is
  reported as its ratio to this one's in the same round;
- ``mosquitto_sub``: the C client, MQTT 5, same Receive Maximum as the daemon, writing
  every message to a file;
- ``dry-run``: ``ingest run --dry-run`` (decode, batch, build the writes, ack);
- ``bucket`` / ``timeseries``: ``ingest run`` writing to ``fakemongo``, a C server that
  answers the MongoDB wire protocol at once and counts what it receives;
- with ``--baseline DIR``, ``<consumer>@base`` for each daemon consumer: the same, run
  from the source tree DIR (another version, its accelerators built there), in the same
  rounds, to compare two versions on one machine at one time.

No consumer times itself. Each connects through ``mqttrelay`` (C, bench/relay.py), which
dates from the broker's side of the socket the consumer's connect and the moment the
broker had processed the PUBACK that completed the backlog (its answer to a PINGREQ the
relay sends right after it), and counts the PUBLISHes the broker sent and the PUBACKs it
got. At QoS 1 the clock runs from connect to that moment, and a message counts as done
only once its PUBACK reached the broker; afterwards
a client resuming the consumer's session must be sent nothing (``left at the broker``).
At QoS 0 the clock ends when a single C client exits after the backlog (``--count``, ``-C``),
or, for the daemon, between the scrapes of its metrics around its last acknowledgement,
after fakemongo's last write. CPU is the consumer's own utime + stime from /proc over
the same window. Losses are counted on every side: published (PUBACKed), dropped by the
broker (its ``$SYS/broker/publish/messages/dropped``, read before and after the run),
delivered and PUBACKed (the relay), received, written, seen at the sink.

    .venv/bin/python -m bench.e2e [--sensors 1000,100000] [--rounds 5] [--json out.json]
        [--timeless] [--unidentified] [--baseline DIR]

``--sensors`` lists fleet sizes: every case runs for each, in the same rounds.
``--timeless`` leaves ``ts`` out of the payloads (readings timed at arrival, as most
devices send them). The sessions are made with the Subscription Identifier the daemon
gives its filter, as its own earlier run would have made them; ``--unidentified`` makes
them without one, as a broker that takes no identifiers or a session of a version
before them has it (each message's topic is then matched against the filters).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.relay import Relay
from ingest.config import Settings as DaemonSettings
from ingest.mqtt.subscriptions import identifier
from tests.support.procs import Broker, Daemon

if TYPE_CHECKING:
    from collections.abc import Callable

HERE = Path(__file__).resolve().parent
FILTER = "sensors/#"
CONSUMERS = ("idealsub", "mosquitto_sub", "dry-run", "bucket", "timeseries")
CLIENTS = ("idealsub", "mosquitto_sub")  # the C consumers; the others are the daemon
REFERENCE = "idealsub"  # every consumer's rate as a ratio to this one's, round by round
BASE = "@base"  # a daemon consumer run from the --baseline source tree
RECEIVE_MAXIMUM = DaemonSettings().max_inflight_messages  # the daemon's default, given to both
FAST, SLOW = 0.02, 0.25  # scrape intervals (s): near the start and end, in between
STALL = 20.0  # no progress for this long: the run ends and the rest counts as lost
START_TIMEOUT = 120.0  # the daemon's start-up, before its first message, on a busy machine
CLOSE_TIMEOUT = 10.0  # for the broker to read a stopped consumer's connection to its end
CLK_TCK = os.sysconf("SC_CLK_TCK")
SYS_INTERVAL = 1  # seconds between the broker's $SYS updates (mosquitto's sys_interval)
DROPPED = "$SYS/broker/publish/messages/dropped"


@dataclass(frozen=True)
class Settings:
    """What to run."""

    sensors: tuple[int, ...] = (1000,)  # fleet sizes: each case is run for each
    messages: int = 100_000  # single-reading messages
    batched_messages: int = 10_000  # 100-reading messages
    per_message: tuple[int, ...] = (1, 100)
    qos: tuple[int, ...] = (1, 0)
    consumers: tuple[str, ...] = CONSUMERS
    rounds: int = 5
    daemon_args: tuple[str, ...] = ()
    # Consumer processes: the daemon's --workers, and as many of a C client on one shared
    # group. With more than one, each has its own session and the backlog is spread over
    # them by the broker before they connect.
    workers: int = 1
    timeless: bool = False  # payloads without ts: timed at arrival
    unidentified: bool = False  # sessions subscribed without a Subscription Identifier
    baseline: str | None = None  # the source tree of the ``@base`` consumers


@dataclass
class Run:
    """One consumer draining one backlog."""

    consumer: str
    round: int
    per_message: int
    qos: int
    messages: int
    sensors: int = 0  # the fleet: message i comes from sensor i % sensors
    published: int = 0
    # PUBLISHes the broker sent the consumer, and PUBACKs that reached the broker (QoS 1):
    # the relay's counts, from the broker's side of the consumer's connections
    delivered: int = 0
    pubacks: int = 0
    received: int = 0  # the consumer's own count: lines a C client wrote; the daemon's
    broker_dropped: int | None = None  # messages the broker dropped during the run
    left_at_broker: int | None = None  # what the broker still held for the sessions after
    acked: int = 0  # the daemon's ingest_messages_acked_total (QoS 0: done with)
    written: int = 0  # readings the daemon counts as written
    rejected: int = 0
    sink_readings: int | None = None  # readings seen by fakemongo (inserts, $push elements)
    sink_ops: int | None = None
    sink_requests: int | None = None
    connected: float = 0.0  # the consumer's first connect at the relay (monotonic)
    first_message_seconds: float = 0.0  # connect -> the broker's first PUBLISH to it
    # from the last PUBACK reaching the broker's socket to the broker having processed it
    broker_read_lag: float = 0.0
    seconds: float = 0.0  # best estimate of connect -> last PUBACK at the broker (QoS 1)
    seconds_low: float = 0.0  # bounds (equal at QoS 1: both ends are the relay's)
    seconds_high: float = 0.0
    cpu_seconds: float = 0.0
    sink_cpu_seconds: float | None = None  # fakemongo's whole CPU, to show it is not the limit
    relay_cpu_seconds: float = 0.0  # the relay's whole CPU: the clock's own cost
    scrapes: int = 0  # metrics requests the daemon answered during the run
    load: float = 0.0  # the machine's 1-minute load average when the run started
    # mosquitto's CPU from the consumer's start to its end (the broker is single-threaded:
    # near ``seconds``, it is the limit)
    broker_cpu_seconds: float = 0.0
    broker_publish_cpu_seconds: float = 0.0  # mosquitto's CPU to take in the backlog
    complete: bool = False

    def figures(self) -> dict[str, Any]:
        """The run as JSON, with its rates."""
        out = asdict(self)
        out["messages_done"] = self.messages_done
        out["msg_per_s"] = self.messages_done / self.seconds if self.seconds else 0.0
        out["readings_per_s"] = out["msg_per_s"] * self.per_message
        out["clock_error"] = (
            (self.seconds_high - self.seconds_low) / 2 / self.seconds if self.seconds else 0.0
        )
        done_readings = self.messages_done * self.per_message
        out["cpu_us_per_reading"] = self.cpu_seconds / done_readings * 1e6 if done_readings else 0.0
        out["lost"] = self.lost
        out["broker_busy"] = self.broker_cpu_seconds / self.seconds if self.seconds else 0.0
        return out

    @property
    def messages_done(self) -> int:
        """Messages finished with, which the rate counts: at QoS 1 those whose PUBACK the
        broker has, never more; at QoS 0 those a C client wrote out of those the broker
        sent, or the daemon acknowledged (wrote)."""
        if self.qos == 1:
            return self.pubacks
        if self.consumer in CLIENTS:
            return min(self.received, self.delivered)
        return self.acked

    @property
    def lost(self) -> dict[str, int]:
        """Where messages or readings went missing (all zero for a clean run)."""
        dropped = self.broker_dropped or 0
        out = {
            "not_published": self.messages - self.published,
            "broker_dropped": dropped,
            "not_delivered": self.published - dropped - self.delivered,
            "not_received": self.delivered - self.received,
            "left_at_broker": self.left_at_broker or 0,
        }
        if self.qos == 1:
            out["not_acked"] = self.published - self.pubacks
        if self.consumer not in CLIENTS:
            out["not_written"] = self.received * self.per_message - self.written - self.rejected
        if self.sink_readings is not None:
            out["not_at_sink"] = self.written - self.sink_readings
        return out


def tools() -> dict[str, Path]:
    """The C helpers, built on first use (or when their source is newer)."""
    out = {}
    for name in ("fakemongo", "qos1pub", "mqttrelay", "idealsub"):
        binary, source = HERE / name, HERE / f"{name}.c"
        if not binary.exists() or binary.stat().st_mtime < source.stat().st_mtime:
            subprocess.run([str(HERE / "build.sh")], check=True)
        out[name] = binary
    return out


def backlog(
    path: Path, messages: int, per_message: int, sensors: int, timeless: bool = False
) -> None:
    """``topic<TAB>payload`` lines: message i from sensor i % sensors, readings 1 s apart
    (``timeless``: no ts, the readings take their arrival time)."""
    start = int(time.time()) - 7200
    with path.open("w") as out:
        for i in range(messages):
            sensor, tick = i % sensors, i // sensors
            readings = []
            for j in range(per_message):
                seq = tick * per_message + j
                ts = "" if timeless else f'"ts":{start + seq},'
                readings.append(
                    f'{{{ts}"seq":{seq},'
                    f'"temp":{18 + (seq * 7 + sensor) % 100 / 10:.1f},'
                    f'"hum":{40 + (seq + sensor) % 30}}}'
                )
            payload = readings[0] if per_message == 1 else f'{{"readings":[{",".join(readings)}]}}'
            out.write(f"sensors/s{sensor:05d}/readings\t{payload}\n")


def cpu_of(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_of_tree(pid: int) -> float:
    """cpu_of a process and its running children (the workers of ``--workers N``)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text(encoding="ascii").split()
    total = cpu_of(pid)
    for child in children:
        with contextlib.suppress(OSError):  # it has just exited
            total += cpu_of(int(child))
    return total


def client_ids(client_id: str, workers: int) -> list[str]:
    """The client ids of ``ingest run --workers N`` (ingest/pipeline/workers.py)."""
    return [client_id if k == 0 else f"{client_id}-w{k}" for k in range(workers)]


def topic_filter(client_id: str, workers: int, base: str = FILTER) -> str:
    """The filter ``base`` as the consumers subscribe it: shared with more than one worker."""
    return base if workers == 1 else f"$share/{client_id}/{base}"


def metrics_text(port: int) -> str:
    """The daemon's ``/metrics`` page."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        return str(resp.read().decode())


def scrape(port: int) -> dict[str, float]:
    """The daemon's counters that the bench reads (a small parser: no labels but mode)."""
    out: dict[str, float] = {}
    for line in metrics_text(port).splitlines():
        if line.startswith("ingest_") and "_total" in line:
            name, _, value = line.rpartition(" ")
            key = name.split("{", 1)[0]
            out[key] = out.get(key, 0.0) + float(value)
    return out


def session(
    broker: Broker,
    client_id: str,
    qos: int,
    workers: int = 1,
    base: str = FILTER,
    *,
    identified: bool = True,
) -> None:
    """Create the consumers' persistent sessions (on ``base``), so the backlog queues for them.

    ``identified``: with the Subscription Identifier the daemon gives the filter, as a
    session the daemon made in an earlier run has it (the broker puts it in every
    message it queues).
    """
    topic = topic_filter(client_id, workers, base)
    properties = ["-D", "subscribe", "subscription-identifier", str(identifier(topic))]
    for worker in client_ids(client_id, workers):
        subprocess.run(
            [
                "mosquitto_sub",
                "-p",
                str(broker.port),
                "-V",
                "5",
                "-i",
                worker,
                "-c",
                "-x",
                "3600",
                "-q",
                str(qos),
                "-t",
                topic,
                *(properties if identified else []),
                "-E",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )


def broker_dropped(broker: Broker) -> int | None:
    """The broker's count of messages it dropped (queue limits, offline QoS 0), or None.

    mosquitto publishes it retained under $SYS every ``sys_interval`` seconds.
    """
    proc = subprocess.run(
        ["mosquitto_sub", "-p", str(broker.port), "-t", DROPPED, "-C", "1", "-W", "5"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    value = proc.stdout.strip()
    return int(value) if proc.returncode == 0 and value.isdigit() else None


def publish(broker: Broker, qos1pub: Path, path: Path, messages: int) -> int:
    """Publish the backlog; every message must be PUBACKed by the broker."""
    proc = subprocess.run(
        [str(qos1pub), "127.0.0.1", str(broker.port), str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    result = json.loads(proc.stdout) if proc.stdout.strip() else {}
    if proc.returncode != 0 or result.get("acked") != messages:
        raise RuntimeError(f"the broker did not confirm the backlog: {result} {proc.stderr}")
    return int(result["acked"])


def sub_command(port: int, worker: str, run: Run, topic: str, single: bool) -> list[str]:
    """The baseline: ``mosquitto_sub`` (MQTT 5, the daemon's Receive Maximum) writing each
    message to a file. At QoS 0 a single one exits after the backlog (``-C``); at QoS 1 it
    is stopped once the broker has every PUBACK (with ``-C`` it could exit first)."""
    return [
        "mosquitto_sub",
        "-p",
        str(port),
        "-V",
        "5",
        "-i",
        worker,
        "-c",
        "-x",
        "3600",
        "-q",
        str(run.qos),
        "-t",
        topic,
        "-D",
        "connect",
        "receive-maximum",
        str(RECEIVE_MAXIMUM),
        *(["-C", str(run.published)] if run.qos == 0 and single else []),
    ]


def ideal_command(
    port: int, worker: str, run: Run, topic: str, single: bool, out: Path
) -> list[str]:
    """The reference: ``idealsub`` (bench/idealsub.c; the daemon's Receive Maximum)
    writing each read's messages to ``out``, then acknowledging them. A single one exits
    once the backlog is done (at QoS 1, its last PUBACK written); several are stopped."""
    return [
        str(HERE / "idealsub"),
        "--qos",
        str(run.qos),
        "--receive-maximum",
        str(RECEIVE_MAXIMUM),
        "--idle",
        "0",
        *(["--count", str(run.published)] if single else []),
        "127.0.0.1",
        str(port),
        worker,
        topic,
        str(out),
    ]


def measure_sub(
    run: Run, relay: Relay, client_id: str, workdir: Path, workers: int = 1, base: str = FILTER
) -> float | None:
    """Run a C client (``run.consumer``: mosquitto_sub or idealsub) through the relay
    until the broker has processed every PUBACK (QoS 1), it exits after the last message
    (QoS 0), or nothing moves for STALL; returns when it exited (QoS 0), as the bench saw
    it.

    ``base``: the topic filter of the sessions (``session``). With ``workers`` > 1, as
    many clients on the shared group, each on its session
    (at QoS 0 these have no count of their own: the end is when the broker sent the last
    message). ``received`` is the lines in their files, the client's own count; what the
    rate counts comes from the relay (``settle``).
    """
    outs = [workdir / f"sub-{k}.txt" for k in range(workers)]
    procs = []
    for worker, out in zip(client_ids(client_id, workers), outs, strict=True):
        topic, single = topic_filter(client_id, workers, base), workers == 1
        if run.consumer == "idealsub":  # it writes the file; its counts go to stdout
            argv = ideal_command(relay.port, worker, run, topic, single, out)
            stdout = out.with_suffix(".json")
        else:
            argv, stdout = sub_command(relay.port, worker, run, topic, single), out
        with stdout.open("wb") as sink:
            procs.append(subprocess.Popen(argv, stdout=sink))
    exits = [os.pidfd_open(proc.pid) for proc in procs]
    started = time.monotonic()
    ended: float | None = None
    exited: set[int] = set()
    try:
        while True:
            exited.update(relay.poll(FAST, also=[f for f in exits if f not in exited]))
            if run.qos == 1 and relay.processed is not None:
                break
            if run.qos == 0 and (exited or (workers > 1 and relay.publishes >= run.published)):
                ended = time.monotonic()
                break
            if len(exited) == len(exits):
                break  # all gone: nothing more will come
            patience = STALL if relay.connects else START_TIMEOUT
            if time.monotonic() - max(started, relay.moved) > patience:
                break
    finally:
        run.cpu_seconds = sum(
            _finish(proc, pidfd in exited) for proc, pidfd in zip(procs, exits, strict=True)
        )
        for pidfd in exits:
            os.close(pidfd)
    run.received = sum(out.read_bytes().count(b"\n") for out in outs)
    return ended


def _finish(proc: subprocess.Popen[bytes], exited: bool) -> float:
    """End a C client (SIGTERM: a clean disconnect, its file complete); its CPU."""
    if exited:
        _, _, usage = os.wait4(proc.pid, 0)
        proc.returncode = 0  # reaped above
        return usage.ru_utime + usage.ru_stime
    cpu = cpu_of(proc.pid)  # what it spent on the run; it idles from here
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return cpu


def settle(
    run: Run, relay: Relay, client_id: str, workers: int, ended: float | None = None
) -> None:
    """The counts and the clock from the relay's final report: from the consumer's first
    connect to the moment the broker had processed the last PUBACK (QoS 1), or to
    ``ended`` (QoS 0, a C client); the daemon at QoS 0 is timed by ``timed``."""
    mine = relay.mine(client_ids(client_id, workers))
    run.delivered = sum(c["publishes"] for c in mine)
    run.pubacks = sum(c["pubacks"] for c in mine)
    run.relay_cpu_seconds = relay.cpu_seconds
    run.connected = min((c["connect_ns"] / 1e9 for c in mine), default=0.0)
    first = min((c["first_publish_ns"] / 1e9 for c in mine if c["first_publish_ns"]), default=0.0)
    run.first_message_seconds = first - run.connected if first and run.connected else 0.0
    if run.qos == 1:
        processed = relay.final["processed_ns"] / 1e9
        last = max((c["last_puback_ns"] / 1e9 for c in mine), default=0.0)
        end = processed if processed and run.pubacks >= run.published else last
        if processed:
            run.broker_read_lag = processed - relay.final["reached_ns"] / 1e9
        if end and run.connected:
            run.seconds = run.seconds_low = run.seconds_high = end - run.connected
    elif run.consumer in CLIENTS and run.connected:
        # After the broker sent the last message, by the exit the bench saw.
        last = max((c["last_publish_ns"] / 1e9 for c in mine), default=0.0)
        high = ended if ended is not None else last
        run.seconds_low = max(0.0, last - run.connected)
        run.seconds_high = max(run.seconds_low, high - run.connected)
        run.seconds = (run.seconds_low + run.seconds_high) / 2


@dataclass
class Sample:
    """One scrape, bracketed by when it was sent and when its answer arrived."""

    sent: float
    answered: float
    done: int
    received: int
    cpu: float
    refused: bool = False  # no answer: the metrics server was not up, so nothing received


@dataclass
class Watch:
    """The scrape loop of one daemon run."""

    samples: list[Sample] = field(default_factory=list)
    # The daemon's CPU when the bench saw the relay report its connect (the clock's start)
    cpu_at_connect: float | None = None

    def first_nonzero(self) -> int:
        """Index of the first sample that shows a message received."""
        return next(i for i, s in enumerate(self.samples) if s.received or s.done)

    def answered(self) -> int:
        """Scrapes the daemon answered."""
        return sum(not s.refused for s in self.samples)


def watch_daemon(
    daemon: Daemon, relay: Relay, target: int, qos: int, ids: list[str]
) -> tuple[Watch, dict[str, float]]:
    """Scrape until ``target`` messages are done (QoS 1: PUBACKs at the broker, from the
    relay; QoS 0: acked, from the daemon), or nothing moves for STALL."""
    assert daemon.process is not None
    moved = time.monotonic()
    # Nothing can have been received before the daemon was started.
    watch, counters = Watch([Sample(moved, moved, 0, 0, 0.0, refused=True)]), {}
    while True:
        relay.poll(0)
        if watch.cpu_at_connect is None and relay.connected(ids) is not None:
            watch.cpu_at_connect = cpu_of_tree(daemon.process.pid)
        sent = time.monotonic()
        try:
            counters = scrape(daemon.metrics_port)
        except OSError:
            if daemon.process.poll() is not None:
                raise RuntimeError(f"the daemon exited:\n{daemon.logs()[-2000:]}") from None
            if watch.samples[-1].refused:
                # The daemon serves metrics before it subscribes: a refused scrape proves
                # that no message had arrived yet.
                watch.samples[-1:] = [Sample(sent, sent, 0, 0, 0.0, refused=True)]
            time.sleep(FAST)
            continue
        answered = time.monotonic()
        cpu = cpu_of_tree(daemon.process.pid)
        done = int(counters.get("ingest_messages_acked_total", 0))
        received = int(counters.get("ingest_messages_received_total", 0))
        if (done, received) != (watch.samples[-1].done, watch.samples[-1].received):
            moved = answered
        moved = max(moved, relay.moved)
        watch.samples.append(Sample(sent, answered, done, received, cpu))
        patience = STALL if received or done else START_TIMEOUT
        finished = (relay.processed is not None) if qos == 1 else done >= target
        if finished or answered - moved > patience:
            return watch, counters
        time.sleep(next_interval(watch, target))


def next_interval(watch: Watch, target: int) -> float:
    """Fast until the first message and when the end is near; slow in between."""
    last = watch.samples[-1]
    if not (last.received or last.done):
        return FAST
    start = watch.samples[watch.first_nonzero()]
    if last.done <= start.done or last.answered <= start.answered:
        return FAST
    rate = (last.done - start.done) / (last.answered - start.answered)
    remaining = (target - last.done) / rate
    return FAST if remaining < 2.5 * SLOW else min(SLOW, remaining / 3)


def timed(run: Run, watch: Watch, writes: tuple[float, float] | None = None) -> None:
    """The daemon's CPU over the clock's window and, at QoS 0, the clock's end.

    The clock starts at the consumer's connect (``run.connected``, from the relay). At
    QoS 1 it ends at the broker's last PUBACK (``settle``); at QoS 0 nothing on the wire
    dates the end, so it is bracketed by the scrapes around the daemon's last
    acknowledgement (after the scrape sent before the one that showed the final count, by
    that one's answer) and, with ``writes`` (fakemongo's first and last write, monotonic),
    after the last write.
    """
    samples = watch.samples
    # The first scrape that showed the final count: a run that stalled (messages lost on
    # the way) ended there, not after the wait for more that never came.
    j = next(i for i, sample in enumerate(samples) if sample.done == samples[-1].done)
    end = samples[j]
    before_end = samples[j - 1] if j else samples[j]
    if run.qos == 0 and run.connected:
        end_low, end_high = before_end.sent, end.answered
        if writes is not None:
            end_low = min(end_high, max(end_low, writes[1]))
        run.seconds_low = max(0.0, end_low - run.connected)
        run.seconds_high = max(run.seconds_low, end_high - run.connected)
        run.seconds = (run.seconds_low + run.seconds_high) / 2
    k = watch.first_nonzero() if any(s.received or s.done for s in samples) else len(samples)
    before = samples[k - 1] if k else None
    start_cpu = watch.cpu_at_connect
    if start_cpu is None:
        start_cpu = before.cpu if before and not before.refused else samples[min(k, j)].cpu
    run.cpu_seconds = end.cpu - start_cpu


def mode_of(consumer: str) -> str:
    """The daemon's consumer name without ``@base``: ``dry-run``, ``bucket`` or ``timeseries``."""
    return consumer.removesuffix(BASE)


def measure_daemon(
    run: Run,
    relay: Relay,
    client_id: str,
    sink_uri: str | None,
    workdir: Path,
    extra: tuple[str, ...],
    workers: int = 1,
    source: Path | None = None,
) -> Watch:
    """``ingest run`` (from ``source``, else this tree) through the relay, until it is
    done; its counters from its metrics."""
    args = [
        "--mqtt-url",
        relay.url,
        "--topic",
        FILTER,
        "--client-id",
        client_id,
        "--qos",
        str(run.qos),
        "--log-level",
        "warning",
        "--db",
        "bench",
        "--workers",
        str(workers),
        *extra,
    ]
    if sink_uri is None:
        args += ["--dry-run", "--mongodb-uri", "mongodb://127.0.0.1:1"]
    else:
        args += ["--mode", mode_of(run.consumer), "--mongodb-uri", sink_uri]
    daemon = Daemon(args, workdir / f"daemon-{run.consumer}.log", cwd=source).start(
        wait_ready=False
    )
    try:
        watch, counters = watch_daemon(
            daemon, relay, run.published, run.qos, client_ids(client_id, workers)
        )
    finally:
        daemon.stop()
    run.scrapes = watch.answered()
    run.received = int(counters.get("ingest_messages_received_total", 0))
    run.acked = int(counters.get("ingest_messages_acked_total", 0))
    run.written = int(counters.get("ingest_readings_written_total", 0))
    run.rejected = int(counters.get("ingest_readings_rejected_total", 0))
    return watch


def left_at_broker(broker: Broker, client_id: str, qos: int, workers: int) -> int:
    """Messages the broker still holds for the consumer's sessions once it has gone: what
    it sends a client that resumes them (a message whose PUBACK never reached it comes
    again), within a second."""
    total = 0
    for worker in client_ids(client_id, workers):
        proc = subprocess.run(
            [
                "mosquitto_sub",
                "-p",
                str(broker.port),
                "-V",
                "5",
                "-i",
                worker,
                "-c",
                "-x",
                "3600",
                "-q",
                str(qos),
                "-t",
                topic_filter(client_id, workers),
                "-W",
                "1",
            ],
            capture_output=True,
            timeout=30,
            check=False,
        )
        total += proc.stdout.count(b"\n")
    return total


def sink_counts(run: Run, stats: dict[str, Any]) -> None:
    """What fakemongo saw: readings, operations and requests of the writes."""
    if mode_of(run.consumer) == "timeseries":
        run.sink_readings = int(stats["insertedDocuments"])
        run.sink_ops = run.sink_readings
        run.sink_requests = int(stats["insertCommands"])
    else:
        run.sink_readings = int(stats["pushedElements"])
        run.sink_ops = int(stats["updateOps"])
        run.sink_requests = int(stats["updateCommands"])


def run_one(
    settings: Settings,
    consumer: str,
    round_no: int,
    per_message: int,
    qos: int,
    messages: int,
    lines: Path,
    workdir: Path,
    helpers: dict[str, Path],
    sensors: int = 0,
) -> Run:
    """One consumer on a fresh broker holding the backlog (of ``sensors``), through a
    fresh relay."""
    run = Run(consumer, round_no, per_message, qos, messages, sensors, load=os.getloadavg()[0])
    rundir = Path(tempfile.mkdtemp(dir=workdir))
    broker = Broker(rundir, extra=f"queue_qos0_messages true\nsys_interval {SYS_INTERVAL}\n")
    broker.start()
    relay = None
    try:
        client_id = f"bench-{consumer.replace('@', '-')}"
        session(broker, client_id, qos, settings.workers, identified=not settings.unidentified)
        assert broker.process is not None
        broker_cpu = cpu_of(broker.process.pid)
        dropped_before = broker_dropped(broker)
        run.published = publish(broker, helpers["qos1pub"], lines, messages)
        run.broker_publish_cpu_seconds = cpu_of(broker.process.pid) - broker_cpu
        broker_cpu += run.broker_publish_cpu_seconds
        relay = Relay.start(helpers["mqttrelay"], broker.port, run.published)
        if consumer in CLIENTS:
            ended = measure_sub(run, relay, client_id, rundir, settings.workers)
            run.broker_cpu_seconds = cpu_of(broker.process.pid) - broker_cpu
            relay.wait_closed(CLOSE_TIMEOUT)
            relay.stop()
            settle(run, relay, client_id, settings.workers, ended)
        else:
            pid, before = broker.process.pid, broker_cpu
            run_daemon(
                run,
                settings,
                relay,
                client_id,
                rundir,
                helpers["fakemongo"],
                lambda: cpu_of(pid) - before,
            )
        run.left_at_broker = left_at_broker(broker, client_id, qos, settings.workers)
        count_broker_drops(run, broker, dropped_before)
        run.complete = run.messages_done >= run.published and run.left_at_broker == 0
        return run
    finally:
        if relay is not None:
            relay.kill()
        broker.stop()
        shutil.rmtree(rundir, ignore_errors=True)


def run_daemon(
    run: Run,
    settings: Settings,
    relay: Relay,
    client_id: str,
    rundir: Path,
    fakemongo: Path,
    broker_cpu: Callable[[], float],
) -> None:
    """The daemon drains the backlog through the relay (and writes to fakemongo)."""
    sink = None
    try:
        sink_uri = None
        if mode_of(run.consumer) != "dry-run":
            sink = subprocess.Popen([str(fakemongo)], stdout=subprocess.PIPE, text=True)
            assert sink.stdout is not None
            sink_uri = sink.stdout.readline().strip()
        source = (
            Path(settings.baseline) if run.consumer.endswith(BASE) and settings.baseline else None
        )
        watch = measure_daemon(
            run, relay, client_id, sink_uri, rundir, settings.daemon_args, settings.workers, source
        )
        run.broker_cpu_seconds = broker_cpu()
        relay.wait_closed(CLOSE_TIMEOUT)
        relay.stop()
        settle(run, relay, client_id, settings.workers)
        writes = None
        if sink is not None:
            stats = sink_stats(run, sink)
            sink = None
            first, last = stats["firstWriteMonotonicNs"], stats["lastWriteMonotonicNs"]
            writes = (first / 1e9, last / 1e9) if first else None
        timed(run, watch, writes)
    finally:
        if sink is not None:
            sink.kill()
            sink.communicate()


def sink_stats(run: Run, sink: subprocess.Popen[str]) -> dict[str, Any]:
    """Stop fakemongo; its counts (also into ``run``) and its CPU."""
    sink.terminate()
    assert sink.stdout is not None
    out = sink.stdout.read()
    _, _, usage = os.wait4(sink.pid, 0)
    sink.returncode = 0
    sink.stdout.close()
    run.sink_cpu_seconds = usage.ru_utime + usage.ru_stime
    stats: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    sink_counts(run, stats)
    return stats


def count_broker_drops(run: Run, broker: Broker, before: int | None) -> None:
    """What the broker dropped during the run (after its next $SYS update)."""
    time.sleep(SYS_INTERVAL + 0.2)
    after = broker_dropped(broker)
    run.broker_dropped = None if before is None or after is None else after - before


def run_all(settings: Settings, progress: bool = False) -> dict[str, Any]:
    """Every case, round, fleet size and consumer; the runs and their summary."""
    helpers = tools()
    runs: list[Run] = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for per_message in settings.per_message:
            messages = settings.messages if per_message == 1 else settings.batched_messages
            lines = {}
            for sensors in settings.sensors:
                lines[sensors] = workdir / f"backlog-{per_message}-{sensors}.txt"
                backlog(lines[sensors], messages, per_message, sensors, settings.timeless)
            for qos in settings.qos:
                for round_no in range(1, settings.rounds + 1):
                    step = 1 if round_no % 2 else -1
                    for sensors in settings.sensors[::step]:
                        for consumer in settings.consumers[::step]:
                            run = run_one(
                                settings,
                                consumer,
                                round_no,
                                per_message,
                                qos,
                                messages,
                                lines[sensors],
                                workdir,
                                helpers,
                                sensors,
                            )
                            runs.append(run)
                            if progress:
                                print(progress_line(run), file=sys.stderr)
    return {
        "settings": asdict(settings),
        "load_average": os.getloadavg(),
        "cpus": os.cpu_count(),
        "python": interpreter(),
        "accelerators": accelerators(),
        "runs": [r.figures() for r in runs],
        "summary": summarize(runs, settings),
    }


def progress_line(run: Run) -> str:
    """One run, as the benchmark goes."""
    f = run.figures()
    return (
        f"{run.sensors:>7,} sensors {run.per_message:>3} readings/msg QoS {run.qos} "
        f"round {run.round} {run.consumer:<16} {f['msg_per_s']:>9,.0f} msg/s "
        f"±{f['clock_error']:.1%} {f['cpu_us_per_reading']:6.1f} µs/reading lost {f['lost']}"
    )


def accelerators() -> str:
    """Which twins the daemons run: they import the same tree with the same environment
    (INGEST_NO_EXTENSIONS included), so this process's choice is theirs."""
    from ingest.cli import accelerators as described  # noqa: PLC0415

    return described()


def interpreter() -> str:
    """The daemon's Python (this one: the daemon runs as ``sys.executable -m ingest``).

    The daemon's CPU per reading depends on how CPython was built: profile-guided and
    link-time optimisation (``--enable-optimizations --with-lto``, as in the official
    image and distributions' builds) run its Python code markedly faster than a build
    without them (pyenv's default), which the configure flags say.
    """
    flags = str(sysconfig.get_config_var("CONFIG_ARGS") or "")
    built = [flag for flag in ("--enable-optimizations", "--with-lto") if flag in flags]
    return (
        f"{sys.implementation.name} {sys.version.split()[0]}, configured "
        f"{' '.join(built) if built else 'without --enable-optimizations or --with-lto'}"
    )


def spread(values: list[float]) -> dict[str, float]:
    """min / median / max."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def reference(consumers: tuple[str, ...]) -> str | None:
    """The consumer the others' rates are divided by: idealsub, else mosquitto_sub if run."""
    return next((c for c in (REFERENCE, "mosquitto_sub") if c in consumers), None)


def summarize(runs: list[Run], settings: Settings) -> list[dict[str, Any]]:
    """Per case, fleet size and consumer: rates, ratios to the reference within each
    round, CPU, losses."""
    out = []
    ref = reference(settings.consumers)
    for per_message in settings.per_message:
        for qos in settings.qos:
            for sensors in settings.sensors:
                case = [
                    r
                    for r in runs
                    if (r.per_message, r.qos, r.sensors) == (per_message, qos, sensors)
                ]
                base = {r.round: r.figures()["msg_per_s"] for r in case if r.consumer == ref}
                for consumer in settings.consumers:
                    mine = [r for r in case if r.consumer == consumer]
                    row = summary_row(mine, base)
                    out.append(
                        {
                            "sensors": sensors,
                            "per_message": per_message,
                            "qos": qos,
                            "consumer": consumer,
                            "reference": ref,
                        }
                        | row
                    )
    return out


def summary_row(mine: list[Run], base: dict[int, float]) -> dict[str, Any]:
    """The figures of one consumer's runs of one case; ``base``: the reference's rate by
    round."""
    figures = [r.figures() for r in mine]
    ratios = [
        f["msg_per_s"] / base[r.round]
        for r, f in zip(mine, figures, strict=True)
        if base.get(r.round)
    ]
    totals: dict[str, int] = {}
    for f in figures:
        for key, value in f["lost"].items():
            totals[key] = totals.get(key, 0) + value
    consumer = mine[0].consumer if mine else ""
    return {
        "rounds": len(mine),
        "messages": mine[0].messages if mine else 0,
        "msg_per_s": spread([f["msg_per_s"] for f in figures]),
        "readings_per_s": spread([f["readings_per_s"] for f in figures]),
        "ratio": spread(ratios) if ratios else None,
        "cpu_us_per_reading": statistics.median(f["cpu_us_per_reading"] for f in figures),
        "clock_error_max": max(f["clock_error"] for f in figures),
        "broker_busy": statistics.median(f["broker_busy"] for f in figures),
        "relay_cpu_us_per_message": statistics.median(
            r.relay_cpu_seconds / r.published * 1e6 if r.published else 0.0 for r in mine
        ),
        "published": sum(r.published for r in mine),
        "delivered": sum(r.delivered for r in mine),
        "received": sum(r.received for r in mine),
        "pubacks": None if mine[0].qos == 0 else sum(r.pubacks for r in mine),
        "left_at_broker": sum(r.left_at_broker or 0 for r in mine),
        "broker_dropped": (
            None
            if any(r.broker_dropped is None for r in mine)
            else sum(r.broker_dropped or 0 for r in mine)
        ),
        "written": None if consumer in CLIENTS else sum(r.written for r in mine),
        "at_sink": (
            None
            if consumer in CLIENTS or mode_of(consumer) == "dry-run"
            else sum(r.sink_readings or 0 for r in mine)
        ),
        "lost": totals,
        "complete": all(r.complete for r in mine),
    }


def markdown(report: dict[str, Any]) -> str:
    """The summary as two Markdown tables, rates then accounting, and a note on the
    conditions."""

    def trio(s: dict[str, float] | None, fmt: str) -> str:
        return "-" if s is None else " / ".join(format(s[k], fmt) for k in ("min", "median", "max"))

    def count(value: int | None) -> str:
        return "-" if value is None else f"{value:,}"

    def case(s: dict[str, Any]) -> str:
        return f"| {s['sensors']:,} | {s['per_message']} | {s['qos']} | {s['consumer']} "

    summary = report["summary"]
    ref = next((s["reference"] for s in summary if s.get("reference")), None)
    rows = [
        (
            "| sensors | readings/msg | QoS | consumer | msg/s (min / median / max) "
            f"| readings/s (median) | ratio to {ref or '-'} (min / median / max) "
            "| CPU µs/reading | broker CPU / run time (median) |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rows.extend(
        f"{case(s)}| {trio(s['msg_per_s'], ',.0f')} | {s['readings_per_s']['median']:,.0f} "
        f"| {trio(s['ratio'], '.2f')} | {s['cpu_us_per_reading']:.1f} "
        f"| {s['broker_busy']:.2f} |"
        for s in summary
    )
    rows += [
        "",
        (
            "| sensors | readings/msg | QoS | consumer | published | dropped by the broker "
            "| delivered | received | PUBACKs at the broker | left at the broker | written "
            "| at sink | clock error | complete |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows.extend(
        f"{case(s)}| {count(s['published'])} | {count(s['broker_dropped'])} "
        f"| {count(s['delivered'])} | {count(s['received'])} | {count(s['pubacks'])} "
        f"| {count(s['left_at_broker'])} | {count(s['written'])} | {count(s['at_sink'])} "
        f"| ±{s['clock_error_max']:.1%} | {'yes' if s['complete'] else '**no**'} |"
        for s in summary
    )
    loads = [r["load"] for r in report["runs"]]
    relay = [s["relay_cpu_us_per_message"] for s in summary]
    rows.append("")
    rows.append(
        f"Sums over {report['settings']['rounds']} rounds; 1-minute load average at the "
        f"start of the runs: {min(loads):.2f} to {max(loads):.2f} on {report['cpus']} "
        f"CPUs; {report['settings'].get('workers', 1)} worker(s); "
        f"{report.get('python', 'Python')}; "
        f"{report.get('accelerators', 'accelerators: not reported')}; the relay that "
        "takes the clock spent "
        f"{min(relay):.1f} to {max(relay):.1f} µs of CPU a message."
    )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--sensors", default="1000", help="fleet sizes, e.g. 1000,100000: each case runs for each"
    )
    parser.add_argument(
        "--messages", type=int, default=100_000, help="single-reading messages a run"
    )
    parser.add_argument(
        "--batched-messages", type=int, default=10_000, help="100-reading messages a run"
    )
    parser.add_argument("--per-message", default="1,100", help="cases: readings a message")
    parser.add_argument("--qos", default="1,0", help="cases: subscription QoS")
    parser.add_argument("--consumers", default=",".join(CONSUMERS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the whole report here")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="the daemon's --workers, and as many of a C client on a shared group",
    )
    parser.add_argument(
        "--daemon-arg",
        action="append",
        default=[],
        help="extra argument for ingest run (repeatable)",
    )
    parser.add_argument(
        "--timeless", action="store_true", help="payloads without ts (readings timed at arrival)"
    )
    parser.add_argument(
        "--unidentified",
        action="store_true",
        help="sessions subscribed without a Subscription Identifier",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="source tree of another version: adds <consumer>@base for "
        "each daemon consumer, run from there in the same rounds",
    )
    args = parser.parse_args()
    if not shutil.which("mosquitto_sub") or not shutil.which("gcc"):
        print("needs mosquitto, mosquitto-clients and gcc", file=sys.stderr)
        return 2
    consumers = tuple(args.consumers.split(","))
    unknown = set(consumers) - set(CONSUMERS)
    if args.baseline is not None:
        consumers = tuple(
            name
            for consumer in consumers
            for name in ((consumer,) if consumer in CLIENTS else (consumer, consumer + BASE))
        )
    if unknown:
        print(f"--consumers: unknown {sorted(unknown)}; choose from {CONSUMERS}", file=sys.stderr)
        return 2
    if args.baseline is not None and not (args.baseline / "ingest").is_dir():
        print(f"--baseline: {args.baseline} is not a source tree of ingest", file=sys.stderr)
        return 2
    try:
        fleets = tuple(int(x) for x in args.sensors.split(","))
    except ValueError:
        fleets = ()
    if not fleets or min(fleets) < 1:
        print(f"--sensors: {args.sensors!r} is not a list of fleet sizes", file=sys.stderr)
        return 2
    settings = Settings(
        sensors=fleets,
        messages=args.messages,
        batched_messages=args.batched_messages,
        per_message=tuple(int(x) for x in args.per_message.split(",")),
        qos=tuple(int(x) for x in args.qos.split(",")),
        consumers=consumers,
        rounds=args.rounds,
        daemon_args=tuple(args.daemon_arg),
        workers=args.workers,
        timeless=args.timeless,
        unidentified=args.unidentified,
        baseline=None if args.baseline is None else str(args.baseline.resolve()),
    )
    # SIGTERM unwinds like an exception, so every broker, daemon and sink is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    report = run_all(settings, progress=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(report))
    return 0 if all(s["complete"] for s in report["summary"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())

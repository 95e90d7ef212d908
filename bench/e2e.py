"""End-to-end benchmark: the daemon against mosquitto_sub on the same confirmed backlog.

For every case (readings per message x QoS) and round, each consumer in turn (the order
alternates between rounds) gets a fresh mosquitto holding the same backlog: a persistent
session is created for the consumer's client id, then ``qos1pub`` (C) publishes every
message at QoS 1 and must count a PUBACK for each, so the backlog is known to be in the
broker before the consumer connects. The consumers:

- ``mosquitto_sub``: the C client, MQTT 5, same Receive Maximum as the daemon;
- ``dry-run``: ``ingest run --dry-run`` (decode, batch, build the writes, ack);
- ``bucket`` / ``timeseries``: ``ingest run`` writing to ``fakemongo``, a C server that
  answers the MongoDB wire protocol at once and counts what it receives.

The clock runs from the consumer's first message to its last acknowledgement (the
daemon) or receipt (mosquitto_sub), as the bench process sees them: mosquitto_sub's
output is read as it comes; the daemon's metrics are scraped (fast before the first
message and near the end, slowly in between), and each scrape is bracketed by the time
the request left and the answer came back, which bounds the true instants; the kernel's
figures for the daemon's MQTT socket (``ss``) and fakemongo's first and last write
narrow those bounds without the daemon's event loop. CPU is the
consumer's own utime + stime from /proc/<pid>/stat over the same window. Losses are
counted on every side: published (PUBACKed), dropped by the broker (its
``$SYS/broker/publish/messages/dropped``, read before and after the run), received,
written, seen at the sink.

    .venv/bin/python -m bench.e2e [--sensors 1000] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import select
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
from typing import Any

from ingest.config import Settings as DaemonSettings
from tests.support.procs import Broker, Daemon

HERE = Path(__file__).resolve().parent
FILTER = "sensors/#"
CONSUMERS = ("mosquitto_sub", "dry-run", "bucket", "timeseries")
RECEIVE_MAXIMUM = DaemonSettings().max_inflight_messages  # the daemon's default, given to both
FAST, SLOW = 0.02, 0.25  # scrape intervals (s): near the start and end, in between
STALL = 20.0  # no progress for this long: the run ends and the rest counts as lost
START_TIMEOUT = 120.0  # the daemon's start-up, before its first message, on a busy machine
CLK_TCK = os.sysconf("SC_CLK_TCK")
JIFFY = 0.010  # the kernel's socket timestamps tick at HZ >= 100
ARRIVED = 64  # bytes: more than CONNACK and SUBACK, so at least one PUBLISH has arrived
SYS_INTERVAL = 1  # seconds between the broker's $SYS updates (mosquitto's sys_interval)
DROPPED = "$SYS/broker/publish/messages/dropped"


@dataclass(frozen=True)
class Settings:
    """What to run."""

    sensors: int = 1000
    messages: int = 100_000  # single-reading messages
    batched_messages: int = 10_000  # 100-reading messages
    per_message: tuple[int, ...] = (1, 100)
    qos: tuple[int, ...] = (1, 0)
    consumers: tuple[str, ...] = CONSUMERS
    rounds: int = 5
    daemon_args: tuple[str, ...] = ()
    # Consumer processes: the daemon's --workers, and as many mosquitto_sub on one shared
    # group. With more than one, each has its own session and the backlog is spread over
    # them by the broker before they connect.
    workers: int = 1


@dataclass
class Run:
    """One consumer draining one backlog."""

    consumer: str
    round: int
    per_message: int
    qos: int
    messages: int
    published: int = 0
    received: int = 0  # messages the consumer took
    broker_dropped: int | None = None  # messages the broker dropped during the run
    acked: int = 0  # the daemon's ingest_messages_acked_total (QoS 0: done with)
    written: int = 0  # readings the daemon counts as written
    rejected: int = 0
    sink_readings: int | None = None  # readings seen by fakemongo (inserts, $push elements)
    sink_ops: int | None = None
    sink_requests: int | None = None
    seconds: float = 0.0  # best estimate of first message -> last ack/receipt
    seconds_low: float = 0.0  # bounds from the scrape brackets (equal for mosquitto_sub)
    seconds_high: float = 0.0
    cpu_seconds: float = 0.0
    sink_cpu_seconds: float | None = None  # fakemongo's whole CPU, to show it is not the limit
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
        out["msg_per_s"] = self.messages_done / self.seconds if self.seconds else 0.0
        out["readings_per_s"] = out["msg_per_s"] * self.per_message
        out["clock_error"] = ((self.seconds_high - self.seconds_low) / 2 / self.seconds
                              if self.seconds else 0.0)
        done_readings = self.messages_done * self.per_message
        out["cpu_us_per_reading"] = (self.cpu_seconds / done_readings * 1e6
                                     if done_readings else 0.0)
        out["lost"] = self.lost
        out["broker_busy"] = self.broker_cpu_seconds / self.seconds if self.seconds else 0.0
        return out

    @property
    def messages_done(self) -> int:
        """Messages taken and finished with (the rate counts these)."""
        return self.received if self.consumer == "mosquitto_sub" else self.acked

    @property
    def lost(self) -> dict[str, int]:
        """Where messages or readings went missing (all zero for a clean run)."""
        out = {"not_published": self.messages - self.published,
               "not_received": self.published - self.received - (self.broker_dropped or 0),
               "broker_dropped": self.broker_dropped or 0}
        if self.consumer != "mosquitto_sub":
            out["not_written"] = self.received * self.per_message - self.written - self.rejected
        if self.sink_readings is not None:
            out["not_at_sink"] = self.written - self.sink_readings
        return out


def tools() -> dict[str, Path]:
    """The C helpers, built on first use (or when their source is newer)."""
    out = {}
    for name in ("fakemongo", "qos1pub"):
        binary, source = HERE / name, HERE / f"{name}.c"
        if not binary.exists() or binary.stat().st_mtime < source.stat().st_mtime:
            subprocess.run([str(HERE / "build.sh")], check=True)
        out[name] = binary
    return out


def backlog(path: Path, messages: int, per_message: int, sensors: int) -> None:
    """``topic<TAB>payload`` lines: message i from sensor i % sensors, readings 1 s apart."""
    start = int(time.time()) - 7200
    with path.open("w") as out:
        for i in range(messages):
            sensor, tick = i % sensors, i // sensors
            readings = []
            for j in range(per_message):
                seq = tick * per_message + j
                readings.append(f'{{"ts":{start + seq},"seq":{seq},'
                                f'"temp":{18 + (seq * 7 + sensor) % 100 / 10:.1f},'
                                f'"hum":{40 + (seq + sensor) % 30}}}')
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
    """The client ids of ``ingest run --workers N`` (ingest/workers.py)."""
    return [client_id if k == 0 else f"{client_id}-w{k}" for k in range(workers)]


def topic_filter(client_id: str, workers: int) -> str:
    """The filter as the consumers subscribe it: shared with more than one worker."""
    return FILTER if workers == 1 else f"$share/{client_id}/{FILTER}"


def scrape(port: int) -> dict[str, float]:
    """The daemon's counters that the bench reads (a small parser: no labels but mode)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("ingest_") and "_total" in line:
            name, _, value = line.rpartition(" ")
            key = name.split("{", 1)[0]
            out[key] = out.get(key, 0.0) + float(value)
    return out


def session(broker: Broker, client_id: str, qos: int, workers: int = 1) -> None:
    """Create the consumers' persistent sessions, so the backlog queues for them."""
    for worker in client_ids(client_id, workers):
        subprocess.run(["mosquitto_sub", "-p", str(broker.port), "-V", "5", "-i", worker,
                        "-c", "-x", "3600", "-q", str(qos), "-t",
                        topic_filter(client_id, workers), "-E"], check=True,
                       capture_output=True, timeout=30)


def broker_dropped(broker: Broker) -> int | None:
    """The broker's count of messages it dropped (queue limits, offline QoS 0), or None.

    mosquitto publishes it retained under $SYS every ``sys_interval`` seconds.
    """
    proc = subprocess.run(["mosquitto_sub", "-p", str(broker.port), "-t", DROPPED, "-C", "1",
                           "-W", "5"], capture_output=True, text=True, timeout=30, check=False)
    value = proc.stdout.strip()
    return int(value) if proc.returncode == 0 and value.isdigit() else None


def publish(broker: Broker, qos1pub: Path, path: Path, messages: int) -> int:
    """Publish the backlog; every message must be PUBACKed by the broker."""
    proc = subprocess.run([str(qos1pub), "127.0.0.1", str(broker.port), str(path)],
                          capture_output=True, text=True, timeout=600, check=False)
    result = json.loads(proc.stdout) if proc.stdout.strip() else {}
    if proc.returncode != 0 or result.get("acked") != messages:
        raise RuntimeError(f"the broker did not confirm the backlog: {result} {proc.stderr}")
    return int(result["acked"])


def _read_stamps(procs: list[subprocess.Popen[bytes]],
                 expected: int) -> tuple[int, dict[int, bytes], dict[int, bytes], float]:
    """Read mosquitto_sub's lines until ``expected`` or a stall: their count, the first and
    last chunk of each process, and the processes' CPU at the first message."""
    fds = []
    for proc in procs:
        assert proc.stdout is not None
        fds.append(proc.stdout.fileno())
    heads: dict[int, bytes] = {}
    tails: dict[int, bytes] = {}
    cpu_first = 0.0
    lines = 0
    while lines < expected:
        ready, _, _ = select.select(fds, [], [], STALL)
        if not ready:
            break
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                fds.remove(fd)  # this one has exited
                continue
            if not heads:
                cpu_first = sum(cpu_of(p.pid) for p in procs)
            heads.setdefault(fd, chunk)
            lines += chunk.count(b"\n")
            tails[fd] = (tails.get(fd, b"") + chunk)[-256:]
        if not fds:
            break
    return lines, heads, tails, cpu_first


def measure_sub(run: Run, broker: Broker, client_id: str, workers: int = 1) -> None:
    """mosquitto_sub: its own receipt times (``-F %U``) of the first and last message.

    With ``workers`` > 1, as many mosquitto_sub on the shared group, each on its session:
    from the first message any of them received to the last.
    """
    procs = [subprocess.Popen(
        ["mosquitto_sub", "-p", str(broker.port), "-V", "5", "-i", worker, "-c",
         "-x", "3600", "-q", str(run.qos), "-t", topic_filter(client_id, workers),
         "-F", "%U", "-D", "connect", "receive-maximum", str(RECEIVE_MAXIMUM),
         *(["-C", str(run.published)] if workers == 1 else [])],
        stdout=subprocess.PIPE) for worker in client_ids(client_id, workers)]
    lines = 0
    try:
        lines, heads, tails, cpu_first = _read_stamps(procs, run.published)
    finally:
        if workers > 1 or lines < run.published:  # a member of a group has no count of its
            for proc in procs:                      # own; one stalled was interrupted
                os.kill(proc.pid, signal.SIGKILL)  # not Popen.kill: it reaps (wait4 below)
    cpu = 0.0
    for proc in procs:
        _, _, usage = os.wait4(proc.pid, 0)
        proc.returncode = 0
        assert proc.stdout is not None
        proc.stdout.close()
        cpu += usage.ru_utime + usage.ru_stime
    run.received = lines
    if lines:
        first = min(float(head.split(b"\n", 1)[0]) for head in heads.values())
        last = max(float(tail.rstrip(b"\n").rsplit(b"\n", 1)[-1]) for tail in tails.values())
        run.seconds = run.seconds_low = run.seconds_high = last - first
    run.cpu_seconds = cpu - cpu_first
    run.complete = lines == run.published


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
    # When the first PUBLISH reached the daemon's socket: after ``quiet`` (a look that saw
    # none), by the second value (a look that saw one); from the kernel, see client_socket.
    quiet: float = 0.0
    first_arrival: tuple[float, float] | None = None
    # QoS 1: when the last PUBACK left the daemon's socket (see last_send)
    last_ack: tuple[float, float] | None = None

    def first_nonzero(self) -> int:
        """Index of the first sample that shows a message received."""
        return next(i for i, s in enumerate(self.samples) if s.received or s.done)

    def answered(self) -> int:
        """Scrapes the daemon answered."""
        return sum(not s.refused for s in self.samples)


def watch_daemon(daemon: Daemon, broker: Broker,
                 target: int) -> tuple[Watch, dict[str, float]]:
    """Scrape until ``target`` messages are acked, or nothing moves for STALL."""
    assert daemon.process is not None
    moved = time.monotonic()
    # Nothing can have been received before the daemon was started.
    watch, counters = Watch([Sample(moved, moved, 0, 0, 0.0, refused=True)], moved), {}
    look = shutil.which("ss") is not None
    while True:
        if look and watch.first_arrival is None:
            before, after, figures = client_socket(broker)
            if figures.get("bytes_received", 0) > ARRIVED:
                watch.first_arrival = (watch.quiet, after)
            else:
                watch.quiet = before
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
        watch.samples.append(Sample(sent, answered, done, received, cpu))
        patience = STALL if received or done else START_TIMEOUT
        if done >= target or answered - moved > patience:
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


def client_socket(broker: Broker) -> tuple[float, float, dict[str, int]]:
    """The kernel's figures of the one client socket to the broker (``ss -ti``).

    Returns when the look started and ended, and ``bytes_received`` and ``lastsnd``
    (milliseconds since it last sent data) of the consumer's sockets: the most any of
    them received, and the most recent send of any.
    """
    before = time.monotonic()
    out = subprocess.run(["ss", "-tinH", "state", "established", "dst",
                          f"127.0.0.1:{broker.port}"], capture_output=True, text=True,
                         check=False).stdout
    after = time.monotonic()
    figures: dict[str, int] = {}
    for name in ("bytes_received", "lastsnd"):
        found = [int(x) for x in re.findall(rf"\b{name}:(\d+)", out)]
        if found:
            figures[name] = max(found) if name == "bytes_received" else min(found)
    return before, after, figures


def last_send(broker: Broker) -> tuple[float, float] | None:
    """Bounds of the instant the one client socket to the broker last sent data.

    From the kernel (``lastsnd``, counted in jiffies), so the daemon's event loop has no
    part in it. None when no client is connected.
    """
    before, after, figures = client_socket(broker)
    if "lastsnd" not in figures:
        return None
    ago = figures["lastsnd"] / 1000
    return before - ago - JIFFY, after - ago + 0.001


def timed(run: Run, watch: Watch, writes: tuple[float, float] | None = None) -> None:
    """Bound first message and last ack by the scrapes around them.

    ``writes``: when fakemongo saw the first and the last write (monotonic clock). The
    first message came before the first write, the last ack after the last write: the
    sink's clock narrows the brackets whatever the daemon's event loop is doing.
    """
    samples = watch.samples
    k = watch.first_nonzero()
    # The first scrape that showed the final count: a run that stalled (messages lost on
    # the way) ended there, not after the wait for more that never came.
    j = next(i for i, sample in enumerate(samples) if sample.done == samples[-1].done)
    end = samples[j]
    before_start = samples[k - 1] if k else None
    before_end = samples[j - 1] if j else samples[j]
    start_low = before_start.sent if before_start else samples[k].sent
    start_high = samples[k].answered
    end_low, end_high = before_end.sent, end.answered
    if watch.first_arrival is not None:  # the kernel saw it arrive: the earlier event
        start_low = watch.first_arrival[0]
        start_high = max(start_low, min(start_high, watch.first_arrival[1]))
    if writes is not None:
        start_high = max(start_low, min(start_high, writes[0]))
        end_low = min(end_high, max(end_low, writes[1]))
    if watch.last_ack is not None:
        end_low = min(end_high, max(end_low, watch.last_ack[0]))
        end_high = max(end_low, min(end_high, watch.last_ack[1]))
    run.seconds_low = max(0.0, end_low - start_high)
    run.seconds_high = end_high - start_low
    run.seconds = (run.seconds_low + run.seconds_high) / 2
    cpu_start = before_start.cpu if before_start and not before_start.refused else samples[k].cpu
    run.cpu_seconds = end.cpu - cpu_start


def measure_daemon(run: Run, broker: Broker, client_id: str, sink_uri: str | None,
                   workdir: Path, extra: tuple[str, ...], workers: int = 1) -> Watch:
    """``ingest run`` from its first received message to its last ack, from its metrics."""
    args = ["--mqtt-url", broker.url, "--topic", FILTER, "--client-id", client_id,
            "--qos", str(run.qos), "--log-level", "warning", "--db", "bench",
            "--workers", str(workers), *extra]
    if sink_uri is None:
        args += ["--dry-run", "--mongodb-uri", "mongodb://127.0.0.1:1"]
    else:
        args += ["--mode", run.consumer, "--mongodb-uri", sink_uri]
    daemon = Daemon(args, workdir / f"daemon-{run.consumer}.log").start(wait_ready=False)
    try:
        watch, counters = watch_daemon(daemon, broker, run.published)
        if run.qos == 1 and shutil.which("ss"):
            # Twice, apart: a PUBACK still queued at the first look would move the second.
            first = last_send(broker)
            time.sleep(0.05)
            second = last_send(broker)
            if first and second and abs(first[0] - second[0]) < JIFFY + 0.005:
                watch.last_ack = (max(first[0], second[0]), min(first[1], second[1]))
    finally:
        daemon.stop()
    run.scrapes = watch.answered()
    run.received = int(counters.get("ingest_messages_received_total", 0))
    run.acked = int(counters.get("ingest_messages_acked_total", 0))
    run.written = int(counters.get("ingest_readings_written_total", 0))
    run.rejected = int(counters.get("ingest_readings_rejected_total", 0))
    run.complete = run.acked >= run.published
    return watch


def sink_counts(run: Run, stats: dict[str, Any]) -> None:
    """What fakemongo saw: readings, operations and requests of the writes."""
    if run.consumer == "timeseries":
        run.sink_readings = int(stats["insertedDocuments"])
        run.sink_ops = run.sink_readings
        run.sink_requests = int(stats["insertCommands"])
    else:
        run.sink_readings = int(stats["pushedElements"])
        run.sink_ops = int(stats["updateOps"])
        run.sink_requests = int(stats["updateCommands"])


def run_one(settings: Settings, consumer: str, round_no: int, per_message: int, qos: int,
            messages: int, lines: Path, workdir: Path, helpers: dict[str, Path]) -> Run:
    """One consumer on a fresh broker holding the backlog."""
    run = Run(consumer, round_no, per_message, qos, messages, load=os.getloadavg()[0])
    rundir = Path(tempfile.mkdtemp(dir=workdir))
    broker = Broker(rundir, extra=f"queue_qos0_messages true\nsys_interval {SYS_INTERVAL}\n")
    broker.start()
    sink = None
    try:
        client_id = f"bench-{consumer}"
        session(broker, client_id, qos, settings.workers)
        assert broker.process is not None
        broker_cpu = cpu_of(broker.process.pid)
        dropped_before = broker_dropped(broker)
        run.published = publish(broker, helpers["qos1pub"], lines, messages)
        run.broker_publish_cpu_seconds = cpu_of(broker.process.pid) - broker_cpu
        broker_cpu += run.broker_publish_cpu_seconds
        if consumer == "mosquitto_sub":
            measure_sub(run, broker, client_id, settings.workers)
            run.broker_cpu_seconds = cpu_of(broker.process.pid) - broker_cpu
            count_broker_drops(run, broker, dropped_before)
            return run
        sink_uri = None
        if consumer != "dry-run":
            sink = subprocess.Popen([str(helpers["fakemongo"])], stdout=subprocess.PIPE,
                                    text=True)
            assert sink.stdout is not None
            sink_uri = sink.stdout.readline().strip()
        watch = measure_daemon(run, broker, client_id, sink_uri, rundir, settings.daemon_args,
                               settings.workers)
        run.broker_cpu_seconds = cpu_of(broker.process.pid) - broker_cpu
        if sink is None:
            timed(run, watch)
        else:
            sink.terminate()
            assert sink.stdout is not None
            out = sink.stdout.read()
            _, _, usage = os.wait4(sink.pid, 0)
            sink.returncode = 0
            sink.stdout.close()
            run.sink_cpu_seconds = usage.ru_utime + usage.ru_stime
            stats = json.loads(out.strip().splitlines()[-1])
            sink_counts(run, stats)
            sink = None
            first, last = stats["firstWriteMonotonicNs"], stats["lastWriteMonotonicNs"]
            timed(run, watch, (first / 1e9, last / 1e9) if first else None)
        count_broker_drops(run, broker, dropped_before)
        return run
    finally:
        if sink is not None:
            sink.kill()
            sink.communicate()
        broker.stop()
        shutil.rmtree(rundir, ignore_errors=True)


def count_broker_drops(run: Run, broker: Broker, before: int | None) -> None:
    """What the broker dropped during the run (after its next $SYS update)."""
    time.sleep(SYS_INTERVAL + 0.2)
    after = broker_dropped(broker)
    run.broker_dropped = None if before is None or after is None else after - before


def run_all(settings: Settings, progress: bool = False) -> dict[str, Any]:
    """Every case, consumer and round; the runs and their summary."""
    helpers = tools()
    runs: list[Run] = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for per_message in settings.per_message:
            messages = settings.messages if per_message == 1 else settings.batched_messages
            lines = workdir / f"backlog-{per_message}.txt"
            backlog(lines, messages, per_message, settings.sensors)
            for qos in settings.qos:
                for round_no in range(1, settings.rounds + 1):
                    order = settings.consumers if round_no % 2 else settings.consumers[::-1]
                    for consumer in order:
                        run = run_one(settings, consumer, round_no, per_message, qos,
                                      messages, lines, workdir, helpers)
                        runs.append(run)
                        if progress:
                            f = run.figures()
                            print(f"{per_message:>3} readings/msg QoS {qos} round {round_no} "
                                  f"{consumer:<13} {f['msg_per_s']:>9,.0f} msg/s "
                                  f"±{f['clock_error']:.1%} {f['cpu_us_per_reading']:6.1f} "
                                  f"µs/reading lost {f['lost']}", file=sys.stderr)
    return {"settings": asdict(settings), "load_average": os.getloadavg(),
            "cpus": os.cpu_count(), "python": interpreter(), "runs": [r.figures() for r in runs],
            "summary": summarize(runs, settings)}


def interpreter() -> str:
    """The daemon's Python (this one: the daemon runs as ``sys.executable -m ingest``).

    The daemon's CPU per reading depends on how CPython was built: profile-guided and
    link-time optimisation (``--enable-optimizations --with-lto``, as in the official
    image and distributions' builds) run its Python code markedly faster than a build
    without them (pyenv's default), which the configure flags say.
    """
    flags = str(sysconfig.get_config_var("CONFIG_ARGS") or "")
    built = [flag for flag in ("--enable-optimizations", "--with-lto") if flag in flags]
    return (f"{sys.implementation.name} {sys.version.split()[0]}, configured "
            f"{' '.join(built) if built else 'without --enable-optimizations or --with-lto'}")


def spread(values: list[float]) -> dict[str, float]:
    """min / median / max."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def summarize(runs: list[Run], settings: Settings) -> list[dict[str, Any]]:
    """Per case and consumer: rates, ratios to mosquitto_sub within each round, CPU, losses."""
    out = []
    for per_message in settings.per_message:
        for qos in settings.qos:
            case = [r for r in runs if r.per_message == per_message and r.qos == qos]
            base = {r.round: r.figures()["msg_per_s"] for r in case
                    if r.consumer == "mosquitto_sub"}
            for consumer in settings.consumers:
                mine = [r for r in case if r.consumer == consumer]
                figures = [r.figures() for r in mine]
                ratios = [f["msg_per_s"] / base[r.round] for r, f in zip(mine, figures,
                                                                          strict=True)
                          if base.get(r.round)]
                totals: dict[str, int] = {}
                for f in figures:
                    for key, value in f["lost"].items():
                        totals[key] = totals.get(key, 0) + value
                out.append({
                    "per_message": per_message, "qos": qos, "consumer": consumer,
                    "rounds": len(mine), "messages": mine[0].messages if mine else 0,
                    "msg_per_s": spread([f["msg_per_s"] for f in figures]),
                    "readings_per_s": spread([f["readings_per_s"] for f in figures]),
                    "ratio": spread(ratios) if ratios else None,
                    "cpu_us_per_reading": statistics.median(
                        f["cpu_us_per_reading"] for f in figures),
                    "clock_error_max": max(f["clock_error"] for f in figures),
                    "broker_busy": statistics.median(f["broker_busy"] for f in figures),
                    "published": sum(r.published for r in mine),
                    "received": sum(r.received for r in mine),
                    "broker_dropped": (None if any(r.broker_dropped is None for r in mine)
                                       else sum(r.broker_dropped or 0 for r in mine)),
                    "written": (None if consumer == "mosquitto_sub"
                                else sum(r.written for r in mine)),
                    "at_sink": (None if consumer in ("mosquitto_sub", "dry-run")
                                else sum(r.sink_readings or 0 for r in mine)),
                    "lost": totals,
                    "complete": all(r.complete for r in mine),
                })
    return out


def markdown(report: dict[str, Any]) -> str:
    """The summary as a Markdown table."""
    def trio(s: dict[str, float] | None, fmt: str) -> str:
        return "-" if s is None else " / ".join(format(s[k], fmt) for k in ("min", "median",
                                                                             "max"))

    def count(value: int | None) -> str:
        return "-" if value is None else f"{value:,}"

    rows = [("| readings/msg | QoS | consumer | msg/s (min / median / max) "
             "| readings/s (median) | ratio to mosquitto_sub (min / median / max) "
             "| CPU µs/reading | published | dropped by the broker | received | written "
             "| at sink | clock error | broker CPU / run time (median) |"),
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows.extend(
        f"| {s['per_message']} | {s['qos']} | {s['consumer']} | {trio(s['msg_per_s'], ',.0f')} "
        f"| {s['readings_per_s']['median']:,.0f} | {trio(s['ratio'], '.2f')} "
        f"| {s['cpu_us_per_reading']:.1f} | {count(s['published'])} "
        f"| {count(s['broker_dropped'])} | {count(s['received'])} | {count(s['written'])} "
        f"| {count(s['at_sink'])} | ±{s['clock_error_max']:.1%} "
        f"| {s['broker_busy']:.2f} |"
        for s in report["summary"])
    loads = [r["load"] for r in report["runs"]]
    rows.append("")
    rows.append(f"Sums over {report['settings']['rounds']} rounds; "
                f"{report['settings']['sensors']:,} sensors; 1-minute load average at the "
                f"start of the runs: {min(loads):.2f} to {max(loads):.2f} on {report['cpus']} "
                f"CPUs; {report['settings'].get('workers', 1)} worker(s); "
                f"{report.get('python', 'Python')}.")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sensors", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=100_000,
                        help="single-reading messages a run")
    parser.add_argument("--batched-messages", type=int, default=10_000,
                        help="100-reading messages a run")
    parser.add_argument("--per-message", default="1,100", help="cases: readings a message")
    parser.add_argument("--qos", default="1,0", help="cases: subscription QoS")
    parser.add_argument("--consumers", default=",".join(CONSUMERS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the whole report here")
    parser.add_argument("--workers", type=int, default=1,
                        help="the daemon's --workers, and as many mosquitto_sub on a shared "
                             "group")
    parser.add_argument("--daemon-arg", action="append", default=[],
                        help="extra argument for ingest run (repeatable)")
    args = parser.parse_args()
    # SIGTERM unwinds like an exception, so every broker, daemon and sink is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not shutil.which("mosquitto_sub") or not shutil.which("gcc"):
        print("needs mosquitto, mosquitto-clients and gcc", file=sys.stderr)
        return 2
    consumers = tuple(args.consumers.split(","))
    unknown = set(consumers) - set(CONSUMERS)
    if unknown:
        print(f"--consumers: unknown {sorted(unknown)}; choose from {CONSUMERS}",
              file=sys.stderr)
        return 2
    settings = Settings(
        sensors=args.sensors, messages=args.messages, batched_messages=args.batched_messages,
        per_message=tuple(int(x) for x in args.per_message.split(",")),
        qos=tuple(int(x) for x in args.qos.split(",")), consumers=consumers,
        rounds=args.rounds, daemon_args=tuple(args.daemon_arg), workers=args.workers)
    report = run_all(settings, progress=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(report))
    return 0 if all(s["complete"] for s in report["summary"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())

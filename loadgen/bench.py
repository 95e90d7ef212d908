"""``loadgen bench``: both storage modes side by side, end to end, on the same workload.

Per mode (one after the other): drop the target collection, start ``ingest run`` as a
subprocess (it re-creates the collection), publish, wait until the daemon's metrics show
every reading written or rejected, then measure writes, storage, queries and run verify.
With ``--use-running`` the daemons already run (the compose stack): nothing is dropped,
one publish feeds both, and the figures are deltas of their metrics.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from statistics import median
from typing import TYPE_CHECKING, Any, cast

import bson
from prometheus_client.parser import text_string_to_metric_families
from pymongo import MongoClient
from pymongo.errors import PyMongoError

from ingest import queries
from ingest.decode import Limits, decode
from ingest.writers.bucket import BucketWriter
from ingest.writers.timeseries import TimeseriesWriter
from loadgen import payloads
from loadgen.publisher import Summary, late_plan, message_plan, run_publish
from loadgen.report import percentile
from loadgen.verify import Expected, run_verify
from loadgen.wire import Connection

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from pymongo.database import Database

    from loadgen.config import PublishSettings, VerifySettings

logger = logging.getLogger(__name__)
MODES = ("bucket", "timeseries")
READY_TIMEOUT = 30.0
# Bytes-per-reading estimate: the daemon's default batching (--batch-size, --flush-interval).
DAEMON_BATCH, DAEMON_LINGER, DAEMON_BUCKET_MAX = 2000, 1.0, 3600
ESTIMATE_READINGS = 20_000


class BenchError(RuntimeError):
    """The bench cannot run (a daemon does not start, MongoDB unreachable)."""


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """Everything ``loadgen bench`` needs besides the publish settings."""

    mongodb_uri: str
    db: str
    out: Path
    modes: tuple[str, ...]
    collections: dict[str, str]
    preset: str
    start: str
    use_running: bool = False
    metrics_urls: dict[str, str] = field(default_factory=dict)
    daemon_mqtt_url: str = ""
    daemon_password_file: str | None = None
    daemon_args: tuple[str, ...] = ()
    bucket_span_seconds: int = 3600
    query_runs: int = 5
    latency_samples: int = 50
    poll_interval: float = 0.1
    wait_timeout: float = 120.0


# --- metrics ------------------------------------------------------------------------------

def scrape(url: str) -> dict[str, float]:
    """One /metrics scrape: ``{'name{label="v"}': value}``."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - the user's URL
            text = resp.read().decode()
    except OSError as exc:
        detail = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise BenchError(f"cannot scrape {url}: {detail}") from None
    return parse_metrics(text)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text as ``{'name{label="v",...}': value}``, labels sorted."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def counters(metrics: dict[str, float], mode: str) -> dict[str, float]:
    """The counters bench uses, for one mode."""
    rejected = sum(v for k, v in metrics.items() if k.startswith("ingest_readings_rejected_total"))
    return {"written": metrics.get(f'ingest_readings_written_total{{mode="{mode}"}}', 0.0),
            "rejected": rejected,
            "received": metrics.get("ingest_messages_received_total", 0.0),
            "write_ops": metrics.get(f'ingest_write_ops_total{{mode="{mode}"}}', 0.0),
            "write_requests": metrics.get(f'ingest_write_requests_total{{mode="{mode}"}}', 0.0)}


class SpawnedDaemon:
    """``python -m ingest run`` in one mode, started and stopped by bench."""

    def __init__(self, settings: BenchSettings, mode: str, topic_prefix: str, run_id: str,
                 port: int) -> None:
        s = settings
        self.mode, self.port = mode, port
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.log = s.out / f"daemon-{mode}-{run_id}.log"
        self.cmd = [sys.executable, "-m", "ingest", "run", "--mode", mode,
                    "--mongodb-uri", s.mongodb_uri, "--db", s.db,
                    "--collection", s.collections[mode], "--topic", f"{topic_prefix}/#",
                    "--client-id", f"bench-{mode}-{run_id}", "--metrics-host", "127.0.0.1",
                    "--metrics-port", str(port), *s.daemon_args]
        # The URL may hold a password: the environment keeps it out of `ps`.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("INGEST_")}
        self.env["INGEST_MQTT_URL"] = s.daemon_mqtt_url
        if s.daemon_password_file:
            self.env["INGEST_MQTT_PASSWORD_FILE"] = s.daemon_password_file
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the daemon and wait until /readyz answers 200."""
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(  # noqa: S603 - our own interpreter and flags
                self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BenchError(f"the {self.mode} daemon exited with {self.process.returncode}"
                                 f" (see {self.log})")
            with contextlib.suppress(OSError):
                ready = f"http://127.0.0.1:{self.port}/readyz"
                with urllib.request.urlopen(ready, timeout=2) as resp:
                    if resp.status == 200:
                        return
            time.sleep(0.1)
        self.stop()
        raise BenchError(f"the {self.mode} daemon was not ready after {READY_TIMEOUT:.0f} s "
                         f"(see {self.log})")

    def stop(self) -> None:
        """SIGTERM (drain and flush), then kill after 30 s."""
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- latency sampling ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Sample:
    """One sampled reading and when, after the publisher's start, it was sent."""

    sensor: int
    seq: int
    offset: int  # readings the publisher sent up to and including this one


def plan_samples(settings: PublishSettings, wanted: int) -> list[Sample]:
    """Readings spread evenly over the publish order (one process; its plan replayed)."""
    s = settings
    limits = payloads.split_count(s.count or 0, s.sensors)
    order = list(late_plan(message_plan(list(range(s.sensors)), limits, s.per_message),
                           s.per_message, s.late_every))
    step = max(1, len(order) // max(1, wanted))
    sent, out = 0, []
    for index, (pos, first, k) in enumerate(order):
        sent += k
        if index % step == step - 1:
            out.append(Sample(pos, first + k - 1, sent))
    return out[:wanted]


class Sampler(threading.Thread):
    """Polls MongoDB for the sampled readings; records when each first became visible."""

    def __init__(self, coll: Any, mode: str, run: payloads.Run, samples: list[Sample],  # noqa: ANN401
                 interval: float) -> None:
        super().__init__(name=f"sampler-{mode}", daemon=True)
        self.coll, self.mode = coll, mode
        self.pending = {(run.sensor_id(x.sensor), x.seq): x for x in samples}
        self.seen: dict[Sample, float] = {}
        self.interval = interval
        self.polls: list[float] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        """Poll until every sample is seen or ``stop`` is called."""
        while self.pending and not self.stopping.is_set():
            began = time.monotonic()
            try:
                found = self._poll()
            except PyMongoError as exc:
                logger.warning("latency sampling query failed: %s", exc)
                found = set()
            ended = time.monotonic()
            self.polls.append(ended - began)
            for key in found:
                sample = self.pending.pop(key, None)
                if sample is not None:
                    self.seen[sample] = (began + ended) / 2
            self.stopping.wait(max(0.0, self.interval - (ended - began)))

    def _poll(self) -> set[tuple[str, int]]:
        ids = sorted({k[0] for k in self.pending})
        seqs = sorted({k[1] for k in self.pending})
        if self.mode == "bucket":
            docs = self.coll.find({"sensor_id": {"$in": ids}, "readings.seq": {"$in": seqs}},
                                  {"_id": 0, "sensor_id": 1, "readings.seq": 1})
            return {(d["sensor_id"], r.get("seq")) for d in docs for r in d.get("readings", [])}
        docs = self.coll.find({"meta.sensor_id": {"$in": ids}, "seq": {"$in": seqs}},
                              {"_id": 0, "meta": 1, "seq": 1})
        return {(d["meta"]["sensor_id"], d.get("seq")) for d in docs}

    def stop(self) -> None:
        """End the polling loop and wait for it."""
        self.stopping.set()
        self.join(timeout=10)


def latency_figures(sampler: Sampler, summary: Summary, samples: int) -> dict[str, Any]:
    """Percentiles of visible time minus estimated send time, in milliseconds.

    The send time of a sample is the publisher's start plus its position in the publish
    order divided by the achieved sending rate (the pacer holds the schedule).
    """
    started = min(r.started for r in summary.results)
    readings = summary.total("readings")
    rate = readings / summary.sending if summary.sending > 0 else 0.0
    values = [max(0.0, (seen - (started + x.offset / rate)) * 1000)
              for x, seen in sampler.seen.items()] if rate else []
    polls = sampler.polls
    return {"samples": samples, "seen": len(values),
            **{f"p{p}": _round(percentile(values, p)) for p in (50, 90, 99)},
            "max": _round(max(values)) if values else None,
            "poll_interval_ms": round(sampler.interval * 1000),
            "mean_poll_ms": _round(1000 * sum(polls) / len(polls)) if polls else None}


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


# --- the figures after a run ---------------------------------------------------------------

def estimate_bytes(settings: PublishSettings, mode: str) -> float | None:
    """Estimated BSON bytes sent to MongoDB per reading.

    The daemon's own writers plan the workload in batches as the daemon would cut them,
    and each operation is encoded; the wire adds a little framing per request.
    """
    s = settings
    run = payloads.Run(s.seed, s.sensor_prefix, s.sensors, s.per_message, s.start_ms,
                       s.step_ms, s.topic_prefix)
    model = payloads.Model(s.seed)
    shapes = [model.shape(i) for i in range(s.sensors)]
    limits = payloads.split_count(s.count or 0, s.sensors)
    readings = []
    for pos, first, k in late_plan(message_plan(list(range(s.sensors)), limits, s.per_message),
                                   s.per_message, s.late_every):
        body = payloads.message(run, model, shapes[pos], first, k)
        last = run.ts_ms(first + k - 1) / 1000
        readings.extend(decode(run.topic(pos), body, last, Limits(max_past_seconds=1e12)
                               ).readings)
        if len(readings) >= ESTIMATE_READINGS:
            break
    if not readings:
        return None
    size = DAEMON_BATCH if s.rate <= 0 else max(1, min(DAEMON_BATCH, int(s.rate * DAEMON_LINGER)))
    none = cast("Any", None)
    writer = (BucketWriter(none, none, 3600, DAEMON_BUCKET_MAX) if mode == "bucket"
              else TimeseriesWriter(none, none))
    total = 0
    for start in range(0, len(readings), size):
        for op in writer.plan(readings[start:start + size]).ops:
            if mode == "bucket":  # an update statement as the update command carries it
                op = {"q": op._filter, "u": op._doc, "upsert": True}  # noqa: SLF001, PLW2901
            total += len(bson.encode(op))
    return round(total / len(readings), 1)


def _stats(db: Database[dict[str, Any]], name: str) -> dict[str, Any] | None:
    try:
        docs = list(db[name].aggregate([{"$collStats": {"storageStats": {}}}]))
        if docs and "storageStats" in docs[0]:
            return dict(docs[0]["storageStats"])
    except PyMongoError as exc:
        logger.debug("$collStats on %s failed: %s", name, exc)
    try:
        return dict(db.command("collStats", name))
    except PyMongoError as exc:
        logger.debug("collStats on %s failed: %s", name, exc)
    return None


def storage(db: Database[dict[str, Any]], name: str, mode: str) -> dict[str, Any]:
    """Documents, storageSize, totalIndexSize, average document size of one collection.

    For a time-series collection the internal bucket collection's figures, where the
    server exposes ``system.buckets.<name>``.
    """
    source = name
    stats = None
    if mode == "timeseries":
        stats = _stats(db, f"system.buckets.{name}")
        source = f"system.buckets.{name}"
        if not stats or not stats.get("count"):
            stats, source = _stats(db, name), name
    else:
        stats = _stats(db, name)
    stats = stats or {}
    count = stats.get("count")
    if count is None:
        count = db[name].estimated_document_count()
    return {"collection": name, "source": source, "documents": count,
            "readings_documents": db[name].count_documents({}) if mode == "timeseries" else None,
            "data_size": stats.get("size"), "storage_size": stats.get("storageSize"),
            "total_index_size": stats.get("totalIndexSize"),
            "avg_document_size": stats.get("avgObjSize")}


def query_latency(db: Database[dict[str, Any]], name: str, mode: str, run: payloads.Run,
                  last_ms: int, runs: int, span: int) -> dict[str, Any]:
    """Median latency of the three natural queries (ingest/queries.py), ``runs`` times each."""
    until = datetime.fromtimestamp((last_ms + 1) / 1000, UTC)
    day_end = datetime.fromtimestamp(-(-(last_ms + 1) // 3_600_000) * 3600, UTC)
    sensor = run.sensor_id(0)
    bucket = mode == "bucket"

    def recent(hours: int) -> queries.Pipeline:
        since = until - timedelta(hours=hours)
        return (queries.recent_bucket(sensor, since, until, span) if bucket
                else queries.recent_timeseries(sensor, since, until))

    day = (day_end - timedelta(days=1), day_end)
    pipelines = {"one_sensor_last_hour": recent(1), "one_sensor_last_24h": recent(24),
                 "hourly_all_sensors_day": (queries.hourly_bucket("temp", *day) if bucket
                                            else queries.hourly_timeseries("temp", *day))}
    out: dict[str, Any] = {}
    for key, pipeline in pipelines.items():
        times, rows = [], 0
        for _ in range(runs):
            began = time.perf_counter()
            rows = len(list(db[name].aggregate(pipeline)))
            times.append((time.perf_counter() - began) * 1000)
        out[key] = {"median_ms": round(median(times), 2), "runs": runs, "rows": rows}
    return out


def server_info(client: MongoClient[dict[str, Any]]) -> dict[str, Any]:
    """Which server answered: version, and whether it is the mongoeco emulator."""
    info = client.admin.command("buildInfo")
    emulator = info.get("gitVersion") == "mongoeco"
    return {"version": info.get("version"), "git_version": info.get("gitVersion"),
            "emulator": emulator,
            "label": "emulator, storage figures not meaningful" if emulator else "MongoDB server"}


# --- one publish, measured for one or more modes --------------------------------------------

@dataclass
class Phase:
    """One publish and what each listed mode did with it."""

    modes: list[str]
    urls: dict[str, str]
    results: dict[str, dict[str, Any]] = field(default_factory=dict)


def wait_written(urls: dict[str, str], before: dict[str, dict[str, float]], published: int,
                 timeout: float, topic: str) -> dict[str, float | None]:
    """Poll the daemons' metrics until written + rejected reach ``published``.

    Returns per mode the monotonic time of the first scrape that showed it (None on timeout).
    """
    done: dict[str, float | None] = dict.fromkeys(urls)
    deadline = time.monotonic() + timeout
    while any(v is None for v in done.values()) and time.monotonic() < deadline:
        for mode, url in urls.items():
            if done[mode] is not None:
                continue
            at = time.monotonic()
            now = counters(scrape(url), mode)
            if now["received"] == before[mode]["received"] and at > deadline - timeout + 10:
                raise BenchError(f"the {mode} daemon received no message 10 s after the "
                                 f"publish: may its MQTT user read {topic}/#? (In the compose "
                                 "stack the sensor user may not: use --use-running.)")
            if (now["written"] - before[mode]["written"] + now["rejected"]
                    - before[mode]["rejected"]) >= published:
                done[mode] = at
        time.sleep(0.05)
    return done


def run_phase(settings: BenchSettings, publish: PublishSettings, phase: Phase,
              client: MongoClient[dict[str, Any]]) -> Summary:
    """Publish once while sampling latency; wait for the daemons; fill ``phase.results``."""
    db = client[settings.db]
    before = {m: counters(scrape(u), m) for m, u in phase.urls.items()}
    run = payloads.Run(publish.seed, publish.sensor_prefix, publish.sensors,
                       publish.per_message, publish.start_ms, publish.step_ms,
                       publish.topic_prefix)
    samples = plan_samples(publish, settings.latency_samples)
    samplers = {m: Sampler(db[settings.collections[m]], m, run, samples,
                           settings.poll_interval) for m in phase.modes}
    for sampler in samplers.values():
        sampler.start()
    try:
        summary = run_publish(publish)
        published = summary.total("readings")
        done = wait_written(phase.urls, before, published, settings.wait_timeout,
                            publish.topic_prefix)
    finally:
        for sampler in samplers.values():
            sampler.stop()
    started = min((r.started for r in summary.results), default=time.monotonic())
    for mode in phase.modes:
        after = counters(scrape(phase.urls[mode]), mode)
        delta = {k: after[k] - before[mode][k] for k in after}
        finished = done[mode]
        seconds = finished - started if finished is not None else None
        written = int(delta["written"])
        phase.results[mode] = {
            "published": published, "written": written, "rejected": int(delta["rejected"]),
            "complete": finished is not None,
            "throughput": {"readings_per_s": round(written / seconds) if seconds else None,
                           "seconds": _round(seconds, 3),
                           "publish_readings_per_s": summary.as_dict()["readings_per_s"]},
            "latency_ms": latency_figures(samplers[mode], summary, len(samples)),
            "writes": {"write_ops": int(delta["write_ops"]),
                       "write_requests": int(delta["write_requests"]),
                       "ops_per_reading": _ratio(delta["write_ops"], written, 4),
                       "requests_per_reading": _ratio(delta["write_requests"], written, 5),
                       "est_bytes_per_reading": estimate_bytes(publish, mode),
                       "bytes_are_estimate": True},
        }
    return summary


def _ratio(part: float, whole: int, digits: int) -> float | None:
    return round(part / whole, digits) if whole else None


def measure_after(settings: BenchSettings, publish: PublishSettings, summary: Summary,
                  mode: str, client: MongoClient[dict[str, Any]],
                  verify_settings: VerifySettings) -> dict[str, Any]:
    """Storage, query latency and verify of one mode, once its writes are done."""
    db = client[settings.db]
    name = settings.collections[mode]
    run = payloads.Run(publish.seed, publish.sensor_prefix, publish.sensors,
                       publish.per_message, publish.start_ms, publish.step_ms,
                       publish.topic_prefix)
    counts = summary.counts()
    top = max(counts, default=0)
    last_ms = run.ts_ms(top - 1) if top else publish.start_ms
    expected = Expected(run, tuple(counts))
    report = run_verify(replace(verify_settings, mode=cast("Any", mode)), expected,
                        settings.bucket_span_seconds)[0]
    return {"storage": storage(db, name, mode),
            "queries_ms": query_latency(db, name, mode, run, last_ms, settings.query_runs,
                                        settings.bucket_span_seconds),
            "verify": report.as_dict()}


def check_broker(publish: PublishSettings) -> None:
    """Log in to the broker once as the publisher will, so bad credentials fail at once."""
    conn = Connection(publish.host, publish.port, f"loadgen-{publish.sensor_prefix}-check",
                      timeout=10.0, username=publish.username, password=publish.password)
    try:
        conn.connect()
    except OSError as exc:
        raise BenchError(f"cannot connect to {publish.host}:{publish.port}: {exc}") from None
    finally:
        conn.close()


def run_bench(settings: BenchSettings, publish: PublishSettings, run_id: str,
              free_port: Callable[[], int], progress: Callable[[str], None]) -> dict[str, Any]:
    """Run every mode; return the report (see loadgen/report.py for its rendering)."""
    from loadgen.config import VerifySettings  # noqa: PLC0415 - cheap, avoids a cycle

    check_broker(publish)
    client: MongoClient[dict[str, Any]] = MongoClient(settings.mongodb_uri, tz_aware=True,
                                                      serverSelectionTimeoutMS=5000)
    try:
        try:
            server = server_info(client)
        except PyMongoError as exc:
            raise BenchError(f"cannot reach MongoDB: {str(exc).split(',', 1)[0]}") from exc
        verify_settings = VerifySettings(settings.mongodb_uri, settings.db, "bucket",
                                         settings.collections["bucket"],
                                         settings.collections["timeseries"])
        modes: dict[str, dict[str, Any]] = {}
        if settings.use_running:
            phase = Phase(list(settings.modes), dict(settings.metrics_urls))
            progress(f"publishing {publish.count:,} readings to the running daemons")
            summary = run_phase(settings, publish, phase, client)
            for mode in settings.modes:
                progress(f"{mode}: measuring storage, queries, verify")
                modes[mode] = phase.results[mode] | measure_after(
                    settings, publish, summary, mode, client, verify_settings)
        else:
            for mode in settings.modes:
                modes[mode] = _spawned_mode(settings, publish, mode, run_id, free_port,
                                            client, verify_settings, progress)
        return {"version": 1, "run_id": run_id, "server": server, "modes": modes}
    finally:
        client.close()


def _spawned_mode(settings: BenchSettings, publish: PublishSettings, mode: str, run_id: str,
                  free_port: Callable[[], int], client: MongoClient[dict[str, Any]],
                  verify_settings: VerifySettings, progress: Callable[[str], None]
                  ) -> dict[str, Any]:
    name = settings.collections[mode]
    progress(f"{mode}: dropping {settings.db}.{name}, starting a daemon")
    client[settings.db].drop_collection(name)
    daemon = SpawnedDaemon(settings, mode, publish.topic_prefix, run_id, free_port())
    daemon.start()
    try:
        # A real-time workload starts now, not when the command line was read.
        if settings.start.startswith("now"):
            from loadgen.config import parse_start  # noqa: PLC0415

            publish = replace(publish, start_ms=parse_start(settings.start, time.time()))
        phase = Phase([mode], {mode: daemon.url})
        progress(f"{mode}: publishing {publish.count:,} readings")
        summary = run_phase(settings, publish, phase, client)
    finally:
        daemon.stop()
    progress(f"{mode}: measuring storage, queries, verify")
    return phase.results[mode] | measure_after(settings, publish, summary, mode, client,
                                               verify_settings)

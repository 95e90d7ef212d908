"""``loadgen bench``: both storage modes side by side, end to end, on the same workload.

Per mode (one after the other): drop the target collection, start ``ingest run`` as a
subprocess (it re-creates the collection), publish, wait until the daemon's metrics show
every reading written or rejected, then measure writes, storage, queries and run verify.
With ``--use-running`` the daemons already run (the compose stack): nothing is dropped,
one publish feeds both, and the figures are deltas of their metrics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

from pymongo import MongoClient
from pymongo.errors import PyMongoError

from loadgen import payloads
from loadgen.config import BenchSettings, VerifySettings, parse_start
from loadgen.daemons import (
    BenchError,
    SpawnedDaemon,
    counters,
    scrape,
    wait_written,
)
from loadgen.latency import Sampler, latency_figures, plan_samples, rounded
from loadgen.measure import estimate_bytes, query_latency, server_info, storage
from loadgen.publisher import Summary, run_publish
from loadgen.verify import Expected, run_verify
from loadgen.wire import Connection

if TYPE_CHECKING:
    from collections.abc import Callable

    from loadgen.config import PublishSettings

# The bench's interface, including what its parts provide to the tests and bench_cli.
__all__ = [
    "MODES",
    "BenchError",
    "BenchSettings",
    "Phase",
    "check_broker",
    "measure_after",
    "run_bench",
    "run_phase",
]
MODES = ("bucket", "timeseries")


# --- one publish, measured for one or more modes --------------------------------------------


@dataclass
class Phase:
    """One publish and what each listed mode did with it."""

    modes: list[str]
    urls: dict[str, str]
    results: dict[str, dict[str, Any]] = field(default_factory=dict)


def run_phase(
    settings: BenchSettings,
    publish: PublishSettings,
    phase: Phase,
    client: MongoClient[dict[str, Any]],
) -> Summary:
    """Publish once while sampling latency; wait for the daemons; fill ``phase.results``."""
    db = client[settings.db]
    before = {m: counters(scrape(u), m) for m, u in phase.urls.items()}
    run = payloads.Run(
        publish.seed,
        publish.sensor_prefix,
        publish.sensors,
        publish.per_message,
        publish.start_ms,
        publish.step_ms,
        publish.topic_prefix,
        publish.separator,
    )
    samples = plan_samples(publish, settings.latency_samples)
    samplers = {
        m: Sampler(db[settings.collections[m]], m, run, samples, settings.poll_interval)
        for m in phase.modes
    }
    for sampler in samplers.values():
        sampler.start()
    try:
        summary = run_publish(publish)
        published = summary.total("readings")
        done = wait_written(
            phase.urls, before, published, settings.wait_timeout, publish.topic_prefix
        )
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
            "published": published,
            "written": written,
            "rejected": int(delta["rejected"]),
            "complete": finished is not None,
            "throughput": {
                "readings_per_s": round(written / seconds) if seconds else None,
                "seconds": rounded(seconds, 3),
                "publish_readings_per_s": summary.as_dict()["readings_per_s"],
            },
            "latency_ms": latency_figures(samplers[mode], summary, len(samples)),
            "writes": {
                "write_ops": int(delta["write_ops"]),
                "write_requests": int(delta["write_requests"]),
                "ops_per_reading": _ratio(delta["write_ops"], written, 4),
                "requests_per_reading": _ratio(delta["write_requests"], written, 5),
                "est_bytes_per_reading": estimate_bytes(publish, mode),
                "bytes_are_estimate": True,
            },
        }
    return summary


def _ratio(part: float, whole: int, digits: int) -> float | None:
    return round(part / whole, digits) if whole else None


def measure_after(
    settings: BenchSettings,
    publish: PublishSettings,
    summary: Summary,
    mode: str,
    client: MongoClient[dict[str, Any]],
    verify_settings: VerifySettings,
) -> dict[str, Any]:
    """Storage, query latency and verify of one mode, once its writes are done."""
    db = client[settings.db]
    name = settings.collections[mode]
    run = payloads.Run(
        publish.seed,
        publish.sensor_prefix,
        publish.sensors,
        publish.per_message,
        publish.start_ms,
        publish.step_ms,
        publish.topic_prefix,
        publish.separator,
    )
    counts = summary.counts()
    top = max(counts, default=0)
    last_ms = run.ts_ms(top - 1) if top else publish.start_ms
    expected = Expected(run, tuple(counts))
    report = run_verify(
        replace(verify_settings, mode=cast("Any", mode)), expected, settings.bucket_span_seconds
    )[0]
    return {
        "storage": storage(db, name, mode),
        "queries_ms": query_latency(
            db, name, mode, run, last_ms, settings.query_runs, settings.bucket_span_seconds
        ),
        "verify": report.as_dict(),
    }


def check_broker(publish: PublishSettings) -> None:
    """Log in to the broker once as the publisher will, so bad credentials fail at once."""
    conn = Connection(
        publish.host,
        publish.port,
        f"loadgen-{publish.sensor_prefix}-check",
        timeout=10.0,
        username=publish.username,
        password=publish.password,
    )
    try:
        conn.connect()
    except OSError as exc:
        raise BenchError(f"cannot connect to {publish.host}:{publish.port}: {exc}") from None
    finally:
        conn.close()


def run_bench(
    settings: BenchSettings,
    publish: PublishSettings,
    run_id: str,
    free_port: Callable[[], int],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Run every mode; return the report (see loadgen/report.py for its rendering)."""
    check_broker(publish)
    client: MongoClient[dict[str, Any]] = MongoClient(
        settings.mongodb_uri, tz_aware=True, serverSelectionTimeoutMS=5000
    )
    try:
        try:
            server = server_info(client)
        except PyMongoError as exc:
            raise BenchError(f"cannot reach MongoDB: {str(exc).split(',', 1)[0]}") from exc
        verify_settings = VerifySettings(
            settings.mongodb_uri,
            settings.db,
            "bucket",
            settings.collections["bucket"],
            settings.collections["timeseries"],
        )
        modes: dict[str, dict[str, Any]] = {}
        if settings.use_running:
            phase = Phase(list(settings.modes), dict(settings.metrics_urls))
            progress(f"publishing {publish.count:,} readings to the running daemons")
            summary = run_phase(settings, publish, phase, client)
            for mode in settings.modes:
                progress(f"{mode}: measuring storage, queries, verify")
                modes[mode] = phase.results[mode] | measure_after(
                    settings, publish, summary, mode, client, verify_settings
                )
        else:
            for mode in settings.modes:
                modes[mode] = _spawned_mode(
                    settings, publish, mode, run_id, free_port, client, verify_settings, progress
                )
        return {"version": 1, "run_id": run_id, "server": server, "modes": modes}
    finally:
        client.close()


def _spawned_mode(
    settings: BenchSettings,
    publish: PublishSettings,
    mode: str,
    run_id: str,
    free_port: Callable[[], int],
    client: MongoClient[dict[str, Any]],
    verify_settings: VerifySettings,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    name = settings.collections[mode]
    progress(f"{mode}: dropping {settings.db}.{name}, starting a daemon")
    client[settings.db].drop_collection(name)
    daemon = SpawnedDaemon(settings, mode, publish.topic_prefix, run_id, free_port())
    daemon.start()
    try:
        # A real-time workload starts now, not when the command line was read.
        if settings.start.startswith("now"):
            publish = replace(publish, start_ms=parse_start(settings.start, time.time()))
        phase = Phase([mode], {mode: daemon.url})
        progress(f"{mode}: publishing {publish.count:,} readings")
        summary = run_phase(settings, publish, phase, client)
    finally:
        daemon.stop()
    progress(f"{mode}: measuring storage, queries, verify")
    return phase.results[mode] | measure_after(
        settings, publish, summary, mode, client, verify_settings
    )

"""The figures ``loadgen bench`` takes after a run: bytes, storage, query latency, server.

Everything here reads MongoDB (or, for the bytes estimate, replays the workload through
the daemon's own writers); nothing is published or started.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime, timedelta
from statistics import median
from typing import TYPE_CHECKING, Any, cast

import bson
from pymongo.errors import PyMongoError

from ingest.config import Settings
from ingest.devices.decode import Limits, decode
from ingest.store import layout_queries
from ingest.store.writers.bucket import BucketWriter
from ingest.store.writers.timeseries import TimeseriesWriter
from loadgen import payloads

if TYPE_CHECKING:
    from pymongo import MongoClient
    from pymongo.database import Database

    from loadgen.config import PublishSettings

logger = logging.getLogger(__name__)
_DEFAULTS = Settings()
# Bytes-per-reading estimate: the daemon's default batching (--batch-size, --flush-interval).
DAEMON_BATCH, DAEMON_LINGER, DAEMON_BUCKET_MAX = (
    _DEFAULTS.batch_size,
    _DEFAULTS.flush_interval,
    _DEFAULTS.bucket_max_readings,
)
ESTIMATE_READINGS = 20_000


def estimate_bytes(settings: PublishSettings, mode: str) -> float | None:
    """Estimated BSON bytes sent to MongoDB per reading.

    The daemon's own writers plan the workload in batches as the daemon would cut them,
    and each operation is encoded; the wire adds a little framing per request.
    """
    s = settings
    run = payloads.Run(
        s.seed,
        s.sensor_prefix,
        s.sensors,
        s.per_message,
        s.start_ms,
        s.step_ms,
        s.topic_prefix,
        s.separator,
    )
    model = payloads.Model(s.seed)
    shapes = [model.shape(i) for i in range(s.sensors)]
    limits = payloads.split_count(s.count or 0, s.sensors)
    readings = []
    plan = payloads.message_plan(list(range(s.sensors)), limits, s.per_message)
    for pos, first, k in payloads.late_plan(plan, s.per_message, s.late_every):
        body = payloads.message(run, model, shapes[pos], first, k)
        last = run.ts_ms(first + k - 1) / 1000
        readings.extend(decode(run.topic(pos), body, last, Limits(max_past_seconds=1e12)).readings)
        if len(readings) >= ESTIMATE_READINGS:
            break
    if not readings:
        return None
    size = DAEMON_BATCH if s.rate <= 0 else max(1, min(DAEMON_BATCH, int(s.rate * DAEMON_LINGER)))
    none = cast("Any", None)
    writer = (
        BucketWriter(none, none, 3600, DAEMON_BUCKET_MAX)
        if mode == "bucket"
        else TimeseriesWriter(none, none)
    )
    total = 0
    for start in range(0, len(readings), size):
        # each op is the statement the command carries: an update's or a document
        total += sum(len(bson.encode(op)) for op in writer.plan(readings[start : start + size]).ops)
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
    return {
        "collection": name,
        "source": source,
        "documents": count,
        "readings_documents": db[name].count_documents({}) if mode == "timeseries" else None,
        "data_size": stats.get("size"),
        "storage_size": stats.get("storageSize"),
        "total_index_size": stats.get("totalIndexSize"),
        "avg_document_size": stats.get("avgObjSize"),
    }


def query_latency(
    db: Database[dict[str, Any]],
    name: str,
    mode: str,
    run: payloads.Run,
    last_ms: int,
    runs: int,
    span: int,
) -> dict[str, Any]:
    """Median latency of the three natural queries, ``runs`` times each.

    The queries are those of ingest/store/layout_queries.py.
    """
    until = datetime.fromtimestamp((last_ms + 1) / 1000, UTC)
    day_end = datetime.fromtimestamp(-(-(last_ms + 1) // 3_600_000) * 3600, UTC)
    sensor = run.sensor_id(0)
    bucket = mode == "bucket"

    def recent(hours: int) -> layout_queries.Pipeline:
        since = until - timedelta(hours=hours)
        return (
            layout_queries.recent_bucket(sensor, since, until, span)
            if bucket
            else layout_queries.recent_timeseries(sensor, since, until)
        )

    day = (day_end - timedelta(days=1), day_end)
    pipelines = {
        "one_sensor_last_hour": recent(1),
        "one_sensor_last_24h": recent(24),
        "hourly_all_sensors_day": (
            layout_queries.hourly_bucket("temp", *day)
            if bucket
            else layout_queries.hourly_timeseries("temp", *day)
        ),
    }
    out: dict[str, Any] = {}
    out["promql_avg_over_time_day"] = promql_latency(db, name, mode, day[1], runs, span)
    for key, pipeline in pipelines.items():
        times, rows = [], 0
        for _ in range(runs):
            began = time.perf_counter()
            rows = len(list(db[name].aggregate(pipeline)))
            times.append((time.perf_counter() - began) * 1000)
        out[key] = {"median_ms": round(median(times), 2), "runs": runs, "rows": rows}
    return out


def promql_latency(
    db: Database[dict[str, Any]], name: str, mode: str, day_end: datetime, runs: int, span: int
) -> dict[str, Any]:
    """Median latency of ``avg_over_time(temp[1h])`` over the day at 1-hour steps.

    ingest api's PromQL evaluation (in process, no HTTP): bucket mode answers it from the
    documents' statistics when the hours are bucket spans.
    """
    from ingest.api.prom_http import DEFAULT_LOOKBACK_MS, PromApi  # noqa: PLC0415 - aiohttp
    from ingest.api.promql import Steps, parse  # noqa: PLC0415
    from ingest.api.read_queries import Layout  # noqa: PLC0415

    async def run_pipeline(pipeline: layout_queries.Pipeline) -> list[dict[str, Any]]:
        return list(db[name].aggregate(pipeline))

    end_ms = int(day_end.timestamp() * 1000)
    times = list(range(end_ms - 23 * 3_600_000, end_ms + 1, 3_600_000))
    api = PromApi(run_pipeline, Layout(mode, span), lambda: day_end, 600)
    node = parse("avg_over_time(temp[1h])")
    took, series = [], 0
    for _ in range(runs):
        began = time.perf_counter()
        value = asyncio.run(api.evaluate(node, Steps(times, DEFAULT_LOOKBACK_MS, 3_600_000)))
        took.append((time.perf_counter() - began) * 1000)
        series = len(getattr(value, "series", ()))
    return {"median_ms": round(median(took), 2), "runs": runs, "rows": series}


def server_info(client: MongoClient[dict[str, Any]]) -> dict[str, Any]:
    """Which server answered: version, and whether it is the mongoeco emulator."""
    info = client.admin.command("buildInfo")
    emulator = info.get("gitVersion") == "mongoeco"
    return {
        "version": info.get("version"),
        "git_version": info.get("gitVersion"),
        "emulator": emulator,
        "label": "emulator, storage figures not meaningful" if emulator else "MongoDB server",
    }

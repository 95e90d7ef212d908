"""Read side of "bucket vs time-series": the read API's latency per query, both layouts.

Writes the same fleet-day through both real writers (one database, ``buckets`` and
``readings``), serves each collection with the read API (in this process, over HTTP on
127.0.0.1), and asks each query ``--requests`` times, one at a time:

    sensors     GET /api/sensors over the whole day
    readings    GET /api/readings of one sensor over one hour (every reading, one page)
    series-1h   GET /api/series of one sensor and measurement over the day, step 1h
                (bucket mode: summed bucket statistics)
    series-5m   the same with step 5m (both layouts aggregate raw readings)

    .venv/bin/python -m bench.api [--sensors 10] [--hours 24] [--interval 300]
        [--requests 50] [--mongodb-uri URI]

Without --mongodb-uri it starts the mongoeco emulator, which is far slower than MongoDB
and slows as collections grow: keep the data small there, and compare layouts, not
absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
from aiohttp import web
from pymongo import AsyncMongoClient

from ingest.api.read_queries import iso
from ingest.api.server import ReadApi
from ingest.config import ApiSettings
from ingest.model import Reading, Scalar
from ingest.store.schema import Schema
from ingest.store.writers.bucket import BucketWriter, ts_key
from ingest.store.writers.timeseries import TimeseriesWriter
from tests.support.procs import start_emulator

DAY = datetime(2026, 5, 1, tzinfo=UTC)
BATCH = 500  # readings per write, as a daemon's batch under light load


def fleet(sensors: int, hours: int, interval: int, seed: int) -> list[Reading]:
    """Every sensor every ``interval`` seconds, jittered, temperature and humidity."""
    rng = random.Random(seed)
    out = []
    for step in range(hours * 3600 // interval):
        for s in range(sensors):
            ts = DAY + timedelta(seconds=step * interval + rng.randint(0, interval - 1))
            values: dict[str, Scalar] = {
                "temp": round(20 + rng.gauss(0, 2), 2),
                "hum": rng.randint(30, 70),
            }
            out.append(Reading(f"sensor-{s:04d}", ts, ts.timestamp(), values, step, ts_key(ts)))
    return out


async def load(db: Any, readings: list[Reading]) -> dict[str, float]:  # noqa: ANN401
    """Write through both writers; seconds each took."""

    def schema(name: str) -> Schema:
        return Schema(
            db,
            name,
            rejects_collection="rejects",
            rejects_max_bytes=1 << 20,
            retention_days=None,
            span_seconds=3600,
        )

    writers: dict[str, BucketWriter | TimeseriesWriter] = {
        "bucket": BucketWriter(db.buckets, schema("buckets"), 3600, 3600),
        "timeseries": TimeseriesWriter(db.readings, schema("readings")),
    }
    took = {}
    for mode, writer in writers.items():
        await writer.ensure_schema()
        start = time.perf_counter()
        for i in range(0, len(readings), BATCH):
            outcome = await writer.write(writer.plan(readings[i : i + BATCH]))
            assert outcome.written == len(readings[i : i + BATCH]), outcome
        took[mode] = time.perf_counter() - start
    return took


def queries(hours: int) -> dict[str, str]:
    end = DAY + timedelta(hours=hours)
    hour = DAY + timedelta(hours=hours // 2)
    day = f"since={iso(DAY)}&until={iso(end)}"
    return {
        "sensors": f"/api/sensors?{day}",
        "readings": (
            f"/api/readings?sensor=sensor-0001&since={iso(hour)}"
            f"&until={iso(hour + timedelta(hours=1))}&limit=10000"
        ),
        "series-1h": f"/api/series?sensor=sensor-0001&measurement=temp&{day}&step=1h",
        "series-5m": f"/api/series?sensor=sensor-0001&measurement=temp&{day}&step=5m",
    }


async def measure(
    client: AsyncMongoClient[dict[str, Any]],
    db: str,
    mode: str,
    paths: dict[str, str],
    requests: int,
    now: datetime,
) -> dict[str, dict[str, float]]:
    settings = ApiSettings(
        mode=mode,  # type: ignore[arg-type]
        db=db,
        collection="buckets" if mode == "bucket" else "readings",
    )
    runner = web.AppRunner(ReadApi(settings, client, clock=lambda: now).app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    out: dict[str, dict[str, float]] = {}
    try:
        async with aiohttp.ClientSession() as http:
            for name, path in paths.items():
                times = []
                for i in range(requests + 1):
                    start = time.perf_counter()
                    async with http.get(base + path) as resp:
                        body = await resp.read()
                        assert resp.status == 200, body[:300]
                    if i:  # the first request warms connections and caches
                        times.append(time.perf_counter() - start)
                times.sort()
                out[name] = {
                    "p50_ms": 1000 * statistics.median(times),
                    "p99_ms": 1000 * times[min(len(times) - 1, round(0.99 * (len(times) - 1)))],
                    "bytes": len(body),
                }
    finally:
        await runner.cleanup()
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    proc = None
    uri = args.mongodb_uri
    if uri is None:
        proc, uri = start_emulator()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, tz_aware=True)
    db_name = f"bench_api_{int(time.time())}"
    try:
        readings = fleet(args.sensors, args.hours, args.interval, args.seed)
        write_seconds = await load(client[db_name], readings)
        now = DAY + timedelta(hours=args.hours)
        paths = queries(args.hours)
        results = {
            mode: await measure(client, db_name, mode, paths, args.requests, now)
            for mode in ("bucket", "timeseries")
        }
        return {
            "command": " ".join(["python", "-m", "bench.api", *sys.argv[1:]]),
            "mongodb": "emulator" if args.mongodb_uri is None else "given",
            "readings": len(readings),
            "sensors": args.sensors,
            "hours": args.hours,
            "write_seconds": write_seconds,
            "requests": args.requests,
            "results": results,
        }
    finally:
        await client.drop_database(db_name)
        await client.close()
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sensors", type=int, default=10)
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--interval", type=int, default=300, help="seconds between readings")
    parser.add_argument("--requests", type=int, default=50, help="per query and layout")
    parser.add_argument("--mongodb-uri", help="default: the mongoeco emulator")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    report = asyncio.run(run(args))
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"{report['readings']} readings ({args.sensors} sensors, {args.hours} h), "
        f"MongoDB: {report['mongodb']}, {args.requests} requests per query, one at a time"
    )
    print(f"{'query':<10} {'layout':<11} {'p50 ms':>8} {'p99 ms':>8} {'bytes':>8}")
    for mode, rows in report["results"].items():
        for name, row in rows.items():
            print(
                f"{name:<10} {mode:<11} {row['p50_ms']:8.1f} {row['p99_ms']:8.1f} {row['bytes']:8d}"
            )


if __name__ == "__main__":
    main()

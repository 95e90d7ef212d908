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

import statistics
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from bench.fleet import DAY, fleet, head, main, parser, store, writers
from ingest.api.read_queries import iso
from ingest.api.server import ReadApi
from ingest.config import ApiSettings

if TYPE_CHECKING:
    import argparse
    from datetime import datetime

    from pymongo import AsyncMongoClient

    from ingest.model import Reading

BATCH = 500  # readings per write, as a daemon's batch under light load


async def load(db: Any, readings: list[Reading]) -> dict[str, float]:  # noqa: ANN401
    """Write through both writers; seconds each took."""
    took = {}
    for mode, writer in writers(db).items():
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
    async with store(args.mongodb_uri, "bench_api") as where:
        readings = fleet(args.sensors, args.hours, args.interval, args.seed)
        write_seconds = await load(where.db, readings)
        now = DAY + timedelta(hours=args.hours)
        paths = queries(args.hours)
        results = {
            mode: await measure(where.client, where.db.name, mode, paths, args.requests, now)
            for mode in ("bucket", "timeseries")
        }
        return head("bench.api", args, len(readings)) | {
            "write_seconds": write_seconds,
            "requests": args.requests,
            "results": results,
        }


def table(report: dict[str, Any]) -> None:
    print(
        f"{report['readings']} readings ({report['sensors']} sensors, {report['hours']} h), "
        f"MongoDB: {report['mongodb']}, {report['requests']} requests per query, one at a time"
    )
    print(f"{'query':<10} {'layout':<11} {'p50 ms':>8} {'p99 ms':>8} {'bytes':>8}")
    for mode, rows in report["results"].items():
        for name, row in rows.items():
            print(
                f"{name:<10} {mode:<11} {row['p50_ms']:8.1f} {row['p99_ms']:8.1f} {row['bytes']:8d}"
            )


if __name__ == "__main__":
    arguments = parser(__doc__, sensors=10)
    arguments.add_argument("--requests", type=int, default=50, help="per query and layout")
    main(arguments.parse_args(), run, table)

"""PromQL over the stored readings: a day of ``avg_over_time`` at 1-hour steps, three ways.

Writes the same fleet-day through both real writers (bench.api's fleet: every sensor
every ``--interval`` seconds, temperature and humidity), then evaluates

    avg_over_time(temp[1h])   from the day's start + 1 h to its end, step 1h

over every sensor, in process (the API's evaluator and pipelines, no HTTP), ``--runs``
times each:

    bucket-stats   bucket mode from the documents' statistics (the windows are bucket spans)
    bucket-raw     bucket mode reading the raw readings (the statistics path turned off)
    timeseries     time-series mode (raw readings; it has no statistics)

and checks that the three answers agree.

    .venv/bin/python -m bench.promql [--sensors 100] [--hours 24] [--interval 300]
        [--runs 5] [--mongodb-uri URI]

Without --mongodb-uri it starts the mongoeco emulator, far slower than MongoDB: compare
the ways with each other, not the absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
from datetime import timedelta
from typing import Any

from pymongo import AsyncMongoClient

from bench.api import DAY, fleet, load
from ingest.api.prom_http import DEFAULT_LOOKBACK_MS, PromApi, range_result
from ingest.api.promql import Steps, parse
from ingest.api.read_queries import Layout
from tests.support.procs import start_emulator

QUERY = "avg_over_time(temp[1h])"
WAYS = {"bucket-stats": ("bucket", True), "bucket-raw": ("bucket", False)}
WAYS["timeseries"] = ("timeseries", False)


async def evaluate(db: Any, way: str, hours: int) -> tuple[float, list[dict[str, Any]]]:  # noqa: ANN401
    """Seconds one evaluation took, and its answer."""
    mode, use_stats = WAYS[way]
    collection = db.buckets if mode == "bucket" else db.readings

    async def run(pipeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return await (await collection.aggregate(pipeline)).to_list()  # type: ignore[no-any-return]

    end = DAY + timedelta(hours=hours)
    api = PromApi(run, Layout(mode, 3600), lambda: end, 600, use_stats=use_stats)
    first = round((DAY + timedelta(hours=1)).timestamp() * 1000)
    times = list(range(first, round(end.timestamp() * 1000) + 1, 3_600_000))
    began = time.perf_counter()
    value = await api.evaluate(parse(QUERY), Steps(times, DEFAULT_LOOKBACK_MS, 3_600_000))
    took = time.perf_counter() - began
    return took, range_result(value, times)


def same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Equal answers, values within floating-point tolerance."""
    if [s["metric"] for s in a] != [s["metric"] for s in b]:
        return False
    return all(
        p[0] == q[0] and math.isclose(float(p[1]), float(q[1]), rel_tol=1e-9)
        for x, y in zip(a, b, strict=True)
        for p, q in zip(x["values"], y["values"], strict=True)
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    proc = None
    uri = args.mongodb_uri
    if uri is None:
        proc, uri = start_emulator()
    # a long timeout: the emulator answers one write at a time, and a busy machine can
    # hold a batch past the default 20 s (the driver's monitor would then reset the pool)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        uri, tz_aware=True, connectTimeoutMS=300_000, socketTimeoutMS=300_000
    )
    db_name = f"bench_promql_{int(time.time())}"
    try:
        readings = fleet(args.sensors, args.hours, args.interval, args.seed)
        await load(client[db_name], readings)
        results: dict[str, Any] = {}
        answers = {}
        for way in WAYS:
            times = []
            for _ in range(args.runs):
                took, answers[way] = await evaluate(client[db_name], way, args.hours)
                times.append(took)
            results[way] = {"median_ms": round(1000 * statistics.median(times), 1)}
        agree = same(answers["bucket-stats"], answers["bucket-raw"]) and same(
            answers["bucket-stats"], answers["timeseries"]
        )
        stats_ms = results["bucket-stats"]["median_ms"]
        for row in results.values():
            row["x_stats"] = round(row["median_ms"] / stats_ms, 1)
        return {
            "command": " ".join(["python", "-m", "bench.promql", *sys.argv[1:]]),
            "mongodb": "emulator" if args.mongodb_uri is None else "given",
            "query": QUERY,
            "readings": len(readings),
            "sensors": args.sensors,
            "series": len(answers["bucket-stats"]),
            "answers_agree": agree,
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
    parser.add_argument("--sensors", type=int, default=100)
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--interval", type=int, default=300, help="seconds between readings")
    parser.add_argument("--runs", type=int, default=5, help="evaluations per way")
    parser.add_argument("--mongodb-uri", help="default: the mongoeco emulator")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    report = asyncio.run(run(args))
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"{QUERY}, {args.hours} h at 1 h steps: {report['readings']} readings of "
        f"{args.sensors} sensors, MongoDB: {report['mongodb']}, answers agree: "
        f"{report['answers_agree']}"
    )
    print(f"{'way':<13} {'median ms':>10} {'x stats':>8}")
    for way, row in report["results"].items():
        print(f"{way:<13} {row['median_ms']:>10} {row['x_stats']:>8}")


if __name__ == "__main__":
    main()

"""PromQL over the stored readings: a day of ``avg_over_time`` at 1-hour steps, three ways.

Stores a fleet-day in both layouts (bench.fleet's fleet: every sensor every
``--interval`` seconds, temperature and humidity), as documents the writers' own code
builds, inserted in bulk (bench.stored), then evaluates

    avg_over_time(temp[1h])   from the day's start + 1 h to its end, step 1h

over every sensor, in process (the API's evaluator and pipelines, no HTTP), ``--runs``
times each:

    bucket-stats   bucket mode from the documents' statistics (the windows are bucket spans)
    bucket-raw     bucket mode reading the raw readings (the statistics path turned off)
    timeseries     time-series mode (raw readings; it has no statistics)

and checks that the three answers agree. Each way's row has the median time of an
evaluation and the median CPU time this process spent in it (the evaluator, the driver's
encoding and decoding): the rest is the server's work and the wait for it.

    .venv/bin/python -m bench.promql [--sensors 100] [--hours 24] [--interval 300]
        [--runs 5] [--mongodb-uri URI]

Without --mongodb-uri it starts the mongoeco emulator, far slower than MongoDB and with
other costs (docs/performance.md#promql says which): compare the ways with each other,
not the absolute figures. There, one reading every 10 minutes (``--interval 600``) keeps
1,000 sensors to minutes.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from bench import stored
from bench.fleet import COLLECTIONS, DAY, fleet, head, main, parser, store
from ingest.api.prom_http import DEFAULT_LOOKBACK_MS, PromApi, range_result
from ingest.api.promql import Steps, parse
from ingest.api.read_queries import Layout

if TYPE_CHECKING:
    import argparse

QUERY = "avg_over_time(temp[1h])"
WAYS = {"bucket-stats": ("bucket", True), "bucket-raw": ("bucket", False)}
WAYS["timeseries"] = ("timeseries", False)


@dataclass
class Evaluation:
    """One evaluation: its time, this process's CPU time in it, each aggregation, the answer."""

    seconds: float
    cpu_seconds: float
    # each aggregation the evaluator ran, in order: seconds to its last document, documents
    pipelines: list[tuple[float, int]]
    answer: list[dict[str, Any]]


async def evaluate(db: Any, way: str, hours: int) -> Evaluation:  # noqa: ANN401
    """Evaluate the query once, one of the ways."""
    mode, use_stats = WAYS[way]
    collection = db[COLLECTIONS[mode]]
    pipelines: list[tuple[float, int]] = []

    async def aggregate(pipeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
        began = time.perf_counter()
        docs: list[dict[str, Any]] = await (await collection.aggregate(pipeline)).to_list()
        pipelines.append((time.perf_counter() - began, len(docs)))
        return docs

    end = DAY + timedelta(hours=hours)
    api = PromApi(aggregate, Layout(mode, 3600), lambda: end, 600, use_stats=use_stats)
    first = round((DAY + timedelta(hours=1)).timestamp() * 1000)
    times = list(range(first, round(end.timestamp() * 1000) + 1, 3_600_000))
    began, cpu = time.perf_counter(), time.process_time()
    value = await api.evaluate(parse(QUERY), Steps(times, DEFAULT_LOOKBACK_MS, 3_600_000))
    took, cpu = time.perf_counter() - began, time.process_time() - cpu
    return Evaluation(took, cpu, pipelines, range_result(value, times))


def summary(runs: list[Evaluation]) -> dict[str, Any]:
    """Medians over the runs of a way: time, CPU time, and each aggregation's time."""
    return {
        "median_ms": round(1000 * statistics.median(r.seconds for r in runs), 1),
        "client_cpu_ms": round(1000 * statistics.median(r.cpu_seconds for r in runs), 1),
        "pipelines": [
            {
                "median_ms": round(1000 * statistics.median(p[0] for p in same_step), 1),
                "documents": same_step[0][1],
            }
            for same_step in zip(*(r.pipelines for r in runs), strict=True)
        ],
    }


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
    async with store(args.mongodb_uri, "bench_promql") as where:
        readings = fleet(args.sensors, args.hours, args.interval, args.seed)
        loaded = await stored.load(where, readings)
        results: dict[str, Any] = {}
        answers = {}
        for way in WAYS:
            runs = [await evaluate(where.db, way, args.hours) for _ in range(args.runs)]
            results[way] = summary(runs)
            answers[way] = runs[-1].answer
        agree = same(answers["bucket-stats"], answers["bucket-raw"]) and same(
            answers["bucket-stats"], answers["timeseries"]
        )
        stats_ms = results["bucket-stats"]["median_ms"]
        for row in results.values():
            row["x_stats"] = round(row["median_ms"] / stats_ms, 1)
        return head("bench.promql", args, len(readings)) | {
            "query": QUERY,
            "load": loaded,
            "series": len(answers["bucket-stats"]),
            "answers_agree": agree,
            "runs": args.runs,
            "results": results,
        }


def table(report: dict[str, Any]) -> None:
    print(
        f"{QUERY}, {report['hours']} h at 1 h steps: {report['readings']} readings of "
        f"{report['sensors']} sensors, MongoDB: {report['mongodb']}, answers agree: "
        f"{report['answers_agree']}"
    )
    for mode, load in report["load"].items():
        without = f" (without the index {load['without_index']})" if "without_index" in load else ""
        print(
            f"stored {mode}: {load['documents']} documents, built in {load['build_s']} s, "
            f"inserted in {load['insert_s']} s{without}"
        )
    print(f"{'way':<13} {'median ms':>10} {'client CPU ms':>14} {'x stats':>8}  aggregations")
    for way, row in report["results"].items():
        steps = ", ".join(f"{p['median_ms']} ms ({p['documents']} docs)" for p in row["pipelines"])
        print(
            f"{way:<13} {row['median_ms']:>10} {row['client_cpu_ms']:>14} {row['x_stats']:>8}  "
            + steps
        )


if __name__ == "__main__":
    arguments = parser(__doc__, sensors=100)
    arguments.add_argument("--runs", type=int, default=5, help="evaluations per way")
    main(arguments.parse_args(), run, table)

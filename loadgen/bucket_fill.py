"""``loadgen bucket-fill``: what one bucket-mode write costs as its document fills.

Each upsert ``$push``-es into a document that already holds n readings. MongoDB keeps the
unique multikey index ``{sensor_id, readings.ts}`` up to date by generating the index keys
of the whole old and the whole new document and writing the difference, so the server's
work per write grows with n, on top of rewriting the document. This measures it: one
reading at a time into empty documents until they hold ``--cap`` readings, through the
daemon's own writer, and reports the write time by how full the document was.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pymongo import AsyncMongoClient

from ingest.model import Reading
from ingest.store.schema import Schema
from ingest.store.writers.bucket import BucketWriter

if TYPE_CHECKING:
    import argparse

SPAN = 86_400  # one document per sensor-day: the cap, not the span, ends a document


@dataclass(frozen=True, slots=True)
class Band:
    """Write times while documents held ``low``..``high`` - 1 readings."""

    low: int
    high: int
    writes: int
    median_ms: float
    p90_ms: float


async def measure(uri: str, db_name: str, cap: int, sensors: int, bands: int) -> list[Band]:
    """Fill ``sensors`` documents to ``cap`` one reading at a time; time each write."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, tz_aware=True)
    try:
        db = client[db_name]
        await db.drop_collection("buckets")
        schema = Schema(
            db,
            "buckets",
            rejects_collection="rejects",
            rejects_max_bytes=1 << 20,
            retention_days=None,
            span_seconds=SPAN,
        )
        writer = BucketWriter(db.buckets, schema, SPAN, cap)
        await writer.ensure_schema()
        start = time.time() // SPAN * SPAN - SPAN
        times: list[list[float]] = [[] for _ in range(cap)]
        for n in range(cap):
            for sensor in range(sensors):
                epoch = start + n
                reading = Reading(
                    f"fill{sensor}", datetime.fromtimestamp(epoch, UTC), epoch, {"v": float(n)}, n
                )
                plan = writer.plan([reading])
                began = time.perf_counter()
                outcome = await writer.write(plan)
                times[n].append(time.perf_counter() - began)
                if outcome.written != 1:
                    raise RuntimeError(f"write {n} of sensor {sensor} was not stored")
        return summarise(times, bands)
    finally:
        await client.drop_database(db_name)
        await client.close()


def summarise(times: list[list[float]], bands: int) -> list[Band]:
    """Median and 90th percentile write time per band of document fill."""
    cap = len(times)
    edges = sorted({round(cap * i / bands) for i in range(bands + 1)})
    out = []
    for low, high in itertools.pairwise(edges):
        sample = sorted(t for n in range(low, high) for t in times[n])
        if not sample:
            continue
        p90 = sample[min(len(sample) - 1, int(len(sample) * 0.9))]
        out.append(Band(low, high, len(sample), statistics.median(sample) * 1000, p90 * 1000))
    return out


def render(bands: list[Band], as_json: bool) -> str:
    """The table (Markdown) or JSON of the bands."""
    if as_json:
        return json.dumps(
            [
                {
                    "low": b.low,
                    "high": b.high,
                    "writes": b.writes,
                    "median_ms": round(b.median_ms, 3),
                    "p90_ms": round(b.p90_ms, 3),
                }
                for b in bands
            ]
        )
    lines = [
        "| readings already in the document | writes | median ms | p90 ms |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {b.low}-{b.high - 1} | {b.writes} | {b.median_ms:.3f} | {b.p90_ms:.3f} |" for b in bands
    ]
    return "\n".join(lines)


def cmd_bucket_fill(args: argparse.Namespace) -> int:
    """``loadgen bucket-fill``: print write time against document fill."""
    bands = asyncio.run(measure(args.mongodb_uri, args.db, args.cap, args.sensors, args.bands))
    print(render(bands, args.json))  # noqa: T201 - the command's output
    return 0

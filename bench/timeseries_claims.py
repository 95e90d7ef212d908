"""Time-series mode's write path with and without claims, against ``fakemongo``.

Decodes ``bench.e2e``'s backlog (1,000 sensors, 1 reading a message) into batches of
``--readings`` readings, each batch at new instants, and writes them with
:class:`TimeseriesWriter` to ``fakemongo`` (the C sink that answers at once: what is
measured is the daemon's side of the write, the server's work is not in it): the lookup,
then the claims (their documents, their insert) and the insert, or the lookup and the
insert alone (``claims=False``). Rounds alternate between the two; prints the best
round's CPU and wall time per reading of each, and their difference.

    .venv/bin/python -m bench.timeseries_claims --readings 10000 --batches 10 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import subprocess
import time
from typing import TYPE_CHECKING, Any

import bson
from bson.datetime_ms import DatetimeMS
from pymongo import AsyncMongoClient

from bench.e2e import tools
from bench.timeseries_plan import messages
from ingest.pipeline.app import GC_THRESHOLD
from ingest.store.schema import Schema
from ingest.store.writers.claims import claim_ids
from ingest.store.writers.timeseries import TimeseriesWriter

if TYPE_CHECKING:
    from ingest.model import Reading


def batches(count: int, size: int) -> list[list[Reading]]:
    """``count`` batches of ``size`` readings of 1,000 sensors, each at new instants."""
    readings = [r for _, decoded in messages(1, size) for r in decoded]
    step = 3_600_000  # an hour later per batch: no instant is written twice
    return [
        [r._replace(ms=(r.ms or 0) - (count - k) * step, when=None) for r in readings]
        for k in range(count)
    ]


async def measure(uri: str, work: list[list[Reading]], claims: bool) -> tuple[float, float]:
    """CPU and wall seconds of writing ``work`` (a fresh database each time)."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, tz_aware=True)
    try:
        db = client[f"bench_{time.monotonic_ns()}"]
        schema = Schema(
            db,
            "readings",
            rejects_collection="rejects",
            rejects_max_bytes=1 << 20,
            retention_days=None,
            span_seconds=3600,
        )
        writer = TimeseriesWriter(db.readings, schema, "bench", claims=claims)
        await writer.ensure_schema()
        await writer.write(writer.plan(work[0][:10]))  # connections warm
        cpu, wall = time.process_time(), time.perf_counter()
        for batch in work:
            outcome = await writer.write(writer.plan(batch))
            assert outcome.written == len(batch), outcome
        return time.process_time() - cpu, time.perf_counter() - wall
    finally:
        await client.close()


def bytes_per_reading(batch: list[Reading], owner: str) -> tuple[float, float]:
    """BSON bytes a reading of the readings' documents and of the claims."""
    writer = TimeseriesWriter(None, None)  # type: ignore[arg-type]  # plans only
    plan = writer.plan(batch)
    docs = sum(len(bson.encode(doc)) if isinstance(doc, dict) else len(doc.raw) for doc in plan.ops)
    at = DatetimeMS(time.time_ns() // 1_000_000)
    claims = sum(
        len(bson.encode({"_id": key, "at": at, "by": owner, "f": r.values}))
        for key, r in zip(claim_ids(batch), batch, strict=True)
    )
    return docs / len(batch), claims / len(batch)


def main() -> None:
    """Parse the arguments, run the rounds, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readings", type=int, default=10_000, help="readings per batch")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])  # as the daemon sets it
    work = batches(args.batches, args.readings)
    total = args.batches * args.readings
    sink = subprocess.Popen(
        [str(tools()["fakemongo"]), "-p", "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert sink.stdout is not None
        uri = sink.stdout.readline().strip()
        best = {False: (float("inf"), float("inf")), True: (float("inf"), float("inf"))}
        for n in range(args.rounds):
            for claims in (False, True) if n % 2 == 0 else (True, False):
                cpu, wall = asyncio.run(measure(uri, work, claims))
                best[claims] = min(best[claims], (cpu, wall))
    finally:
        sink.terminate()
        sink.wait()
    print(f"{args.batches} batches of {args.readings} readings, best of {args.rounds} rounds")
    print("| write path | CPU µs/reading | wall µs/reading |")
    print("|---|---|---|")
    for claims, label in ((False, "lookup, insert"), (True, "lookup, claims, insert")):
        cpu, wall = best[claims]
        print(f"| {label} | {cpu / total * 1e6:.2f} | {wall / total * 1e6:.2f} |")
    docs, claims_bytes = bytes_per_reading(work[0], "ingest-timeseries-host1-w1")
    print(f"BSON bytes a reading: {docs:.0f} in its document, {claims_bytes:.0f} in its claim")
    extra = (best[True][0] - best[False][0]) / total * 1e6
    print(
        f"claims: +{extra:.2f} µs CPU a reading "
        f"({best[True][0] / best[False][0] - 1:+.0%} of the write path)"
    )


if __name__ == "__main__":
    main()

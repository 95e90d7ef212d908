"""A fleet-day of readings, the database it is stored in, and the command line around them.

What the read benchmarks share (bench.api, bench.promql): the readings, both layouts'
writers, the MongoDB (the one given, or the mongoeco emulator started here), and the
arguments and report head of their command lines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pymongo import AsyncMongoClient

from ingest.model import Reading, Scalar
from ingest.store.schema import Schema
from ingest.store.writers.bucket import BucketWriter, ts_key
from ingest.store.writers.timeseries import TimeseriesWriter
from tests.support.procs import start_emulator, stop_emulator

if TYPE_CHECKING:
    import subprocess
    from collections.abc import AsyncIterator, Callable, Coroutine

    from pymongo.asynchronous.database import AsyncDatabase

DAY = datetime(2026, 5, 1, tzinfo=UTC)
SPAN = 3600  # the daemon's default bucket span (--bucket-span-seconds)
MAX_READINGS = 3600  # and --bucket-max-readings
COLLECTIONS = {"bucket": "buckets", "timeseries": "readings"}


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


def writers(db: AsyncDatabase[dict[str, Any]]) -> dict[str, BucketWriter | TimeseriesWriter]:
    """Both layouts' writers, as the daemon makes them with its defaults."""

    def schema(name: str) -> Schema:
        return Schema(
            db,
            name,
            rejects_collection="rejects",
            rejects_max_bytes=1 << 20,
            retention_days=None,
            span_seconds=SPAN,
        )

    bucket, timeseries = COLLECTIONS["bucket"], COLLECTIONS["timeseries"]
    return {
        "bucket": BucketWriter(db[bucket], schema(bucket), SPAN, MAX_READINGS),
        "timeseries": TimeseriesWriter(db[timeseries], schema(timeseries)),
    }


@dataclass
class Store:
    """The benchmark's database, and the emulator serving it (None: a MongoDB given)."""

    db: AsyncDatabase[dict[str, Any]]
    emulator: subprocess.Popen[str] | None

    @property
    def client(self) -> AsyncMongoClient[dict[str, Any]]:
        """The database's client."""
        return self.db.client


@contextlib.asynccontextmanager
async def store(uri: str | None, prefix: str) -> AsyncIterator[Store]:
    """A new database on ``uri``, dropped at the end (None: on the emulator, started here)."""
    emulator = None
    if uri is None:
        emulator, uri = start_emulator(loads=True)
    # a long timeout: the emulator answers one request at a time, and a busy machine can
    # hold one past the default 20 s (the driver's monitor would then reset the pool)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        uri, tz_aware=True, connectTimeoutMS=300_000, socketTimeoutMS=300_000
    )
    name = f"{prefix}_{int(time.time())}"
    try:
        yield Store(client[name], emulator)
    finally:
        try:
            if emulator is None:  # the emulator's data goes with it
                await client.drop_database(name)
        finally:
            await client.close()
            if emulator is not None:
                stop_emulator(emulator)


def parser(doc: str, sensors: int) -> argparse.ArgumentParser:
    """The arguments every read benchmark takes; ``doc``: the module's docstring."""
    out = argparse.ArgumentParser(
        description=doc.split("\n", 1)[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    out.add_argument("--sensors", type=int, default=sensors)
    out.add_argument("--hours", type=int, default=24)
    out.add_argument("--interval", type=int, default=300, help="seconds between readings")
    out.add_argument("--mongodb-uri", help="default: the mongoeco emulator")
    out.add_argument("--seed", type=int, default=1)
    out.add_argument("--json", action="store_true", help="print the result as JSON")
    return out


def head(module: str, args: argparse.Namespace, readings: int) -> dict[str, Any]:
    """The first fields of a report: the command, the MongoDB and the data."""
    return {
        "command": " ".join(["python", "-m", module, *sys.argv[1:]]),
        "mongodb": "emulator" if args.mongodb_uri is None else "given",
        "readings": readings,
        "sensors": args.sensors,
        "hours": args.hours,
        "interval": args.interval,
    }


def main(
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]],
    table: Callable[[dict[str, Any]], None],
) -> None:
    """Run a benchmark; print its report as JSON (``--json``) or as ``table`` prints it."""
    report = asyncio.run(run(args))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        table(report)

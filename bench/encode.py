"""CPU cost of the write side per reading: plan() plus BSON encoding of what is sent.

No server is involved: this is the daemon's own share of a write (pymongo encodes a
bulk with the same C BSON encoder). bench.e2e measures the whole path (MQTT receive,
decode, batch, encode, send to a MongoDB sink, ack) as the CPU per reading of a process.

    .venv/bin/python -m bench.encode --readings 200000
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import bson

from ingest.model import Reading
from ingest.store.writers.bucket import BucketWriter, ts_key
from ingest.store.writers.timeseries import TimeseriesWriter

if TYPE_CHECKING:
    from collections.abc import Callable

    from ingest.store.writers import Plan, Writer

NO_DB: Any = None
T0 = 1_790_000_000 // 3600 * 3600


def readings(total: int, sensors: int) -> list[Reading]:
    out = []
    for i in range(total):
        epoch = T0 + i // sensors + (i % 1000) / 1000
        ts = datetime.fromtimestamp(epoch, UTC)  # whole milliseconds, as decode makes them
        out.append(
            Reading(
                f"sensor-{i % sensors:06d}",
                ts,
                epoch,
                {"temp": 20.0 + i % 7, "hum": 40 + i % 11},
                i // sensors,
                ts_key(ts),
            )
        )
    return out


def encode_bucket(plan: Plan) -> int:
    return sum(len(bson.encode(op)) for op in plan.ops)  # the update command's statements


def encode_timeseries(plan: Plan) -> int:
    return sum(len(bson.encode(doc)) for doc in plan.ops)


def measure(
    name: str, writer: Writer, encode: Callable[[Plan], int], data: list[Reading], batch: int
) -> None:
    started = time.process_time()
    ops = size = 0
    for i in range(0, len(data), batch):
        plan = writer.plan(data[i : i + batch])
        ops += len(plan.ops)
        size += encode(plan)
    spent = time.process_time() - started
    print(
        f"| {name} | {len(data):,} | {ops / len(data):.2f} | {size / len(data):.0f} | "
        f"{spent / len(data) * 1e6:.1f} | {len(data) / spent:,.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--readings", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=2000)
    args = parser.parse_args()
    bucket = BucketWriter(NO_DB, NO_DB, 3600, 3600)
    series = TimeseriesWriter(NO_DB, NO_DB)
    print(
        "| mode, sensors per batch | readings | ops/reading | BSON bytes/reading | "
        "CPU µs/reading | readings/s per core |"
    )
    print("|---|---|---|---|---|---|")
    for sensors in (args.batch_size, 20):
        data = readings(args.readings, sensors)
        label = "all distinct" if sensors == args.batch_size else f"{sensors} sensors"
        measure(f"bucket, {label}", bucket, encode_bucket, data, args.batch_size)
        measure(f"timeseries, {label}", series, encode_timeseries, data, args.batch_size)


if __name__ == "__main__":
    main()

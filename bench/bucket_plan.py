"""CPU cost of bucket mode's plan (the upsert statements of a batch), both twins side by side.

The batch is what the daemon's decoder makes of ``bench.e2e``'s backlog (1,000 sensors,
readings 1 s apart, ``temp``, ``hum`` and ``seq``): ``--batch`` readings in messages of
``--per-message`` readings. Each round times ``plan_buckets`` of ``_bucket_py`` run as
Python and compiled as ``_bucket_c`` (the order alternates), then the same plus
``bson.encode`` of every statement (the C encoder pymongo uses for the bulk), which calls
each twin's own ``BsonDate.__int__`` for every date. The garbage collector is set as the
daemon sets it; the times are the process's CPU time, which other load on the machine
moves less than the wall clock. Prints the best and the median of the rounds per reading, and
the ratio of the twins; the machine's other load moves the absolute figures, much less
the ratio.

    .venv/bin/python -m bench.bucket_plan --per-message 1,100
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import bson

from bench.e2e import backlog
from ingest.devices.decode import Limits, decode
from ingest.pipeline.app import GC_THRESHOLD
from ingest.store.writers import _bucket_py
from tests.support.twins import compiled_or_none

if TYPE_CHECKING:
    from collections.abc import Callable

    from ingest.model import Reading
    from ingest.store.writers import Plan

SPAN = 3600
MAX_READINGS = 3600


def readings(batch: int, per_message: int, sensors: int) -> list[Reading]:
    """The decoder's readings of the first ``batch // per_message`` backlog messages."""
    with tempfile.TemporaryDirectory() as work:
        lines = Path(work) / "backlog.txt"
        backlog(lines, batch // per_message, per_message, sensors)
        out: list[Reading] = []
        now = time.time()
        for line in lines.read_text().splitlines():
            topic, payload = line.split("\t", 1)
            decoded = decode(topic, payload.encode(), now, Limits())
            assert not decoded.rejections, decoded.rejections
            out.extend(decoded.readings)
    return out


def timed(
    plan: Callable[[list[Reading], int, int], Plan], data: list[Reading], encode: bool
) -> float:
    """CPU seconds for one plan of ``data`` (and the BSON of its statements)."""
    started = time.process_time()
    result = plan(data, SPAN, MAX_READINGS)
    if encode:
        for op in result.ops:
            bson.encode(op)
    del result  # freeing the statements is part of the cost
    return time.process_time() - started


def main() -> None:
    """Print the per-reading cost of both twins for each ``--per-message``."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--per-message", default="1,100")
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--sensors", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    module = compiled_or_none("ingest.store.writers._bucket_c")
    if module is None:
        raise SystemExit(
            "the compiled twin is not built: .venv/bin/python setup.py build_ext --inplace"
        )
    twins = {"python": _bucket_py.plan_buckets, "compiled": module.plan_buckets}
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
    print(
        "| readings/message | what | python µs/reading (best, median) | "
        "compiled µs/reading (best, median) | compiled/python (best) |"
    )
    print("|---|---|---|---|---|")
    for per_message in map(int, args.per_message.split(",")):
        data = readings(args.batch, per_message, args.sensors)
        python = _bucket_py.plan_buckets(data, SPAN, MAX_READINGS)
        fast = module.plan_buckets(data, SPAN, MAX_READINGS)
        # Compiled, a statement's parts are BSON bytes already: compare what is sent.
        assert [bson.encode(op) for op in python.ops] == [bson.encode(op) for op in fast.ops], (
            "the twins disagree"
        )
        for encode in (False, True):
            times: dict[str, list[float]] = {name: [] for name in twins}
            for round_ in range(args.rounds):
                order = list(twins) if round_ % 2 else list(reversed(twins))
                for name in order:
                    gc.collect()
                    times[name].append(timed(twins[name], data, encode) / len(data) * 1e6)
            py, c = times["python"], times["compiled"]
            print(
                f"| {per_message} | {'plan + bson.encode' if encode else 'plan'} | "
                f"{min(py):.2f}, {statistics.median(py):.2f} | "
                f"{min(c):.2f}, {statistics.median(c):.2f} | {min(c) / min(py):.2f} |"
            )


if __name__ == "__main__":
    main()

"""Time-series mode's plan of a batch: the compiled twins against the Python ones.

Decodes ``bench.e2e``'s backlog (1,000 sensors, 1 or 100 readings a message) into one
batch of readings and times, in one process and interleaved, what the writer does to it
before the driver sees it: :meth:`TimeseriesWriter.plan` (sort, documents with their ids,
each sensor's run of times) and its two steps, the plan and the BSON encoding of its
documents (the driver's encoder: the Python twin's dicts, the compiled twin's bytes). The
garbage collector is set as the daemon sets it. Prints the best of ``--rounds`` per
reading, and each compiled time as a ratio of the Python one.

    .venv/bin/python -m bench.timeseries_plan --readings 10000 --rounds 20
"""

from __future__ import annotations

import argparse
import gc
import importlib
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import bson

from bench.e2e import backlog
from ingest.devices.decode import Arrivals, Limits, decode
from ingest.model import Inbound
from ingest.pipeline.app import GC_THRESHOLD
from ingest.store.writers import _timeseries_py, timeseries

if TYPE_CHECKING:
    from collections.abc import Callable

    from ingest.model import Reading


def messages(per_message: int, readings: int) -> list[tuple[Inbound, list[Reading]]]:
    """``bench.e2e``'s backlog for ``readings`` readings, decoded."""
    with tempfile.TemporaryDirectory() as work:
        lines = Path(work) / "backlog.txt"
        backlog(lines, readings // per_message, per_message, 1000)
        text = lines.read_text()
    limits, arrivals, now = Limits(), Arrivals(), time.time()
    out = []
    for line in text.splitlines():
        topic, payload = line.split("\t")
        message = Inbound(topic, payload.encode(), 1, 1, 0, now)
        out.append((message, decode(topic, message.payload, now, limits, None, arrivals).readings))
    return out


def best(fn: Callable[[], Any], rounds: int) -> float:
    """The fastest of ``rounds`` calls, in seconds."""
    fastest = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        fastest = min(fastest, time.perf_counter() - started)
    return fastest


def run(per_message: int, count: int, rounds: int) -> None:
    """Print both twins' cost per reading for one shape of message."""
    taken = messages(per_message, count)
    batch = [reading for _, reading_list in taken for reading in reading_list]
    ordered = _timeseries_py.sorted_readings(batch)
    prefix, start = bytes(9), 0
    twin = importlib.import_module("ingest.store.writers._timeseries_c")
    writer = timeseries.TimeseriesWriter(None, None)  # type: ignore[arg-type]

    def plan_with(sort: Callable[..., Any], build: Callable[..., Any]) -> Callable[[], object]:
        def call() -> object:
            timeseries.sorted_readings, timeseries.batch_documents = sort, build
            return writer.plan(batch)

        return call

    def encoded(plan: Callable[[], Any]) -> Callable[[], object]:
        encode = bson.encode
        return lambda: [encode(doc) for doc in plan().ops]

    cases = {
        "TimeseriesWriter.plan": (
            plan_with(_timeseries_py.sorted_readings, _timeseries_py.batch_documents),
            plan_with(twin.sorted_readings, twin.batch_documents),
        ),
        "  sorted_readings": (
            lambda: _timeseries_py.sorted_readings(batch),
            lambda: twin.sorted_readings(batch),
        ),
        "  batch_documents": (
            lambda: _timeseries_py.batch_documents(ordered, prefix, start),
            lambda: twin.batch_documents(ordered, prefix, start),
        ),
        "plan + BSON encoding": (
            encoded(plan_with(_timeseries_py.sorted_readings, _timeseries_py.batch_documents)),
            encoded(plan_with(twin.sorted_readings, twin.batch_documents)),
        ),
    }
    print(
        f"{per_message} reading(s) a message, {len(batch):,} readings "
        f"(ns per reading: Python, compiled, ratio)"
    )
    saved = timeseries.sorted_readings, timeseries.batch_documents
    try:
        for name, (python, compiled) in cases.items():
            py = cc = float("inf")
            for _ in range(2):  # interleaved: the machine's load falls on both
                py = min(py, best(python, rounds))
                cc = min(cc, best(compiled, rounds))
            print(
                f"  {name:<24} {py / len(batch) * 1e9:7.0f} {cc / len(batch) * 1e9:7.0f}"
                f"   {cc / py:.2f}"
            )
    finally:
        timeseries.sorted_readings, timeseries.batch_documents = saved


def main() -> None:
    """Parse the arguments and run both message shapes."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readings", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-message", default="1,100")
    args = parser.parse_args()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
    for per_message in (int(n) for n in args.per_message.split(",")):
        run(per_message, args.readings, args.rounds)


if __name__ == "__main__":
    main()

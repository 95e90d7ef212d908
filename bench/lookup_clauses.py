"""CPU cost of the clauses of timeseries mode's lookup, both twins side by side.

Before each insert the time-series writer looks up what is stored at the batch's
instants: one ``find`` per 256 sensors, a clause per sensor and its times
(``lookup_clauses`` of ``_timeseries_py``). As Python each clause is a dict the driver
encodes; compiled, its BSON bytes, which the driver copies. Each round times both twins
(the order alternates) building the clauses of a batch and ``bson.encode`` of each
``find`` command's filter as the driver sends it, for two batches of 10,000 readings:
single readings of 10,000 sensors (a large fleet) and ten readings each of 1,000. The
times are the process's CPU time; prints the best and the median per reading.

    .venv/bin/python -m bench.lookup_clauses --rounds 15
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import TYPE_CHECKING, Any

import bson

from ingest.store.writers import _timeseries_py
from ingest.store.writers.bucket import bson_date
from ingest.store.writers.timeseries import LOOKUP_SENSORS
from tests.support.twins import compiled_or_none

if TYPE_CHECKING:
    from collections.abc import Callable

T0 = 1_790_000_000_000  # ms
READINGS = 10_000


def runs_of(sensors: int) -> list[tuple[str, list[Any]]]:
    """A plan's lookup of ``READINGS`` readings spread over ``sensors`` sensors."""
    each = READINGS // sensors
    return [
        (f"sensor-{i:06d}", [bson_date(T0 + 1000 * k) for k in range(each)]) for i in range(sensors)
    ]


def cost(
    clauses_of: Callable[[list[tuple[str, list[Any]]]], list[Any]],
    runs: list[tuple[str, list[Any]]],
) -> float:
    """CPU seconds to build the clauses of ``runs`` and encode each find's filter."""
    started = time.process_time()
    clauses = clauses_of(runs)
    for start in range(0, len(clauses), LOOKUP_SENSORS):
        bson.encode({"filter": {"$or": clauses[start : start + LOOKUP_SENSORS]}})
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    twin = compiled_or_none("ingest.store.writers._timeseries_c")
    twins: dict[str, Callable[[list[tuple[str, list[Any]]]], list[Any]]] = {
        "dicts (Python)": _timeseries_py.lookup_clauses
    }
    if twin is not None:
        twins["bytes (compiled)"] = twin.lookup_clauses
    print(f"{READINGS:,} readings a batch, {args.rounds} rounds; CPU µs a reading, best / median")
    print("| readings | " + " | ".join(twins) + " |")
    print("|---|" + "---|" * len(twins))
    for sensors, label in (
        (10_000, "10,000 sensors, one reading each"),
        (1_000, "1,000 sensors, ten readings each"),
    ):
        runs = runs_of(sensors)
        times: dict[str, list[float]] = {name: [] for name in twins}
        order = list(twins)
        for _ in range(args.rounds):
            for name in order:
                times[name].append(cost(twins[name], runs) / READINGS * 1e6)
            order.reverse()
        cells = [f"{min(t):.2f} / {statistics.median(t):.2f}" for t in times.values()]
        print(f"| {label} | " + " | ".join(cells) + " |")
    if twin is None:
        print("the compiled twin is not built: Python only")


if __name__ == "__main__":
    main()

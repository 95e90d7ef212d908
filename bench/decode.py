"""CPU cost of the default format's decoder per reading: decode_py and its compiled twin.

Both twins decode the same payloads (bench.e2e's: ``ts``, ``seq``, two measurements) in
interleaved rounds on one core; the best round of each is printed, in ns per reading, and
their ratio. The machine's other load moves both alike, so the ratio is the figure to read.
``orjson.loads`` alone, the parse both twins start with, is the floor.

    .venv/bin/python -m bench.decode --rounds 7
"""

from __future__ import annotations

import argparse
import importlib
import time
from typing import TYPE_CHECKING

import orjson

from ingest.devices._decode_py import decode as decode_py
from ingest.devices.decode import ARRIVALS, Arrivals, Limits

if TYPE_CHECKING:
    from collections.abc import Callable

    from ingest.model import Decoded

    Decode = Callable[[str, bytes, float, Limits, str | None, Arrivals | None], Decoded]
    # What is timed: a twin, or the parse alone (its result is not read).
    Timed = Callable[[str, bytes, float, Limits, str | None, Arrivals | None], object]

TOPIC = "sensors/s1/readings"


def payloads(start: int) -> dict[str, tuple[bytes, int, Arrivals | None]]:
    """Name -> (payload, readings in it, arrivals given)."""
    items = [
        {"ts": start + i, "seq": i, "temp": 18 + i % 100 / 10, "hum": 40 + i % 30}
        for i in range(100)
    ]
    return {
        "1 reading, int ts": (b'{"ts": %d, "temp": 21.5, "hum": 40}' % start, 1, None),
        "1 reading, ts and seq": (orjson.dumps(items[0]), 1, None),
        "1 reading, float ts": (b'{"ts": %d.25, "temp": 21.5, "hum": 40}' % start, 1, None),
        "1 reading, no ts": (b'{"temp": 21.5, "hum": 40}', 1, ARRIVALS),
        "100 readings, envelope": (orjson.dumps({"readings": items}), 100, None),
        "100 readings, array": (orjson.dumps(items), 100, None),
    }


def parse_only(_topic: str, payload: bytes, *_: object) -> object:
    return orjson.loads(payload)


def seconds(
    decode: Timed, payload: bytes, now: float, arrivals: Arrivals | None, messages: int
) -> float:
    limits = Limits()
    started = time.perf_counter()
    for _ in range(messages):
        decode(TOPIC, payload, now, limits, None, arrivals)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--readings", type=int, default=200_000, help="per round and twin")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    compiled: Decode = importlib.import_module("ingest.devices._decode_c").decode
    timed: tuple[Timed, ...] = (decode_py, compiled, parse_only)
    now = time.time()
    print(
        "| payload | Python ns/reading | compiled ns/reading | Python / compiled | "
        "orjson.loads ns/reading |"
    )
    print("|---|---|---|---|---|")
    for name, (payload, per, arrivals) in payloads(int(now) - 7200).items():
        messages = args.readings // per
        best = [float("inf")] * 3
        for _ in range(args.rounds):
            for twin, decode in enumerate(timed):
                spent = seconds(decode, payload, now, arrivals, messages)
                best[twin] = min(best[twin], spent / (messages * per) * 1e9)
        print(
            f"| {name} | {best[0]:.0f} | {best[1]:.0f} | {best[0] / best[1]:.2f} | {best[2]:.0f} |"
        )


if __name__ == "__main__":
    main()

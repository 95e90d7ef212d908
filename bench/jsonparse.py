"""CPU per message of the json format's parse of LoRaWAN uplinks, compiled scanner against Python.

The uplinks of ``bench.mapping --stream ttn`` and ``--stream chirpstack`` (about 1 KB
each, four values under ``root``) through the uplink rule of the shipped ``ttn`` and
``chirpstack`` presets: ``ingest.devices.formats.json.parse_py`` (the whole payload through
``orjson.loads``) and ``parse_selective`` (the compiled scanner builds only what the rule
reads), in interleaved rounds; the best round of each is kept.

    .venv/bin/python -m bench.jsonparse --rounds 20
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from bench.mapping import STREAMS
from ingest.devices.decode import Limits
from ingest.devices.formats import json
from ingest.devices.rules import load_preset

if TYPE_CHECKING:
    from collections.abc import Callable

    from ingest.devices.formats import Parsed
    from ingest.devices.rules import Rule

    Parse = Callable[[bytes, Rule, dict[str, str], Limits], Parsed]

RULES = {"ttn": "ttn-up", "chirpstack": "chirpstack-up"}


def one_round(
    parse: Parse, lines: list[bytes], rule: Rule, captures: dict[str, str], limits: Limits
) -> float:
    """Seconds per message of one pass over ``lines``."""
    start = time.perf_counter()
    for line in lines:
        parse(line, rule, captures, limits)
    return (time.perf_counter() - start) / len(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--messages", type=int, default=2000)
    args = parser.parse_args()
    twins: dict[str, Parse] = {
        "python": json.parse_py,
        "compiled": json.parse_selective,
    }
    limits = Limits()
    for stream, name in RULES.items():
        lines, _ = STREAMS[stream][0](args.messages, 1000)
        rule = next(r for r in load_preset(stream) if r.name == name)
        captures = dict.fromkeys(rule.captures, "x")
        same = {
            repr(parse(line, rule, captures, limits))
            for line in lines[:1]
            for parse in twins.values()
        }
        if len(same) != 1:
            raise AssertionError(f"the twins differ on {lines[0]!r}")
        times: dict[str, list[float]] = {twin: [] for twin in twins}
        for _ in range(args.rounds):
            for twin, parse in twins.items():
                times[twin].append(one_round(parse, lines, rule, captures, limits))
        python, compiled = min(times["python"]), min(times["compiled"])
        size = sum(map(len, lines)) / len(lines)
        print(
            f"{stream} uplinks ({size:.0f} bytes) through rule {name}, best of "
            f"{args.rounds} rounds of {len(lines)}:"
        )
        print(f"  python   {python * 1e6:6.2f} µs/message")
        print(
            f"  compiled {compiled * 1e6:6.2f} µs/message ({compiled / python:.2f} of python, "
            f"{python / compiled:.1f}x faster)"
        )


if __name__ == "__main__":
    main()

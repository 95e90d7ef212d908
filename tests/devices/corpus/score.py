"""Score ``ingest discover`` on the corpus: its proposal, applied unedited, against the truth.

For each family: the capture goes through discover (everything after the listening,
:func:`ingest.devices.discover.command.finish`), the proposed file and the presets it
recommends are loaded as the daemon loads them, and every captured message is decoded
by the daemon's engine (what ``ingest check`` prints). A value is stored right when its
message gives a reading with that value at the right time (the payload's, or the
arrival) in a series of its own: stored series and measurements are paired one to one
with the truth's (devices and measurements as the vendor has them), by the values they
share, so a device split over several sensor ids (a packet id taken for the device) or
two devices stored as one count as wrong, while names are free.

``python -m tests.devices.corpus.score`` prints the table of docs/onboarding.md.
"""

from __future__ import annotations

import importlib
import io
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ingest.devices.decode import Limits
from ingest.devices.discover.command import finish
from ingest.devices.discover.patterns import Captured
from ingest.devices.mapping import Mapping
from ingest.devices.rules import load_preset, parse
from tests.devices.corpus import FAMILIES, HOUSEKEEPING, Msg, Truth

if TYPE_CHECKING:
    from ingest.model import Reading

NOW = 1_795_927_000.0  # the capture's arrival time (2026-11-29)
type Key = tuple[str, str]  # (series, measurement)


@dataclass
class Score:
    """One family's result."""

    family: str
    values: int = 0
    right: int = 0
    units: int = 0  # series with a documented unit
    units_right: int = 0
    housekeeping: int = 0
    housekeeping_stored: int = 0
    rules: int = 0
    proposal: str = ""
    report: str = ""
    wrong: list[str] = field(default_factory=list)

    def row(self) -> str:
        """The family's line of the table."""

        def pct(a: int, b: int) -> str:
            return f"{a}/{b} ({100 * a // b}%)" if b else "-"

        return (
            f"| {self.family} | {pct(self.right, self.values)} | "
            f"{pct(self.units_right, self.units)} | "
            f"{self.housekeeping_stored} of {self.housekeeping} | {self.rules} |"
        )


def family_messages(name: str, t: float = NOW) -> list[Msg]:
    """The corpus family's capture."""
    module = importlib.import_module(f"tests.devices.corpus.{name}")
    return list(module.messages(t))


def propose(messages: list[Msg], now: float = NOW) -> tuple[str, str]:
    """discover's proposal (stdout) and report (stderr) on the capture."""
    out, err = io.StringIO(), io.StringIO()
    finish([Captured(m.topic, m.payload) for m in messages], [], [], out, err, now)
    return out.getvalue(), err.getvalue()


def mapping_of(proposal: str) -> Mapping:
    """The proposal and the presets it recommends, in the daemon's order."""
    rules = parse(proposal, "proposal") if "[[rule]]" in proposal else []
    for name in re.findall(r"use --preset (\S+) with", proposal):
        rules.extend(load_preset(name))
    return Mapping(rules)


def _series(reading: Reading) -> str:
    tags = ",".join(f"{k}={v}" for k, v in sorted((reading.tags or {}).items()))
    return f"{reading.sensor_id}|{tags}"


def score(name: str, now: float = NOW) -> Score:
    """Discover's proposal for the family, applied unedited, against the truth."""
    messages = family_messages(name, now)
    proposal, report = propose(messages, now)
    result = Score(name, proposal=proposal, report=report)
    result.rules = proposal.count("[[rule]]")
    mapping = mapping_of(proposal)
    limits = Limits(max_past_seconds=100 * 365 * 86400.0)
    stored: list[list[Reading]] = []
    for msg in messages:
        decoded = mapping.decode(msg.topic, msg.payload, now, limits)
        readings = [] if decoded.ignored else list(decoded.decoded.readings)
        stored.append(readings)
        if msg.truth == HOUSEKEEPING:
            result.housekeeping += 1
            if readings:
                result.housekeeping_stored += 1
                result.wrong.append(f"housekeeping stored: {msg.topic}")
    hits = [
        _hits(msg.truth, readings, now) if isinstance(msg.truth, Truth) else []
        for msg, readings in zip(messages, stored, strict=True)
    ]
    devices = _pair(Counter((k[0], s[0].split("|")[0]) for h in hits for k, _, s in h))
    pairs = _pair(
        Counter((k, s) for h in hits for k, _, s in h if devices.get(k[0]) == s[0].split("|")[0])
    )
    units: dict[Key, str] = {}
    for readings in stored:
        for reading in readings:
            for measurement, unit in (reading.units or {}).items():
                units.setdefault((_series(reading), measurement), unit)
    documented: dict[Key, str] = {}
    for msg, found in zip(messages, hits, strict=True):
        if not isinstance(msg.truth, Truth):
            continue
        for measurement in msg.truth.values:
            key = (msg.truth.device, measurement)
            result.values += 1
            if key in pairs and any(k == key and s == pairs[key] for k, _, s in found):
                result.right += 1
            else:
                result.wrong.append(f"value not stored right: {msg.topic} {measurement}")
        for measurement, unit in msg.truth.units.items():
            documented[(msg.truth.device, measurement)] = unit
    result.units = len(documented)
    for key, unit in documented.items():
        got = units.get(pairs[key]) if key in pairs else None
        if got == unit:
            result.units_right += 1
        else:
            result.wrong.append(f"unit of {key[0]} {key[1]}: {got!r}, documented {unit!r}")
    return result


def _pair[T](votes: Counter[tuple[T, T]]) -> dict[T, T]:
    """A one-to-one pairing, the pairs that share the most values first."""
    pairs: dict[T, T] = {}
    taken: set[T] = set()
    for (truth, got), _ in sorted(votes.items(), key=lambda kv: (-kv[1], str(kv[0]))):
        if truth not in pairs and got not in taken:
            pairs[truth] = got
            taken.add(got)
    return pairs


def _hits(truth: Truth, readings: list[Reading], now: float) -> list[tuple[Key, object, Key]]:
    """(truth key, value, stored key) for each truth value a reading stores at its time."""
    # The arrival time: the daemon keeps a sensor's arrival-timed readings a millisecond
    # apart, so a capture's arrivals spread a little.
    want, slack = (now, 1.0) if truth.ts is None else (truth.ts, 0.001)
    out = []
    for reading in readings:
        if abs(reading.ts.timestamp() - want) > slack:
            continue
        for measurement, value in truth.values.items():
            for name, got in reading.values.items():
                if got == value and (type(got) is bool) == (type(value) is bool):
                    out.append(((truth.device, measurement), value, (_series(reading), name)))
    return out


def table(scores: list[Score]) -> str:
    """The score table of docs/onboarding.md."""
    head = (
        "| family | values stored right | units | housekeeping stored | rules |\n"
        "|---|---|---|---|---|"
    )
    total = Score(
        "all",
        sum(s.values for s in scores),
        sum(s.right for s in scores),
        sum(s.units for s in scores),
        sum(s.units_right for s in scores),
        sum(s.housekeeping for s in scores),
        sum(s.housekeeping_stored for s in scores),
        max(s.rules for s in scores),
    )
    rows = [s.row() for s in scores] + [total.row().replace("| all |", "| all (rules: most) |")]
    return "\n".join([head, *rows])


def main() -> None:
    """Print the table, and with -v what each family got wrong."""
    import sys

    scores = [score(name) for name in FAMILIES]
    print(table(scores))
    if "-v" in sys.argv:
        for s in scores:
            print(f"\n## {s.family}\n" + "\n".join(s.wrong[:40]))
            if "-vv" in sys.argv:
                print(s.proposal)


if __name__ == "__main__":
    main()

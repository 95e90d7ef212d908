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
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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
    units_wrong: int = 0  # of those, given a unit other than the documented one
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
            f"{pct(self.units_right, self.units)} | {self.units_wrong} | "
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


type Row = tuple[str, float, dict[str, Any], dict[str, str]]  # series, ts, values, units
type Hit = tuple[Key, Key]  # (truth series, stored series)


def _series(sensor_id: str, tags: dict[str, Any] | None) -> str:
    return sensor_id + "|" + ",".join(f"{k}={v}" for k, v in sorted((tags or {}).items()))


def _row(reading: Reading) -> Row:
    series = _series(reading.sensor_id, reading.tags)
    return series, reading.ts.timestamp(), reading.values, reading.units or {}


def score(name: str, now: float = NOW) -> Score:
    """Discover's proposal for the family, applied unedited, against the truth."""
    messages = family_messages(name, now)
    proposal, report = propose(messages, now)
    mapping = mapping_of(proposal)
    limits = Limits(max_past_seconds=100 * 365 * 86400.0)
    rows: list[list[Row]] = []
    housekeeping = stored = 0
    wrong = []
    for msg in messages:
        decoded = mapping.decode(msg.topic, msg.payload, now, limits)
        readings = [] if decoded.ignored else list(decoded.decoded.readings)
        rows.append([_row(r) for r in readings])
        if msg.truth == HOUSEKEEPING:
            housekeeping += 1
            stored += bool(readings)
            wrong += [f"housekeeping stored: {msg.topic}"] if readings else []
    result = _tally(name, messages, rows, (now, now))
    result.proposal, result.report, result.rules = proposal, report, proposal.count("[[rule]]")
    result.housekeeping, result.housekeeping_stored = housekeeping, stored
    result.wrong = wrong + result.wrong
    return result


def score_rows(
    name: str, messages: list[Msg], rows: list[dict[str, Any]], window: tuple[float, float]
) -> Score:
    """The values and units the daemon stored (``rows``: tests.devices.test_presets'
    ``stored_rows``) against the truth; arrival times within ``window``."""
    every = [
        (_series(r["sensor_id"], r["tags"]), r["ts"].timestamp(), r["values"], r["units"] or {})
        for r in rows
    ]
    return _tally(name, messages, [every] * len(messages), (window[0] - 1, window[1] + 5))


def _tally(
    name: str, messages: list[Msg], rows: list[list[Row]], arrival: tuple[float, float]
) -> Score:
    """Values and units right: ``rows[i]`` the stored readings message i may have made."""
    result = Score(name)
    hits = [
        _hits(m.truth, r, arrival) if isinstance(m.truth, Truth) else []
        for m, r in zip(messages, rows, strict=True)
    ]
    devices = _pair(Counter((k[0], s[0].split("|")[0]) for h in hits for k, s in h))
    pairs = _pair(
        Counter((k, s) for h in hits for k, s in h if devices.get(k[0]) == s[0].split("|")[0])
    )
    units = {(r[0], m): u for rs in rows for r in rs for m, u in r[3].items()}
    documented: dict[Key, str] = {}
    for msg, found in zip(messages, hits, strict=True):
        if not isinstance(msg.truth, Truth):
            continue
        for measurement in msg.truth.values:
            key = (msg.truth.device, measurement)
            result.values += 1
            if key in pairs and (key, pairs[key]) in found:
                result.right += 1
            else:
                result.wrong.append(f"value not stored right: {msg.topic} {measurement}")
        documented.update({(msg.truth.device, m): u for m, u in msg.truth.units.items()})
    result.units = len(documented)
    for key, unit in documented.items():
        got = units.get(pairs[key]) if key in pairs else None
        result.units_right += got == unit
        result.units_wrong += got is not None and got != unit
        if got != unit:
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


def _hits(truth: Truth, rows: list[Row], arrival: tuple[float, float]) -> list[Hit]:
    """(truth series, stored series) for each truth value a row stores at its time.

    The arrival time is a range: the daemon keeps a sensor's arrival-timed readings a
    millisecond apart, and through the broker it is the time of the run.
    """
    low, high = (arrival[0], arrival[1] + 1.0) if truth.ts is None else (truth.ts, truth.ts)
    out = []
    for series, ts, values, _ in rows:
        if not low - 0.001 <= ts <= high + 0.001:
            continue
        for measurement, value in truth.values.items():
            for stored, got in values.items():
                if got == value and (type(got) is bool) == (type(value) is bool):
                    out.append(((truth.device, measurement), (series, stored)))
    return out


def table(scores: list[Score]) -> str:
    """The score table of docs/onboarding.md."""
    head = (
        "| family | values stored right | units | wrong units | housekeeping stored | rules |\n"
        "|---|---|---|---|---|---|"
    )
    total = Score(
        "all",
        sum(s.values for s in scores),
        sum(s.right for s in scores),
        sum(s.units for s in scores),
        sum(s.units_right for s in scores),
        sum(s.units_wrong for s in scores),
        sum(s.housekeeping for s in scores),
        sum(s.housekeeping_stored for s in scores),
        max(s.rules for s in scores),
    )
    rows = [s.row() for s in scores] + [total.row().replace("| all |", "| all (rules: most) |")]
    return "\n".join([head, *rows])


def main() -> None:
    """Print the table, and with -v what each family got wrong."""
    scores = [score(name) for name in FAMILIES]
    sys.stdout.write(table(scores) + "\n")
    if "-v" in sys.argv:
        for s in scores:
            sys.stdout.write(f"\n## {s.family}\n" + "\n".join(s.wrong[:40]) + "\n")
            if "-vv" in sys.argv:
                sys.stdout.write(s.proposal)


if __name__ == "__main__":
    main()

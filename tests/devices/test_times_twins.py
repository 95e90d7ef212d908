"""The time-text twins agree: ``times.text_py`` (``datetime.fromisoformat`` and
``timestamp()``) and the compiled ``_times_c.text``, which reads the common ISO form itself.

Same instant (epoch float to the bit, whole milliseconds) or the same None, for every
format, on ISO times with every field at and beyond its range (leap days, offsets, one to
twelve fraction digits, years 1 to 9999), near-misses of the form (other separators,
whitespace, non-ASCII digits, cut or lengthened) and arbitrary text.
"""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from ingest.devices.formats import times
from tests.support.twins import compiled

twin = compiled("ingest.devices.formats._times_c")

FORMATS = st.sampled_from(times.TIME_FORMATS)


def same(raw: str, fmt: str) -> None:
    """Both twins give the same answer for ``raw`` in ``fmt``, bit for bit."""
    expected = times.text_py(raw, fmt, None)
    got = twin.text(raw, fmt, None)
    assert got == expected, (raw, fmt)
    if got is not None and expected is not None:
        assert type(got[1]) is int
        assert math.copysign(1, got[0]) == math.copysign(1, expected[0])


def _field(draw: st.DrawFn, broken: bool, low: int, high: int, edges: list[int]) -> int:
    """A field in its range, or (``broken``) at and beyond its edges."""
    if broken:
        return draw(st.sampled_from(edges))
    return draw(st.integers(low, high))


@st.composite
def iso_times(draw: st.DrawFn) -> str:
    """ISO times in and around the form the twin reads, at most one field out of range."""
    broken = draw(st.integers(0, 12))  # which field is at or beyond an edge (> 8: none)
    year = _field(draw, broken == 0, 1, 9999, [0, 1, 1684, 1969, 1970, 2255, 9999])
    month = _field(draw, broken == 1, 1, 12, [0, 2, 13, 99])
    day = _field(draw, broken == 2, 1, 28, [0, 29, 30, 31, 32])
    hour = _field(draw, broken == 3, 0, 23, [0, 23, 24, 99])
    minute = _field(draw, broken == 4, 0, 59, [59, 60, 99])
    second = _field(draw, broken == 5, 0, 59, [59, 60, 61])
    fraction = draw(
        st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=9).map(lambda f: "." + f))
    )
    if broken == 6:
        fraction = draw(st.sampled_from(["", ".", ",5", ".1234567890", ".123456789012"]))
    sign = draw(st.sampled_from("+-"))
    zone = draw(
        st.one_of(
            st.just("Z"),
            st.builds(
                lambda h, m: f"{sign}{h:02d}:{m:02d}", st.integers(0, 23), st.integers(0, 59)
            ),
        )
    )
    if broken == 7:
        zone = draw(
            st.sampled_from(
                ["z", "", "+0000", "+05", f"{sign}24:00", f"{sign}23:60", f"{sign}00:00", "Z "]
            )
        )
    sep = draw(st.sampled_from([" ", "t"])) if broken == 8 else "T"
    return (
        f"{year:04d}-{month:02d}-{day:02d}{sep}{hour:02d}:{minute:02d}:{second:02d}{fraction}{zone}"
    )


@given(iso_times(), FORMATS)
def test_iso_times(raw: str, fmt: str) -> None:
    same(raw, fmt)


@given(iso_times(), st.integers(0, 40), st.characters(), FORMATS)
def test_damaged_iso_times(raw: str, at: int, char: str, fmt: str) -> None:
    """One character replaced, inserted or removed, or the text cut."""
    at = min(at, len(raw))
    for damaged in (
        raw[:at] + char + raw[at + 1 :],
        raw[:at] + char + raw[at:],
        raw[:at] + raw[at + 1 :],
        raw[:at],
        f" {raw}",
        f"{raw}\n",
    ):
        same(damaged, fmt)


@given(st.text(max_size=70), FORMATS)
def test_any_text(raw: str, fmt: str) -> None:
    same(raw, fmt)


def test_network_server_times() -> None:
    """The Things Stack's and ChirpStack's nine-digit times, and edges of the range."""
    for raw in (
        "2020-02-12T15:15:45.789585559Z",
        "2026-11-26T22:24:52.928000339+00:00",
        "1969-12-31T23:59:59.9999999Z",
        "2024-02-29T23:59:59.999999-23:59",
        "2100-02-28T00:00:00Z",
        "2000-02-29T12:00:00.5+14:00",
        "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59.999999Z",
        # 2**53 - 1 and 2**53 microseconds either side of the epoch
        "2255-06-05T23:47:34.740991Z",
        "2255-06-05T23:47:34.740992Z",
        "1684-07-28T00:12:25.259009Z",
        "1684-07-28T00:12:25.259008Z",
    ):
        for fmt in ("iso", "auto", "local"):
            same(raw, fmt)
    assert twin.text("2020-02-12T15:15:45.789585559Z", "iso", None) == (
        1581520545.789585,
        1581520545789,
    )


def test_every_edge() -> None:
    """Each field at and beyond each edge of its range, the others in range."""
    zones = ["Z", "z", "", "+0000", "+05", "+00:00", "-00:00", "Z ", "+5:00", "+05:0"] + [
        f"{sign}{h:02d}:{m:02d}" for sign in "+-" for h in (0, 1, 23, 24, 99) for m in (0, 59, 60)
    ]
    fractions = [
        "",
        ".",
        ",5",
        ".0",
        ".5",
        ".999999",
        ".9999995",
        ".123456789",
        ".1234567890",
        ".12345678901",
        ".x",
        ".5x",
    ]
    cases = [f"{y:04d}-06-15T12:30:30.5Z" for y in (0, 1, 2, 1684, 1969, 1970, 2255, 9999)]
    cases += [
        f"{y:04d}-{m:02d}-{d:02d}T00:00:00Z"
        for y in (1900, 2000, 2023, 2024)
        for m in range(14)
        for d in (0, 1, 28, 29, 30, 31, 32)
    ]
    cases += [
        f"2024-06-15T{h:02d}:{mi:02d}:{s:02d}Z"
        for h in (0, 23, 24)
        for mi in (0, 59, 60)
        for s in (0, 59, 60, 61)
    ]
    cases += [f"2024-06-15T12:30:30{f}{z}" for f in fractions for z in zones]
    cases += [f"{sep}".join(("2024-06-15", "12:30:30.5Z")) for sep in ("T", "t", " ", "_", "")]
    for raw in cases:
        for fmt in ("iso", "auto", "local", "epoch_ms"):
            same(raw, fmt)

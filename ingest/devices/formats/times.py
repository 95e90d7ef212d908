"""Time values in the forms devices send: epoch seconds to nanoseconds, ISO-8601, local time.

Every parser returns ``(epoch_seconds, whole_milliseconds)`` or None; the milliseconds are
exact for integer inputs (``1795251600500`` ms is 1795251600.5 s to the millisecond), and
truncated as BSON stores dates for fractional seconds. Nothing here raises for bad input.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from ingest import accel

if TYPE_CHECKING:
    from zoneinfo import ZoneInfo

TIME_FORMATS = ("auto", "epoch_s", "epoch_ms", "epoch_us", "epoch_ns", "iso", "local")
# Digits after the epoch second of each unit.
_DIGITS = {"epoch_s": 0, "epoch_ms": 3, "epoch_us": 6, "epoch_ns": 9}
# The formats that read ISO-8601 text (every other: a number in digits); the compiled
# fast path reads the common form for these only.
ISO_FORMATS = tuple(f for f in TIME_FORMATS if f not in _DIGITS)
# auto: a number below 1e11 is seconds (1e11 s is the year 5138), below 1e14
# milliseconds, below 1e17 microseconds, else nanoseconds.
_AUTO = ((1e11, 0), (1e14, 3), (1e17, 6))
_MAX_TEXT = 64  # longer strings are no timestamp (and not worth parsing)
LIMIT = 60_000_000_000  # seconds either side of the epoch (about year 3871 and year 68)

type Instant = tuple[float, int]


def from_seconds(epoch: float) -> Instant | None:
    """Epoch seconds: the instant and its whole milliseconds, as the default decoder does."""
    if not math.isfinite(epoch) or abs(epoch) > LIMIT:
        return None
    micros = datetime.fromtimestamp(epoch, UTC).microsecond
    seconds = math.floor(epoch)
    if micros < 500_000 and epoch - seconds > 0.5:  # microseconds rounded up to a new second
        seconds += 1
    return epoch, seconds * 1000 + micros // 1000


def from_units(value: float, digits: int) -> Instant | None:
    """A count of 10**-digits seconds since the epoch (int exact, float as it comes)."""
    if type(value) is int:
        if abs(value) > LIMIT * 10**digits:
            return None
        scale = 10**digits
        ms = value * 1000 // scale if digits < 3 else value // (scale // 1000)
        return value / scale, ms
    if not math.isfinite(value):
        return None
    return from_seconds(value / 10**digits)


def number(value: float, fmt: str) -> Instant | None:
    """A numeric time in ``fmt`` (auto: the unit guessed from the magnitude)."""
    digits = _DIGITS.get(fmt)
    if digits is None:  # auto, and numbers given to iso/local
        if not math.isfinite(value):
            return None
        size = abs(value)
        digits = next((d for limit, d in _AUTO if size < limit), 9)
    return from_units(value, digits)


def text_py(raw: str, fmt: str, zone: ZoneInfo | None) -> Instant | None:
    """A time given as text: a number in digits, or ISO-8601 (with an offset unless local)."""
    if len(raw) > _MAX_TEXT:
        return None
    stripped = raw.strip()
    if fmt in _DIGITS or (
        fmt == "auto" and stripped[:1].isdigit() and "-" not in stripped and ":" not in stripped
    ):
        try:
            value: float = int(stripped)
        except ValueError:
            try:
                value = float(stripped)
            except ValueError:
                return None
        return number(value, fmt)
    try:
        parsed = datetime.fromisoformat(stripped)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        if fmt != "local" or zone is None:
            return None
        parsed = parsed.replace(tzinfo=zone)
    try:
        epoch = parsed.timestamp()
    except (OverflowError, ValueError):
        return None
    whole = math.floor(epoch)
    return epoch, whole * 1000 + parsed.microsecond // 1000


# Where built, the kernel _times_c.pyx reads the common ISO form of the ISO_FORMATS
# itself and hands anything else (its "not sure") to text_py.
text = accel.pick(text_py, "ingest.devices.formats._times_c", "text")


def parse(raw: object, fmt: str, zone: ZoneInfo | None) -> Instant | None:
    """Any raw time value (number or text) in ``fmt``; None if it is not one."""
    kind = type(raw)
    if kind is int or kind is float:
        return number(raw, fmt)  # type: ignore[arg-type]
    if kind is str:
        return text(raw, fmt, zone)  # type: ignore[arg-type]
    return None

"""The read API's query parameters: parsed and checked, or one error naming the parameter.

Pure functions over a multi-dict of strings (what aiohttp hands out), so every rule is
unit-testable without a server.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from urllib.parse import unquote_plus

import orjson

from ingest.api.read_queries import Cursor, SeriesKey, from_ms, iso, to_ms
from ingest.model import (
    MAX_TAG_BYTES,
    NAME_PATTERN,
    RESERVED_FIELDS,
    RESERVED_TAGS,
    SENSOR_ID_PATTERN,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

MAX_SENSORS = 100
MAX_MEASUREMENTS = 10
MAX_TAG_PARAMETERS = 20  # tag=key:value selectors in one request
MAX_WINDOW = timedelta(days=31)  # sensors and raw readings: how far one request may scan
MAX_POINTS = 20_000  # series: steps x sensors x measurements in one answer
MAX_SEARCH = 128  # characters of sensors' search text
# The instants a time parameter may name: [EARLIEST, LATEST). With MAX_STEP, a window
# widened to whole steps stays inside what a datetime holds (years 1 to 9999).
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 1, 1, tzinfo=UTC)
MAX_STEP = timedelta(days=365)
# The parameters each endpoint reads (its OpenAPI description, ingest/api/openapi.py, lists
# the same); any other is a 400 naming it.
ENDPOINT_PARAMETERS: dict[str, tuple[str, ...]] = {
    "sensors": ("since", "until", "search", "limit", "cursor"),
    "readings": ("sensor", "tag", "since", "until", "measurement", "limit", "cursor"),
    "series": ("sensor", "tag", "measurement", "since", "until", "step"),
    "rejects": ("since", "limit"),
    "info": (),
}
KNOWN_PARAMETERS = frozenset(p for ps in ENDPOINT_PARAMETERS.values() for p in ps)
LIMITS = {"sensors": (100, 1000), "readings": (1000, 10_000), "rejects": (100, 1000)}
# ASCII digits only: str.isdigit() and a Unicode \d accept digits that int() refuses
# ("²") or reads in another script ("٣").
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d|w)?$", re.ASCII)
_DIGITS = re.compile(r"[0-9]+")
_UNIT_MS = {
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 604_800_000,
    None: 1000,
}
_SENSOR_ID = re.compile(f"^{SENSOR_ID_PATTERN}$")
_TAG_VALUE = re.compile(r"^[^\x00-\x1f\x7f-\x9f]*$")
# Stored next to the measurements, never one of them (time-series documents hold units).
NOT_MEASUREMENT_NAMES = RESERVED_FIELDS | {"tags", "units"}
_NAME = re.compile(f"^{NAME_PATTERN}$")
_TAG_KEY = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # as rules and mappings make them


class ParamError(ValueError):
    """A bad query parameter: answered with 400 and ``{"error": {"parameter", "message"}}``."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter
        self.message = message


class Params:
    """Typed access to one request's query string."""

    def __init__(
        self,
        query: Mapping[str, str],
        values: Callable[[str], Sequence[str]],
        now: datetime,
        known: Iterable[str] = KNOWN_PARAMETERS,
        raw: Callable[[str], Sequence[str]] | None = None,
    ) -> None:
        """A query string's parameters.

        ``values(name)``: the decoded values of a parameter; ``raw(name)``: the same
        values as sent, still percent-encoded (None: the decoded values are the raw ones).
        """
        self._query = query
        self._values = values
        self._raw = raw
        self.now = now
        unknown = sorted(set(query) - set(known))
        if unknown:
            raise ParamError(
                unknown[0], f"unknown parameter (known here: {', '.join(sorted(known))})"
            )

    def one(self, name: str) -> str | None:
        """The single value of ``name`` (None if absent); given twice is an error."""
        values = self._values(name)
        if len(values) > 1:
            raise ParamError(name, "given more than once")
        return values[0] if values else None

    def time(self, name: str, default: datetime) -> datetime:
        """An instant: ISO 8601 with a zone, epoch milliseconds, ``now`` or ``now-<duration>``."""
        text = self.one(name)
        if text is None or text == "":
            return default
        return parse_time(name, text, self.now)

    def window(
        self, default: timedelta, max_window: timedelta | None = MAX_WINDOW
    ) -> tuple[datetime, datetime]:
        """``since`` and ``until`` (default: the last ``default`` up to now)."""
        until = self.time("until", self.now)
        since = self.time("since", until - default)
        if since >= until:
            raise ParamError("since", "must be before until")
        if max_window is not None and until - since > max_window:
            raise ParamError("since", f"the window may span at most {max_window.days} days")
        return since, until

    def names(self, name: str, pattern: re.Pattern[str], most: int, *, required: bool) -> list[str]:
        """A repeatable, comma-separable list of names, in order, without repeats.

        Sensor ids may hold a comma: only a literal comma of the query string separates
        them, a percent-encoded one (``%2C``, as URLSearchParams and urlencode send a
        comma of a value) belongs to the id. Measurement names hold no comma: any
        separates them.
        """
        out: list[str] = []
        for item in self._items(name):
            if name == "measurement":
                item = item.strip()  # noqa: PLW2901
            if not item:
                continue
            reserved = name == "measurement" and item in NOT_MEASUREMENT_NAMES
            if not pattern.match(item) or reserved:
                raise ParamError(name, f"{item[:40]!r} is not a valid {name} name")
            if item not in out:
                out.append(item)
        if required and not out:
            raise ParamError(name, "required (repeat it or separate names by commas)")
        if len(out) > most:
            raise ParamError(name, f"at most {most} per request, got {len(out)}")
        return out

    def _items(self, name: str) -> list[str]:
        """The comma-separated items of every value of ``name`` (see :meth:`names`)."""
        items: list[str] = []
        if name == "sensor" and self._raw is not None:
            for value in self._raw(name):
                items += [unquote_plus(part) for part in value.split(",")]
        else:
            for value in self._values(name):
                items += value.split(",")
        return items

    def sensors(self, *, required: bool = True) -> list[str]:
        """The ``sensor`` list."""
        return self.names("sensor", _SENSOR_ID, MAX_SENSORS, required=required)

    def measurements(self, *, required: bool) -> list[str]:
        """The ``measurement`` list."""
        return self.names("measurement", _NAME, MAX_MEASUREMENTS, required=required)

    def tags(self) -> dict[str, list[str]]:
        """The ``tag`` selectors: ``key:value``, repeatable, never split.

        By key, the values asked for: a series is selected when, for every key given,
        its tag of that key has one of the values given for it.
        """
        values = self._values("tag")
        if len(values) > MAX_TAG_PARAMETERS:
            raise ParamError("tag", f"at most {MAX_TAG_PARAMETERS} per request, got {len(values)}")
        out: dict[str, list[str]] = {}
        for value in values:
            key, colon, wanted = value.partition(":")
            if not colon:
                raise ParamError("tag", f"expects key:value (path:/boot), got {value[:40]!r}")
            if not _TAG_KEY.match(key) or key in RESERVED_TAGS:
                raise ParamError(
                    "tag",
                    f"{key[:40]!r} is not a tag name (letters, digits, "
                    "_ and -, 1 to 64 characters; not "
                    f"{', '.join(sorted(RESERVED_TAGS))})",
                )
            if len(wanted.encode()) > MAX_TAG_BYTES:
                raise ParamError("tag", f"the value of {key} is longer than {MAX_TAG_BYTES} bytes")
            if not _TAG_VALUE.match(wanted):
                raise ParamError("tag", f"the value of {key} holds a control character")
            chosen = out.setdefault(key, [])
            if wanted not in chosen:
                chosen.append(wanted)
        return out

    def search(self) -> str | None:
        """``search``: text a series' sensor id or one of its tags (``key=value``) holds."""
        text = self.one("search")
        if not text:
            return None
        if len(text) > MAX_SEARCH:
            raise ParamError("search", f"at most {MAX_SEARCH} characters, got {len(text)}")
        if not _TAG_VALUE.match(text):
            raise ParamError("search", "holds a control character")
        return text

    def limit(self, default: int, most: int) -> int:
        """``limit``: 1 to ``most``."""
        text = self.one("limit")
        if text is None:
            return default
        digits = text.lstrip("0")  # int() refuses over 4300 digits
        if (
            not _DIGITS.fullmatch(text)
            or len(digits) > len(str(most))
            or not 1 <= int(digits or "0") <= most
        ):
            raise ParamError("limit", f"must be a whole number from 1 to {most}, got {text[:20]!r}")
        return int(digits)

    def step_ms(self, default_ms: int) -> int:
        """``step``: a duration such as ``30s``, ``5m``, ``1h``, ``500ms``; bare: seconds."""
        text = self.one("step")
        if text is None or text == "":
            return default_ms
        ms = parse_duration("step", text)
        if ms > MAX_STEP // timedelta(milliseconds=1):
            raise ParamError("step", f"at most {MAX_STEP.days}d, got {text[:20]!r}")
        return ms

    def cursor(self, kind: str) -> list[object] | None:
        """The decoded ``cursor`` of a previous answer of this endpoint, or None."""
        text = self.one("cursor")
        if not text:
            return None
        try:
            value = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        except (binascii.Error, ValueError):
            raise ParamError("cursor", "not a cursor returned by this API") from None
        if not isinstance(value, list) or not value or value[0] != kind:
            raise ParamError("cursor", "not a cursor returned by this endpoint")
        return value[1:]

    def reading_cursor(self) -> Cursor | None:
        """The cursor of ``/api/readings``: the last series and instant of the previous page."""
        value = self.cursor("r")
        if value is None:
            return None
        match value:
            case [str(sensor), dict(tags), int(ts_ms)] if _whole(
                ts_ms, to_ms(EARLIEST), to_ms(LATEST) - 1
            ):
                return Cursor(_series_key(sensor, tags), ts_ms)
        raise ParamError("cursor", "not a cursor returned by this endpoint")

    def sensor_cursor(self) -> SeriesKey | None:
        """The cursor of ``/api/sensors``: the last series of the previous page."""
        value = self.cursor("s")
        if value is None:
            return None
        match value:
            case [str(sensor), dict(tags)]:
                return _series_key(sensor, tags)
        raise ParamError("cursor", "not a cursor returned by this endpoint")


def _series_key(sensor: str, tags: dict[str, object]) -> SeriesKey:
    """A cursor's series, checked: it goes into a query (tag names as field names)."""
    if not _SENSOR_ID.match(sensor) or not all(
        isinstance(k, str)
        and _TAG_KEY.match(k)
        and k not in RESERVED_TAGS
        and isinstance(v, str)
        and len(v) <= MAX_TAG_BYTES
        for k, v in tags.items()
    ):
        raise ParamError("cursor", "not a cursor returned by this endpoint")
    return SeriesKey(sensor, tuple(sorted((k, str(v)) for k, v in tags.items())))


def _whole(value: int, low: int, high: int) -> bool:
    """Whether a decoded JSON number is a whole number (not a boolean) in ``[low, high]``."""
    return not isinstance(value, bool) and low <= value <= high


def encode_cursor(kind: str, *parts: object) -> str:
    """An opaque, URL-safe cursor."""
    return base64.urlsafe_b64encode(orjson.dumps([kind, *parts])).decode().rstrip("=")


def parse_duration(name: str, text: str) -> int:
    """A duration in whole milliseconds (at least 1)."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise ParamError(
            name, f"expects a duration such as 500ms, 30s, 5m, 1h or 1d, got {text[:20]!r}"
        )
    exact = float(match.group(1)) * _UNIT_MS[match.group(2)]
    if not math.isfinite(exact):
        raise ParamError(name, f"too long, got {text[:20]!r}")
    ms = round(exact)
    if ms < 1:
        raise ParamError(name, "must be at least 1ms")
    return ms


def parse_time(name: str, text: str, now: datetime) -> datetime:
    """An instant: ISO 8601 with a zone, epoch milliseconds, ``now`` or ``now-<duration>``."""
    text = text.strip()
    if text == "now":
        return now
    if text.startswith("now-"):
        return _instant(name, text, to_ms(now) - parse_duration(name, text[4:]))
    if _DIGITS.fullmatch(text):
        # more digits than LATEST has is out of range; int() is not asked (it refuses
        # over 4300 digits)
        digits = text.lstrip("0") or "0"
        ms = int(digits) if len(digits) <= len(str(to_ms(LATEST))) else to_ms(LATEST)
        return _instant(name, text, ms)
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ParamError(
            name,
            "expects ISO 8601 (2026-05-01T08:00:00Z), epoch milliseconds, "
            f"now or now-1h, got {text[:40]!r}",
        ) from None
    if value.tzinfo is None:
        raise ParamError(name, "needs a time zone (Z or +hh:mm)")
    try:
        value = value.astimezone(UTC)
    except OverflowError:  # the first or last hours of years 1 and 9999 in another zone
        raise _out_of_range(name, text) from None
    if not EARLIEST <= value < LATEST:
        raise _out_of_range(name, text)
    return value


def _instant(name: str, text: str, ms: int) -> datetime:
    """Milliseconds since the epoch as an instant, if in range."""
    if not to_ms(EARLIEST) <= ms < to_ms(LATEST):
        raise _out_of_range(name, text)
    return from_ms(ms)


def _out_of_range(name: str, text: str) -> ParamError:
    return ParamError(
        name,
        f"out of range: times from {iso(EARLIEST)} up to (not "
        f"including) {iso(LATEST)}, got {text[:40]!r}",
    )

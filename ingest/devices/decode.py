"""Pure decoding: topic + payload bytes -> accepted readings and counted rejections.

No I/O here. Every problem becomes a :class:`Rejection` with a reason from
:data:`REASONS`; nothing but a rejection ever leaves this module for bad input.
:func:`decode_py` has a compiled twin in ``_decode_c.pyx`` (see ingest/accel.py); the rest
of the package calls :data:`decode`, the one :func:`ingest.accel.pick` chose.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from ingest import accel
from ingest.model import (
    NAME_PATTERN,
    RESERVED_FIELDS,
    SENSOR_ID_PATTERN,
    SENSOR_ID_RULE,
    Decoded,
    Reading,
    Rejection,
    Scalar,
)

# Reasons given when a reading is written, not decoded.
WRITE_REASONS: tuple[str, ...] = (
    "write_rejected",  # MongoDB refused the document (validator, size...)
    "ts_conflict",  # bucket mode: the sensor has a stored reading at that ts, other values
)
# Reasons only the mapping rules give (ingest/devices/mapping.py).
MAPPING_REASONS: tuple[str, ...] = (
    "no_rule",  # mapping rules are configured and none matches the topic
    "bad_tag_name",  # a payload's tag without a name of its own once made safe
)
# Reasons given after decoding, whatever the format (ingest/devices/identity.py).
IDENTITY_REASONS: tuple[str, ...] = (
    "sensor_id_mismatch",  # --sensor-id-from-topic: the payload names another sensor
)
# Every reason a reading can be rejected for; metrics initialise one series per reason.
REASONS: tuple[str, ...] = (
    "too_large",  # payload above --max-message-bytes, refused before parsing
    "invalid_utf8",  # payload is not UTF-8
    "invalid_json",  # not JSON, nested too deep, or NaN/Infinity literals
    "bad_shape",  # JSON that is not a reading object, an array, or an envelope
    "no_readings",  # an empty array or envelope
    "too_many_readings",  # more readings in one message than --max-readings-per-message
    "no_sensor_id",  # neither the payload nor the topic names a sensor
    "bad_sensor_id",  # sensor id not matching the allowed pattern
    "bad_field_name",  # a key that could address a MongoDB operator or path
    "bad_value",  # a measurement that is not a number (strings, booleans, null...)
    "bad_timestamp",  # ts that is not epoch seconds or ISO-8601 with an offset
    "ts_out_of_window",  # ts too far in the past or the future
    "bad_seq",  # seq that is not a non-negative 64-bit integer
    "no_measurements",  # a reading with no numeric measurement
    *MAPPING_REASONS,
    *IDENTITY_REASONS,
    *WRITE_REASONS,
)

# Beyond this a bucket's running sum (stats.<m>.sum, at most ~160,000 readings of a
# document) could overflow to infinity; no sensor measures anything this large. The one
# bound for every path: the default format here, every mapping format in ingest.devices.mapping.
MAX_MAGNITUDE = 1e300
BEYOND_MAGNITUDE = "not a finite number within ±1e300"  # the bad_value detail
_NAME = re.compile(NAME_PATTERN)
_SENSOR_ID = re.compile(SENSOR_ID_PATTERN)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# Doubles within this magnitude take the fast check (the others: the full one).
_INT64_RANGE = float(2**63)
# Names and ids already checked against their pattern (bounded, so hostile input cannot
# grow them without limit); a set lookup is much cheaper than a regex match.
_CACHE_LIMIT = 100_000
_valid_names: set[str] = set()
_valid_sensors: set[str] = set()
# Building a Reading through tuple.__new__ skips the NamedTuple's argument handling, the
# larger part of its cost on the hot path (tags and units are None here).
_new = tuple.__new__


class Arrivals:
    """Arrival times for readings without their own: one instant per reading.

    A reading without a time takes its arrival time, in milliseconds, but never one at
    or before the last arrival time given to its sensor: several such readings of one
    sensor (in one message, or in a burst of messages within a millisecond, as devices
    that publish each value as its own message send) are timed apart, a millisecond
    each, in the order they came, instead of meeting at one instant. Worker ``slot`` of
    ``stride`` workers gives only milliseconds == slot (mod stride), so two workers never
    give one sensor the same one. The daemon's default format uses the process's
    :data:`ARRIVALS`; each set of mapping rules has its own.

    ``given``, when a list, receives every time given, in order: the pipeline records a
    message's times so that a redelivery can take them again (:class:`Replayed`).
    """

    __slots__ = ("_last", "_slot", "_stride", "given")

    def __init__(self) -> None:
        self._last: dict[str, int] = {}  # sensor -> last arrival time given, in ms
        self._slot, self._stride = 0, 1
        self.given: list[int] | None = None

    def spread(self, slot: int, stride: int) -> None:
        """Give only milliseconds == ``slot`` (mod ``stride``): worker ``slot`` of ``stride``."""
        self._slot, self._stride = slot, stride

    def next(self, sensor: str, ms: int) -> int:
        """The arrival time to give a reading of ``sensor`` that arrived at ``ms``."""
        last = self._last.get(sensor)
        if last is not None and ms <= last:
            ms = last + 1
        elif len(self._last) >= _CACHE_LIMIT:
            self._last.clear()
        if self._stride > 1:
            ms += (self._slot - ms) % self._stride
        self._last[sensor] = ms
        given = self.given
        if given is not None:
            given.append(ms)
        return ms


class Replayed(Arrivals):
    """The times a message's first delivery gave its readings, given again in order.

    For the redelivery of a message whose times were recorded: decoded from the same
    payload, it asks for as many, in the same order (past them, not expected, it gives
    arrival times as :class:`Arrivals` does).
    """

    __slots__ = ("_at", "_times")

    def __init__(self, times: tuple[int, ...], given: list[int] | None) -> None:
        super().__init__()
        self._times, self._at = times, 0
        self.given = given

    def next(self, sensor: str, ms: int) -> int:
        """The next recorded time; past the recorded ones, an arrival time as usual."""
        if self._at >= len(self._times):
            return super().next(sensor, ms)
        ms = self._times[self._at]
        self._at += 1
        if self.given is not None:
            self.given.append(ms)
        return ms


# This process's arrival times for the default format.
ARRIVALS = Arrivals()


@dataclass(frozen=True, slots=True)
class Limits:
    """What the decoder accepts; built from the settings."""

    max_message_bytes: int = 1024 * 1024
    max_readings: int = 10_000
    max_past_seconds: float = 365 * 86400.0
    max_future_seconds: float = 600.0


def sensor_from_topic(topic: str) -> str | None:
    """Return the topic level after the first (``sensors/abc/readings`` -> ``abc``)."""
    parts = topic.split("/", 2)
    return parts[1] if len(parts) > 1 and parts[1] else None


def decode_py(
    topic: str,
    payload: bytes,
    received_at: float,
    limits: Limits,
    sensor: str | None = None,
    arrivals: Arrivals | None = None,
) -> Decoded:
    """Turn one MQTT message into readings and rejections; never raises for bad input.

    ``sensor`` (a mapping rule's sensor id) replaces the one taken from the topic.
    ``arrivals``: readings without a time take their sensor's next arrival millisecond
    from it (the daemon's); without it they all take ``received_at``.
    """
    if len(payload) > limits.max_message_bytes:
        return _whole("too_large", f"{len(payload)} bytes > {limits.max_message_bytes}")
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        return _whole(_json_reason(payload), str(exc).split("\n", 1)[0][:200])
    default_sensor: object = sensor_from_topic(topic) if sensor is None else sensor
    window = (received_at - limits.max_past_seconds, received_at + limits.max_future_seconds)
    if type(doc) is dict and "readings" not in doc and limits.max_readings > 0:
        # One reading object, the most common message: no list of items to go through.
        result = _reading(doc, default_sensor, received_at, window, arrivals)
        if isinstance(result, Reading):  # Decoded(...) without its Python-level __new__
            return _new(Decoded, ([result], []))
        return Decoded([], [Rejection(*result)])
    items: Any
    if type(doc) is dict and "readings" in doc:
        items = doc["readings"]
        if "sensor_id" in doc:
            default_sensor = doc["sensor_id"]
        extra = doc.keys() - {"readings", "sensor_id"}
        if extra:
            return _whole("bad_shape", f"unexpected envelope keys: {_names(extra)}")
        if type(items) is not list:
            return _whole("bad_shape", "'readings' must be an array")
    elif type(doc) is list:
        items = doc
    elif type(doc) is dict:
        items = (doc,)
    else:
        return _whole("bad_shape", f"expected an object or array, got {type(doc).__name__}")
    if not items:
        return _whole("no_readings", "no readings in message")
    if len(items) > limits.max_readings:
        return _whole("too_many_readings", f"{len(items)} readings > {limits.max_readings}")
    out = Decoded([], [])
    for index, item in enumerate(items):
        result = _reading(item, default_sensor, received_at, window, arrivals)
        if isinstance(result, Reading):
            out.readings.append(result)
        else:
            reason, detail = result
            out.rejections.append(Rejection(reason, detail, index if len(items) > 1 else None))
    return out


def _whole(reason: str, detail: str) -> Decoded:
    return Decoded([], [Rejection(reason, detail)])


def _json_reason(payload: bytes) -> str:
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        return "invalid_utf8"
    return "invalid_json"


def _names(keys: Any) -> str:  # noqa: ANN401 - any iterable of keys
    return ", ".join(sorted(repr(k[:40]) for k in keys)[:5])


def _reading(
    item: object,
    default_sensor: object,
    now: float,
    window: tuple[float, float],
    arrivals: Arrivals | None,
) -> Reading | tuple[str, str]:
    """Validate one reading object; return it or ``(reason, detail)``.

    The object is the decoder's own (fresh from orjson): its reserved keys are popped
    and what is left becomes the reading's ``values``, with no copy.
    """
    if type(item) is not dict:
        return "bad_shape", f"a reading must be an object, got {type(item).__name__}"
    sensor = item.pop("sensor_id", default_sensor)
    if sensor is None:
        return "no_sensor_id", "no sensor_id in payload or topic"
    if type(sensor) is not str:
        return "bad_sensor_id", f"sensor_id must be a string of {SENSOR_ID_RULE}"
    if sensor not in _valid_sensors:
        if not _SENSOR_ID.fullmatch(sensor):
            return "bad_sensor_id", f"sensor_id {sensor[:60]!r}: {SENSOR_ID_RULE}"
        if len(_valid_sensors) < _CACHE_LIMIT:
            _valid_sensors.add(sensor)
    raw = item.pop("ts", None)
    whole: int | None = None
    epoch: float | None
    if raw is None and arrivals is not None:  # timed at its sensor's next arrival ms
        ms = arrivals.next(sensor, math.floor(now * 1000))
        seq = item.pop("seq", None)
        if seq is not None and (type(seq) is not int or not 0 <= seq <= _INT64_MAX):
            return "bad_seq", "seq must be a non-negative integer"
        checked = _values(item)
        if isinstance(checked, tuple):
            return checked
        return _new(Reading, (sensor, None, ms / 1000, checked, seq, ms, None, None, None))
    if type(raw) is int:  # whole epoch seconds, the usual case: no call, no rounding
        whole = raw
        epoch = float(raw)
    else:
        epoch = _epoch(raw, now)
    if epoch is None:
        return "bad_timestamp", "ts must be epoch seconds or ISO-8601 with an offset"
    if not window[0] <= epoch <= window[1]:
        return "ts_out_of_window", f"ts {epoch:.3f} outside the accepted window"
    seq = item.pop("seq", None)
    if seq is not None and (type(seq) is not int or not 0 <= seq <= _INT64_MAX):
        return "bad_seq", "seq must be a non-negative integer"
    values: dict[str, Scalar] = item
    # The usual case, checked with the least work: names seen before (reserved names
    # never enter that set), finite numbers within the 64-bit integer range.
    if item and _valid_names.issuperset(item):
        for value in item.values():
            kind = type(value)
            if kind is float:
                if not -_INT64_RANGE <= value <= _INT64_RANGE:  # also false for NaN
                    break
            elif kind is not int or not _INT64_MIN <= value <= _INT64_MAX:
                break
        else:
            if whole is not None:  # _timed's usual case, inline: whole milliseconds
                return _new(
                    Reading, (sensor, None, epoch, values, seq, whole * 1000, None, None, None)
                )
            return _timed(sensor, epoch, whole, values, seq)
    checked = _values(item)
    if isinstance(checked, tuple):
        return checked
    return _timed(sensor, epoch, whole, checked, seq)


def _values(item: dict[str, Any]) -> dict[str, Scalar] | tuple[str, str]:
    """The measurements of a reading object (reserved keys popped), or why not."""
    values: dict[str, Scalar] = {}
    for key, value in item.items():
        if key in RESERVED_FIELDS:
            continue
        if key not in _valid_names:
            if not _NAME.fullmatch(key):
                return "bad_field_name", f"field {key[:40]!r} must match {NAME_PATTERN}"
            if len(_valid_names) < _CACHE_LIMIT:
                _valid_names.add(key)
        kind = type(value)
        if kind is float:
            if not -MAX_MAGNITUDE <= value <= MAX_MAGNITUDE:  # also false for NaN
                return "bad_value", f"{key}: {BEYOND_MAGNITUDE}"
        elif kind is not int:
            return "bad_value", f"{key}: expected a number, got {type(value).__name__}"
        elif not _INT64_MIN <= value <= _INT64_MAX:
            # BSON has no wider integer; orjson already reads integers past 2**64 as
            # doubles, so every integer beyond the signed 64-bit range becomes a double.
            values[key] = float(value)
            continue
        values[key] = value
    if not values:
        return "no_measurements", "no numeric measurement in reading"
    return values


def _timed(
    sensor: str, epoch: float, whole: int | None, values: dict[str, Scalar], seq: int | None
) -> Reading:
    """The reading, its time as BSON will store it (whole milliseconds, floored)."""
    if whole is not None:  # already whole milliseconds
        return _new(Reading, (sensor, None, epoch, values, seq, whole * 1000, None, None, None))
    # The instant MongoDB will store: datetime's microseconds, truncated to milliseconds.
    micros = datetime.fromtimestamp(epoch, UTC).microsecond
    seconds = math.floor(epoch)
    if micros < 500_000 and epoch - seconds > 0.5:  # microseconds rounded up to a new second
        seconds += 1
    return _new(
        Reading,
        (sensor, None, epoch, values, seq, seconds * 1000 + micros // 1000, None, None, None),
    )


def _epoch(raw: object, now: float) -> float | None:
    """Epoch seconds from a number or an ISO-8601 string with an offset; None if invalid."""
    if raw is None:
        return now
    kind = type(raw)
    if kind is int or kind is float:
        value = float(raw)  # type: ignore[arg-type]
        return value if math.isfinite(value) else None
    if kind is str:
        try:
            parsed = datetime.fromisoformat(raw)  # type: ignore[arg-type]
        except ValueError:
            return None
        return parsed.timestamp() if parsed.tzinfo is not None else None
    return None


decode = accel.pick(decode_py, "ingest.devices._decode_c", "decode")

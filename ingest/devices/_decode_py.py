# cython: annotation_typing=False
"""The default format's decoder, the one source of its rules: one message's readings.

Plain Python, run as it is (``decode.decode_py``); setup.py also compiles this file as
``ingest.devices._decode_c``, typed by ``_decode_c.pxd`` (Cython's pure-Python mode), and
ingest/devices/decode.py picks one of the two (:func:`ingest.accel.pick`). Every limit,
rejection reason and detail of the default format is here, once.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from ingest import caches
from ingest.model import (
    NAME_PATTERN,
    RESERVED_FIELDS,
    SENSOR_ID_CONTROLS,
    SENSOR_ID_MAX,
    SENSOR_ID_PATTERN,
    SENSOR_ID_RULE,
    Decoded,
    Reading,
    Rejection,
)

try:
    import cython
except ImportError:  # Cython builds the accelerators; it is not needed to run
    from ingest import _cython_shim as cython

if TYPE_CHECKING:
    from ingest.model import Scalar

    class Limits(Protocol):
        """What of decode.Limits the decoder reads."""

        @property
        def max_message_bytes(self) -> int: ...
        @property
        def max_readings(self) -> int: ...
        @property
        def max_past_seconds(self) -> float: ...
        @property
        def max_future_seconds(self) -> float: ...

    class Arrivals(Protocol):
        """What of decode.Arrivals the decoder calls."""

        def next(self, sensor: str, ms: int) -> int: ...


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
# grow them without limit); a set lookup is much cheaper than a regex match. Names: at
# most CACHE_LIMIT; sensor ids, one per sensor: at most ingest.caches.limit.
CACHE_LIMIT = 100_000
# Epoch seconds whose milliseconds _ms_of works out without a datetime (years 68 to 9892).
_FAST_FROM, _FAST_TO = -6e10, 2.5e11
_INF = math.inf
_floor = math.floor  # one name to look up (a C variable when compiled)
# The sensor id rule's bounds (ingest.model), for _sensor_ok (compiled: C integers).
_ID_MAX = SENSOR_ID_MAX
(_C0_FIRST, _C0_LAST), (_C1_FIRST, _C1_LAST) = SENSOR_ID_CONTROLS
_valid_names: set[str] = set()
_valid_sensors: set[str] = set()
_RESERVED = RESERVED_FIELDS
_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError
# The Limits last given and its fields (a Limits is frozen): see _remember.
_known: tuple[object, int, int, float, float] = (None, 0, 0, 0.0, 0.0)
_VALUES = Reading._fields.index("values")  # a reading's values by position
if not cython.compiled:  # compiled: ingest/_capi.pxd's tuple_as and int_float
    # Builds a NamedTuple (Reading, Decoded) without its Python-level __new__, the larger
    # part of its cost on the hot path.
    _new = tuple.__new__
    _int_float = float  # compiled: one C conversion for an int of 64 bits


def sensors_cached() -> int:
    """Sensor ids held as checked (at most ``ingest.caches.limit``)."""
    return len(_valid_sensors)


def _sensor_ok(sensor: str) -> bool:
    """Whether ``sensor`` follows :data:`SENSOR_ID_RULE`, character by character.

    :data:`SENSOR_ID_PATTERN`'s answer, from the same bounds (:data:`SENSOR_ID_MAX`
    characters, none in :data:`SENSOR_ID_CONTROLS`), which the compiled twin gets in C.
    """
    length = len(sensor)
    if not 0 < length <= _ID_MAX:
        return False
    for character in sensor:
        code = ord(character)
        if _C0_FIRST <= code <= _C0_LAST or _C1_FIRST <= code <= _C1_LAST:
            return False
    return True


def value_count(readings: list[Reading]) -> int:
    """The measurements of ``readings`` in all (what they hold, estimated by count)."""
    if not cython.compiled:
        return sum([len(reading.values) for reading in readings])
    # Compiled: each reading's values read by position, in C (ingest/_capi.pxd's
    # checked_tuple, cimported by _decode_c.pxd).
    count = 0
    for reading in readings:
        count += len(_checked_tuple(reading)[_VALUES])  # type: ignore[name-defined]  # noqa: F821
    return count


def sensor_from_topic(topic: str) -> str | None:
    """Return the topic level after the first (``sensors/abc/readings`` -> ``abc``)."""
    if type(topic) is not str:
        raise TypeError(f"a topic is a str, not {type(topic).__name__}")
    text: str = topic
    start = text.find("/") + 1
    if not start:
        return None
    end = text.find("/", start)
    sensor = text[start:end] if end >= 0 else text[start:]
    return sensor or None


def decode(
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
    known = _known
    if known[0] is not limits:
        known = _remember(limits)
    _, max_bytes, max_readings, max_past, max_future = known
    if len(payload) > max_bytes:
        return _whole("too_large", f"{len(payload)} bytes > {max_bytes}")
    try:
        doc = _loads(payload)
    except _JSONDecodeError as exc:
        return _whole(_json_reason(payload), str(exc).split("\n", 1)[0][:200])
    default_sensor: object = sensor_from_topic(topic) if sensor is None else sensor
    earliest, latest = received_at - max_past, received_at + max_future  # the window
    readings: list[Reading]
    rejections: list[Rejection]
    if type(doc) is dict and "readings" not in doc and max_readings > 0:
        # One reading object, the most common message: no list of items to go through.
        result = _reading(doc, default_sensor, received_at, earliest, latest, arrivals)
        if type(result) is not tuple:  # a Reading (a tuple subclass), not (reason, detail)
            readings, rejections = [result], []  # type: ignore[list-item]
        else:
            readings, rejections = [], [Rejection(*result)]
    else:
        readings, rejections = [], []
        decoded = _items(
            doc,
            default_sensor,
            received_at,
            earliest,
            latest,
            max_readings,
            arrivals,
            readings,
            rejections,
        )
        if decoded is not None:
            return decoded
    if not cython.compiled:
        return _new(Decoded, (readings, rejections))
    # The same, filled in place: ingest/_capi.pxd's, cimported by _decode_c.pxd.
    return _tuple_as2(Decoded, readings, rejections)  # type: ignore[name-defined,no-any-return]  # noqa: F821


def _items(
    doc: object,
    default_sensor: object,
    received_at: float,
    earliest: float,
    latest: float,
    max_readings: int,
    arrivals: Arrivals | None,
    readings: list[Reading],
    rejections: list[Rejection],
) -> Decoded | None:
    """Decode a message that is not one reading object into ``readings``, ``rejections``.

    Returns the Decoded of a rejection of the whole message, or None.
    """
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
        items = [doc]
    else:
        return _whole("bad_shape", f"expected an object or array, got {type(doc).__name__}")
    count = len(items)
    if not count:
        return _whole("no_readings", "no readings in message")
    if count > max_readings:
        return _whole("too_many_readings", f"{count} readings > {max_readings}")
    for index in range(count):
        item = items[index]
        result = (
            _reading(item, default_sensor, received_at, earliest, latest, arrivals)
            if type(item) is dict
            else ("bad_shape", f"a reading must be an object, got {type(item).__name__}")
        )
        if type(result) is not tuple:
            readings.append(result)  # type: ignore[arg-type]
        else:
            rejections.append(Rejection(result[0], result[1], index if count > 1 else None))  # type: ignore[arg-type]
    return None


def _remember(limits: Limits) -> tuple[object, int, int, float, float]:
    """The fields of the Limits in use, read once rather than at every message."""
    global _known  # noqa: PLW0603 - a cache: a new one replaces it whole
    _known = (
        limits,
        limits.max_message_bytes,
        limits.max_readings,
        limits.max_past_seconds,
        limits.max_future_seconds,
    )
    return _known


def _whole(reason: str, detail: str) -> Decoded:
    return _new(Decoded, ([], [Rejection(reason, detail)]))


def _json_reason(payload: bytes) -> str:
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        return "invalid_utf8"
    return "invalid_json"


def _names(keys: Any) -> str:  # noqa: ANN401 - any iterable of keys
    return ", ".join(sorted([repr(k[:40]) for k in keys])[:5])


def _reading(
    item: dict[str, Any],
    default_sensor: object,
    now: float,
    earliest: float,
    latest: float,
    arrivals: Arrivals | None,
) -> Reading | tuple[str, str]:
    """Validate one reading object; return it or ``(reason, detail)``.

    The object is the decoder's own (fresh from orjson): its reserved keys are popped
    and what is left becomes the reading's ``values``, with no copy.
    """
    sensor = item.pop("sensor_id", default_sensor)
    if sensor is None:
        return "no_sensor_id", "no sensor_id in payload or topic"
    if type(sensor) is not str:
        return "bad_sensor_id", f"sensor_id must be a string of {SENSOR_ID_RULE}"
    if cython.compiled:
        # The rule's characters checked in C: cheaper than finding the id in a set of a
        # large fleet's ids (a cache miss or two a message), so nothing is cached.
        if not _sensor_ok(sensor):
            return "bad_sensor_id", f"sensor_id {sensor[:60]!r}: {SENSOR_ID_RULE}"
    elif sensor not in _valid_sensors:
        # Not cached yet, or past the cache's bound (a fleet larger than it): the pattern.
        if not _SENSOR_ID.fullmatch(sensor):
            return "bad_sensor_id", f"sensor_id {sensor[:60]!r}: {SENSOR_ID_RULE}"
        if len(_valid_sensors) < caches.limit:  # one per sensor: --max-cached-series
            _valid_sensors.add(sensor)
    raw = item.pop("ts", None)
    whole: int | None = None
    epoch: float | None
    if raw is None and arrivals is not None:  # timed at its sensor's next arrival ms
        epoch = None
        ms = arrivals.next(sensor, _floor(now * 1000))
    elif type(raw) is int:  # whole epoch seconds, the usual case: no call, no rounding
        whole = raw
        epoch = _int_float(raw)
    else:
        epoch = _epoch(raw, now)
        if epoch is None:
            return "bad_timestamp", "ts must be epoch seconds or ISO-8601 with an offset"
    if epoch is not None and not earliest <= epoch <= latest:
        return "ts_out_of_window", f"ts {epoch:.3f} outside the accepted window"
    seq = item.pop("seq", None)
    if seq is not None and (type(seq) is not int or not 0 <= seq <= _INT64_MAX):
        return "bad_seq", "seq must be a non-negative integer"
    values: dict[str, Scalar] | tuple[str, str] = item
    # The usual case, checked with the least work: names seen before (reserved names
    # never enter that set), finite numbers within the 64-bit integer range. Else the
    # full check, which also makes the values dict (the reserved keys left out).
    for key, value in item.items():
        if key not in _valid_names:
            values = _values(item)
            break
        kind = type(value)
        if kind is float:
            number = value  # a C double when compiled
            if not -_INT64_RANGE <= number <= _INT64_RANGE:  # also false for NaN
                values = _values(item)
                break
        elif kind is not int or not _INT64_MIN <= value <= _INT64_MAX:
            values = _values(item)
            break
    else:
        if not item:
            values = _values(item)
    if type(values) is tuple:
        return values
    # The time as BSON will store it: whole milliseconds, floored.
    if epoch is None:
        epoch = ms / 1000
    elif whole is not None:
        # Compiled: ingest/_capi.pxd's int_times, the same product (in C when it fits).
        ms = _int_times(whole, 1000) if cython.compiled else whole * 1000  # type: ignore[name-defined]  # noqa: F821
    else:
        ms = _ms_of(epoch)
    if not cython.compiled:
        return _new(Reading, (sensor, None, epoch, values, seq, ms, None, None, None))
    return _tuple_as9(Reading, sensor, None, epoch, values, seq, ms, None, None, None)  # type: ignore[name-defined,no-any-return]  # noqa: F821


def _values(item: dict[str, Any]) -> dict[str, Scalar] | tuple[str, str]:
    """The measurements of a reading object (reserved keys popped), or why not."""
    values: dict[str, Scalar] = {}
    for key, value in item.items():
        if key in _RESERVED:
            continue
        if key not in _valid_names:
            if not _NAME.fullmatch(key):
                return "bad_field_name", f"field {key[:40]!r} must match {NAME_PATTERN}"
            if len(_valid_names) < CACHE_LIMIT:
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


def _ms_of(epoch: float) -> int:
    """The instant MongoDB will store, in whole milliseconds (floored).

    datetime.fromtimestamp's microseconds (the fraction of a second times 1e6, rounded
    half to even, as CPython's clock functions round), truncated to milliseconds; worked
    out here without building a datetime for the years 68 to 9892, and through one beyond
    them (which also raises where a datetime cannot be made).
    """
    if not _FAST_FROM < epoch < _FAST_TO:
        micros = datetime.fromtimestamp(epoch, UTC).microsecond
        seconds = math.floor(epoch)
        if micros < 500_000 and epoch - seconds > 0.5:  # rounded up to a new second
            seconds += 1
        return seconds * 1000 + micros // 1000
    number = epoch  # a C double when compiled: a float, or an int it holds exactly
    whole = int(number)  # toward zero
    scaled = (number - whole) * 1e6  # the fraction (exact) in microseconds
    micros = int(scaled)
    rest = scaled - micros  # exact; rounded half to even (no call: C when compiled)
    if rest > 0.5 or (rest == 0.5 and micros % 2):
        micros += 1
    elif rest < -0.5 or (rest == -0.5 and micros % 2):
        micros -= 1
    if micros >= 1_000_000:  # rounded up to a new second
        micros -= 1_000_000
        whole += 1
    elif micros < 0:  # before the epoch: the second below, and the micros above it
        micros += 1_000_000
        whole -= 1
    return whole * 1000 + micros // 1000


def _epoch(raw: object, now: float) -> float | None:
    """Epoch seconds from a number or an ISO-8601 string with an offset; None if invalid."""
    if raw is None:
        return now
    kind = type(raw)
    if kind is int or kind is float:
        value = float(raw)  # type: ignore[arg-type]
        return value if -_INF < value < _INF else None  # not for NaN either
    if kind is str:
        try:
            parsed = datetime.fromisoformat(raw)  # type: ignore[arg-type]
        except ValueError:
            return None
        return parsed.timestamp() if parsed.tzinfo is not None else None
    return None

# cython: annotation_typing=False, boundscheck=True, wraparound=True
"""Bucket mode's plan: the upsert statements of a batch, its rules written once.

Run as Python, and compiled by Cython as ``_bucket_c`` with the types of
``_bucket_c.pxd`` (setup.py); :mod:`ingest.store.writers.bucket` picks one (``accel.pick``)
and documents the statements. Both build the same statements: the same dicts in the same
key order, the same value types, the same filters, caps and chunks (tests/store/
test_bucket_twins.py runs them side by side).

The hot loops read a reading's fields by position (``row[VALUES]``): compiled, with the
reading typed as the tuple it is, that is a C-level step where an attribute is a lookup by
name. Three steps plain Python cannot say come from ``ingest/_capi.pxd`` when compiled:
typing a reading as a tuple, making a :class:`BsonDate` (an object and its one slot, as
``object.__new__`` and the slot's setter make them), and Python's ``//`` of two floats (a
C ``floor(a / b)`` is not it).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from operator import attrgetter, eq, floordiv, gt, le, lt
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from bson.codec_options import CodecOptions, DatetimeConversion
from bson.datetime_ms import DatetimeMS
from bson.raw_bson import RawBSONDocument

from ingest.model import Reading
from ingest.store.schema import BUCKET_INDEX
from ingest.store.writers import Plan
from ingest.store.writers.instants import NO_TAGS, TagsKey, merge_series, tags_key

try:
    import cython
except ImportError:  # Cython builds the accelerators; it is not needed to run
    from ingest import _cython_shim as cython

# Compiled, this is cimported (_bucket_c.pxd): the BSON writer kernel
# (ingest/store/writers/_bson_c.pyx).
_bson_c: Any = None

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ingest.store.writers import BsonWriter

    # Cython does not parse ``type`` statements.
    GroupKey: TypeAlias = tuple[str, TagsKey, float]  # noqa: UP040
    # A group of readings of one series and span: sensor id, tags, start, the readings.
    Group: TypeAlias = tuple[str, TagsKey, float, list[Reading]]  # noqa: UP040
    _Template: TypeAlias = Any  # noqa: UP040 - compiled: _bson_c.Template
    _Stats: TypeAlias = tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, str]]  # noqa: UP040

# 2: the series' tags are part of a document's key (``tags``, always present), sensor
# ids are kept exactly, one entry per instant.
SCHEMA_VERSION = 2
# Estimated BSON bytes of one document (its readings, and the statistics and units their
# measurements add): half of MongoDB's 16 MiB limit, so the estimate can be off by 2x and
# an update still fits (the key's tags and info are bounded: 32 of 256 bytes each).
MAX_BUCKET_BYTES = 8 * 1024 * 1024
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_ms_of = attrgetter("ms")
_EMPTY: dict[str, str] = {}  # the tags of a series without any (shared, never changed)
# A reading's fields by position (ingest.model.Reading's order, checked below).
SENSOR_ID: Final = 0
EPOCH: Final = 2
VALUES: Final = 3
SEQ: Final = 4
MS: Final = 5
TAGS: Final = 6
UNITS: Final = 7
INFO: Final = 8
if [Reading._fields[i] for i in (SENSOR_ID, EPOCH, VALUES, SEQ, MS, TAGS, UNITS, INFO)] != [
    "sensor_id",
    "epoch",
    "values",
    "seq",
    "ms",
    "tags",
    "units",
    "info",
]:
    raise ImportError(f"ingest.model.Reading has other fields: {Reading._fields}")
# Spans below this many seconds (ints a float holds exactly) take the compiled floor
# division of floats.
_FLOAT_SPANS = 2**53
# How statements and documents written as bytes decode when read (the driver sends them
# as they are; the lookup before a time-series insert reads ``meta`` and ``ts``): aware
# UTC datetimes, or DatetimeMS beyond their range.
RAW_OPTIONS: CodecOptions[RawBSONDocument] = CodecOptions(
    document_class=RawBSONDocument,
    tz_aware=True,
    tzinfo=UTC,
    datetime_conversion=DatetimeConversion.DATETIME_AUTO,
)
# Compiled: the writer of every batch's statements (one at a time; its buffer kept).
_WRITER: Any = _bson_c.Writer(RAW_OPTIONS) if cython.compiled else None
# The names of an array's elements, as BSON wants them ("0", "1", ...): a group with more
# readings than this is written as a dict.
_INDEX = tuple(str(i) for i in range(4096))
# Fields of a pushed reading that a measurement of that name would overwrite in its dict.
_PUSHED_OWN = frozenset({"ts", "seq"})
# Compiled: a single reading's statement (a large fleet's usual one) is written once per
# shape and recorded as a template (_bson_c.Template), whose slots the writer marks as the
# functions below write them; the next readings of that shape fill its slots (:func:`_templated`).
_S_START: Final = 0  # the bucket's start
_S_NIN: Final = 1  # the reading's time, in the filter
_S_TS: Final = 2  # in the entry pushed
_S_SEQ: Final = 3
_S_FIRST: Final = 4  # $min
_S_LAST: Final = 5  # $max
_S_VALUES: Final = 6  # then four a measurement: pushed, sum, min, max
# Compiled: the templates of the shapes seen (a few per kind of device: a value is an int
# in one reading, a double in the next), about 3 KB each; past 256, they are recorded anew.
_TEMPLATES: Any = _bson_c.Templates(256) if cython.compiled else None
_CAPS: tuple[int, int] = (0, 0)  # the caps of the last template used (part of its key)


def templates_filled() -> int:
    """Single-reading statements filled from a template so far (compiled; 0 as Python)."""
    return _TEMPLATES.filled if cython.compiled else 0


_NAN = float("nan")  # equal to no start
if not cython.compiled:  # compiled: ingest/_capi.pxd's float_floordiv, the same in C
    _floordiv = floordiv
    # Compiled: ingest/_capi.pxd's less, greater, less_equal and equal, which compare two floats
    # or two ints in C (a hot loop takes ``_lt(a, b) if cython.compiled else a < b``).
    _lt, _gt, _le, _eq = lt, gt, le, eq
    _new = object.__new__

    def _fields(reading: Reading) -> Reading:
        """The reading, typed as the tuple it is (compiled: ingest/_capi.pxd's checked_tuple).

        Its fields are then read by position in C. A hot loop takes
        ``_fields(reading) if cython.compiled else reading``: no call as Python.
        """
        return reading


def ts_key(ts: datetime | DatetimeMS) -> int:
    """A timestamp as BSON stores it: whole milliseconds since the epoch (floored)."""
    if isinstance(ts, DatetimeMS):  # a BsonDate of a document built here
        return int(ts)
    if ts.tzinfo is None:  # a client without tz_aware returns naive UTC datetimes
        ts = ts.replace(tzinfo=UTC)
    return (ts - _EPOCH) // _MS


class BsonDate(DatetimeMS):
    """A BSON date (UTC milliseconds) built cheaply; equal to the datetime of that instant.

    pymongo's C encoder spends three times as long on a timezone-aware ``datetime`` (it
    calls ``utcoffset()`` in Python) as on a ``DatetimeMS``, whose own constructor checks
    its argument in Python. The writers make these instead from the milliseconds the
    decoder computed: the encoder writes the same bytes (``int()`` of it, as for any
    ``DatetimeMS``), and it compares equal to the ``datetime`` it stands for.
    """

    __slots__ = ("ms",)
    ms: int

    def __int__(self) -> int:
        # The encoder calls it for every date it writes (compiled: no Python frame).
        return self.ms

    def __eq__(self, other: object) -> bool:
        if isinstance(other, datetime):
            return self.ms == ts_key(other)
        if isinstance(other, DatetimeMS):
            return self.ms == int(other)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash(self.ms)

    def __le__(self, other: DatetimeMS | int) -> bool:
        return self.ms <= int(other)

    def __ge__(self, other: DatetimeMS | int) -> bool:
        return self.ms >= int(other)

    def __lt__(self, other: DatetimeMS | int) -> bool:
        return self.ms < int(other)

    def __gt__(self, other: DatetimeMS | int) -> bool:
        return self.ms > int(other)

    def __repr__(self) -> str:
        return f"BsonDate({self.ms})"

    def timestamp(self) -> float:
        """Seconds since the epoch, as ``datetime.timestamp()`` gives them."""
        return self.ms / 1000

    def as_datetime(self, *_args: object, **_kwargs: object) -> datetime:
        """The instant as an aware UTC datetime."""
        return _EPOCH + self.ms * _MS


if cython.compiled:
    _MS_SLOT = slot_offset(BsonDate, "ms")  # type: ignore[name-defined]  # noqa: F821 - _bucket_c.pxd cimports it
    # A typed global (_bucket_c.pxd): a module global of Python 3.12+ is a dict lookup.
    _DATE = BsonDate


def bson_date(ms: int) -> BsonDate:
    """A :class:`BsonDate` of ``ms`` milliseconds since the epoch."""
    date: BsonDate
    if cython.compiled and _MS_SLOT >= 0:
        date = new_with_slot(_DATE, _MS_SLOT, ms)  # type: ignore[name-defined]  # noqa: F821 - as above
    else:
        date = object.__new__(BsonDate)
        date.ms = ms
    return date


def bson_dates(readings: list[Reading]) -> list[BsonDate]:
    """The readings' times as :class:`BsonDate` objects, in order."""
    return [bson_date(ms_of(reading)) for reading in readings]


def ms_of(reading: Reading) -> int:
    """A reading's instant: whole milliseconds since the epoch."""
    row = _fields(reading) if cython.compiled else reading
    ms = row[MS]
    return ms if ms is not None else ts_key(reading.ts)


def reading_bytes(reading: Reading) -> int:
    """Upper estimate of what a reading adds to its document's BSON size.

    Its entry in ``readings`` and, for each of its measurements, the ``stats.<m>`` entry
    (and ``units.<m>``) it may add: a document whose readings each bring new names grows
    by its statistics as much as by its readings.
    """
    # entry: array index key and sub-document framing ~16, ts 12, seq 13, each value
    # 10 + name; stats.<m>: {count, sum, min, max} 60 + name
    row = _fields(reading) if cython.compiled else reading
    values = row[VALUES]
    size = 41
    for name in values:
        size += 70 + 2 * len(name)
    if row[TAGS] is not None:  # the mapping path: strings too (UTF-8: 4 bytes a character)
        for value in values.values():
            if type(value) is str:
                size += 4 * len(value)
        size += _labels_bytes(row[UNITS]) + _labels_bytes(row[INFO])
    return size


def _labels_bytes(labels: dict[str, str] | None) -> int:
    """What a reading's units or info add to its size (:func:`reading_bytes`)."""
    size = 0
    if labels:
        for key, value in labels.items():
            size += len(key) + 7 + 4 * len(value)
    return size


def stat_values(values: dict[str, Any]) -> dict[str, Any]:
    """The values that get statistics: numbers, and booleans as 0/1; not strings."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        kind = type(value)
        if kind is bool:
            out[name] = int(value)
        elif kind is not str:
            out[name] = value
    return out


def group_readings(readings: list[Reading], span: int) -> list[Group]:  # noqa: PLR0912, PLR0915 - one loop, the batch's hot path
    """Group readings by series and span, keeping arrival order inside each group.

    The groups as ``(sensor_id, tags, start, readings)``, in the order of their first
    reading.
    """
    groups: list[Group] = []
    last_sensor: str | None = None
    last_tags: dict[str, str] | None = None
    last_start = 0.0
    group: list[Reading] = []
    keys: dict[int, TagsKey] = {}  # by id() of a tags dict: topics share theirs
    # Each sensor's latest group: interleaved messages of many sensors find theirs without
    # a key to build and hash, and a large fleet's usual reading (a sensor without a group
    # yet in this batch) costs one lookup and one entry.
    latest: dict[str, Group] = {}
    # The other groups, by key: a sensor's group enters when another becomes its latest.
    # So every group is its sensor's latest, or here.
    earlier: dict[GroupKey, Group] = {}
    # Compiled: Python's float // of a float epoch and a span a float holds, in C.
    fast = cython.compiled and type(span) is int and 0 < span < _FLOAT_SPANS
    seconds = float(span) if fast else 1.0
    last_at = _NAN  # compiled: the last start as a C float, when it came from fast
    for reading in readings:
        row = _fields(reading) if cython.compiled else reading
        sensor = row[SENSOR_ID]
        tags = row[TAGS]
        epoch = row[EPOCH]
        # A message's readings come one after the other, of one series (the same string
        # and tags objects) and mostly of one span: no key to build and look up for those
        # (compiled, no float object either).
        if fast and type(epoch) is float:
            at = _floordiv(epoch, seconds) * seconds
            if sensor is last_sensor and tags is last_tags and at == last_at:
                group.append(reading)
                continue
            start = at
            last_at = at
        else:
            start = epoch // span * span
            if sensor is last_sensor and tags is last_tags and start == last_start:
                group.append(reading)
                continue
            last_at = _NAN
        if not tags:
            tags_of = NO_TAGS
        else:
            found_key = keys.get(id(tags))
            if found_key is None:
                found_key = keys[id(tags)] = tags_key(tags)
            tags_of = found_key
        mine = latest.get(sensor)
        if (
            mine is not None
            and (_eq(mine[2], start) if cython.compiled else mine[2] == start)
            and (mine[1] is tags_of or mine[1] == tags_of)
        ):
            group = mine[3]
            group.append(reading)
        else:
            found = None  # a sensor without a group yet in this batch: no key made
            if mine is not None:
                earlier.setdefault((sensor, mine[1], mine[2]), mine)
                found = earlier.get((sensor, tags_of, start))
            if found is None:
                group = [reading]
                found = (sensor, tags_of, start, group)
                groups.append(found)
            else:
                group = found[3]
                group.append(reading)
            latest[sensor] = found
        last_sensor, last_tags, last_start = sensor, tags, start
    return groups


def unique_readings(
    group: list[Reading], plan: Plan
) -> tuple[list[Reading], dict[int, list[Reading]] | None]:
    """One series' group, one reading per instant; and, if some merged, their sources.

    Readings at one instant with other fields merge; one that repeats a field is left
    for a later round, in ``plan.deferred`` (:func:`~ingest.store.writers.instants.merge_series`).
    The sources map ``id()`` of each reading returned to the readings it stands for;
    None when every reading is its own instant (the group itself is returned).
    """
    keys = {reading.ms for reading in group}
    if len(keys) == len(group) and None not in keys:
        return group, None  # the common case (each reading its own instant), at C speed
    out, deferred = merge_series(group, ms_of)
    plan.deferred.extend(deferred)
    return [reading for reading, _ in out], {id(reading): originals for reading, originals in out}


def reading_doc(reading: Reading) -> dict[str, Any]:
    """The sub-document pushed into ``readings``."""
    doc: dict[str, Any] = {"ts": reading.ts}
    if reading.seq is not None:
        doc["seq"] = reading.seq
    doc.update(reading.values)
    return doc


def _entries(readings: list[Reading]) -> tuple[list[BsonDate], list[dict[str, Any]]]:
    """The readings' BSON dates, and :func:`reading_doc`'s documents with those dates."""
    dates: list[BsonDate] = []
    pushed: list[dict[str, Any]] = []
    for reading in readings:
        row = _fields(reading) if cython.compiled else reading
        ms = row[MS]
        if ms is None:
            ms = ts_key(reading.ts)
        if cython.compiled:
            date = bson_date(ms)
        else:  # bson_date's two steps, without a call per reading
            date = _new(BsonDate)
            date.ms = ms
        dates.append(date)
        seq = row[SEQ]
        pushed.append(
            {"ts": date, **row[VALUES]} if seq is None else {"ts": date, "seq": seq, **row[VALUES]}
        )
    return dates, pushed


def chunks(
    group: list[Reading], max_readings: int, max_bytes: int = MAX_BUCKET_BYTES
) -> list[tuple[list[Reading], int]]:
    """Split one sensor-span's readings so each piece fits one document: (readings, bytes)."""
    out: list[tuple[list[Reading], int]] = []
    chunk: list[Reading] = []
    size = 0
    for reading in group:
        grow = reading_bytes(reading)
        if chunk and (len(chunk) >= max_readings or size + grow > max_bytes):
            out.append((chunk, size))
            chunk, size = [], 0
        chunk.append(reading)
        size += grow
    if chunk:
        out.append((chunk, size))
    return out


_STAT_KEYS: dict[str, tuple[str, str, str, str]] = {}


def _stat_keys(name: str) -> tuple[str, str, str, str]:
    """The update paths of one measurement's statistics, built once per name."""
    keys = (f"stats.{name}.count", f"stats.{name}.sum", f"stats.{name}.min", f"stats.{name}.max")
    if len(_STAT_KEYS) < 10_000:  # names are validated, but a fleet may invent many
        _STAT_KEYS[name] = keys
    return keys


def update_for(
    sensor_id: str,
    tags: dict[str, str],
    start: datetime | BsonDate,
    chunk: list[Reading],
    max_readings: int,
    size: int,
    max_bytes: int = MAX_BUCKET_BYTES,
) -> dict[str, Any]:
    """One upsert that appends ``chunk`` to a document of that series-span with room for it.

    Room means both fewer than ``max_readings - n`` readings and fewer than
    ``max_bytes - size`` estimated bytes, so no document outgrows MongoDB's limit,
    and none of the chunk's timestamps, so no document holds a reading twice.

    Returned as the update command's statement (:func:`statement`), which
    :mod:`ingest.store.writers.bulk` sends.
    """
    dates, pushed = _entries(chunk)
    if len(chunk) == 1:  # the common case of a large fleet: no coalescing to do
        inc, mins, maxs, labels = _single(chunk[0], size)
        mins["first_ts"] = maxs["last_ts"] = dates[0]
    else:
        inc, mins, maxs, labels = _coalesced(chunk, size)
        mins["first_ts"] = min(dates, key=_ms_of)
        maxs["last_ts"] = max(dates, key=_ms_of)
    return statement(
        sensor_id,
        tags,
        start,
        dates,
        pushed,
        size,
        max_readings,
        (inc, mins, maxs, labels),
        max_bytes,
    )


def statement(
    sensor_id: str,
    tags: dict[str, str],
    start: datetime | BsonDate,
    dates: list[BsonDate],
    pushed: list[dict[str, Any]],
    size: int,
    max_readings: int,
    stats: _Stats,
    max_bytes: int = MAX_BUCKET_BYTES,
) -> dict[str, Any]:
    """The update command's statement for one bucket upsert, as pymongo builds it.

    ``stats`` are the ``$inc``, ``$min``, ``$max`` and ``$set`` (units) of the readings
    pushed. ``tags`` are the series' identity tags in name order: an equality match on
    the whole object, which an upsert copies into the new document. The filter could
    also be served by the unique ``{sensor_id, tags, readings.ts}`` index, which would
    scan every reading of the series: the hint names the index that finds the
    series-span's few documents.
    """
    inc, mins, maxs, labels = stats
    update: dict[str, Any] = {
        "$push": {"readings": {"$each": pushed}},
        "$inc": inc,
        "$min": mins,
        "$max": maxs,
        "$setOnInsert": {"schema_version": SCHEMA_VERSION},
    }
    if labels:
        update["$set"] = labels
    if len(inc) == 2:  # only strings: no statistics, and the validator wants a stats object
        update["$setOnInsert"]["stats"] = {}
    return {
        "q": {
            "sensor_id": sensor_id,
            "tags": tags,
            "bucket_start": start,
            "count": {"$lte": max_readings - len(dates)},
            "bytes": {"$lte": max(max_bytes - size, 0)},
            "readings.ts": {"$nin": dates},
        },
        "u": update,
        "multi": False,
        "upsert": True,
        "hint": BUCKET_INDEX,
    }


class _Stat:
    """One measurement's statistics over a group's readings: count, sum, min and max.

    The sum is added up in reading order from the first value as a float; ``min`` and
    ``max`` keep the first of equal values.
    """

    __slots__ = ("count", "high", "low", "name", "total")
    name: str
    count: int
    total: float
    low: Any
    high: Any


def _first_stat(name: str, value: Any) -> _Stat:  # noqa: ANN401 - a number
    """The statistics of a measurement's first value (made without a constructor call)."""
    stat: _Stat = _Stat.__new__(_Stat)
    stat.name = name
    stat.count = 1
    stat.total = float(value)
    stat.low = stat.high = value
    return stat


def _by_reading(group: list[Reading], labels: dict[str, str] | None = None) -> list[_Stat]:
    """Each measurement's statistics, reading by reading, in the order names first came.

    Readings of the mapping path (tags not None) count booleans as 0/1 and strings not
    at all; their units go to ``labels`` when it is given.
    """
    acc: dict[str, _Stat] = {}
    # The statistics in the order their names first came: a reading's names mostly come
    # in that order (one decoder, one device), and are then found by position, no lookup.
    order: list[_Stat] = []
    known = 0  # len(order)
    for reading in group:
        row = _fields(reading) if cython.compiled else reading
        values = row[VALUES]
        if row[TAGS] is not None:
            values = stat_values(values)
            if labels is not None:
                _label(reading, labels)
        i = 0
        for name, value in values.items():
            stat = order[i] if i < known else None
            i += 1
            if stat is None or stat.name is not name:
                stat = acc.get(name)
                if stat is None:
                    stat = acc[name] = _first_stat(name, value)
                    order.append(stat)
                    known += 1
                    continue
            stat.count += 1
            # float(): as Python adds an int to a float (compiled, Cython's own float + int
            # gives -0.0 + 0 as -0.0, where Python gives 0.0)
            stat.total += float(value)
            if _lt(value, stat.low) if cython.compiled else value < stat.low:
                stat.low = value
            elif _gt(value, stat.high) if cython.compiled else value > stat.high:
                stat.high = value
    return order


def _one_update(
    sensor_id: str,
    tags: dict[str, str],
    start: BsonDate,
    reading: Reading,
    max_readings: int,
    max_bytes: int,
) -> Mapping[str, Any] | None:
    """:func:`_fast_update` of a group of one reading (a large fleet's usual group).

    :func:`update_for` without the splitting and settling a group of one never needs, for
    a reading of either path (the default decoder's, or the mapping path's with tags,
    strings, booleans, units and info).
    """
    row = _fields(reading) if cython.compiled else reading
    if row[MS] is None:
        return None
    size = reading_bytes(reading)
    if size > max_bytes:
        return None
    raw = (
        _templated(sensor_id, tags, start, reading, size, max_readings, max_bytes)
        if cython.compiled
        else None
    )
    if raw is not None:
        return raw
    return update_for(sensor_id, tags, start, [reading], max_readings, size, max_bytes)


def _templated(
    sensor_id: str,
    tags: dict[str, str],
    start: BsonDate,
    reading: Reading,
    size: int,
    max_readings: int,
    max_bytes: int,
) -> Mapping[str, Any] | None:
    """Compiled: :func:`_single_raw`'s statement, through the template of its shape.

    For a reading of the default format (numbers, no tags, at most 20 measurements), the
    shape is its names in order, the BSON type of each value and of its seq, and the caps.
    The first reading of a shape is written by :func:`_single_raw`, recording; the next
    ones copy those bytes with their own sensor id, and their dates and numbers in the
    slots marked (:func:`_filled_in`). Any other reading, or one the template is not sure
    of, is written by :func:`_single_raw`.
    """
    global _CAPS  # noqa: PLW0603 - the key of the last caps, reused
    row = _fields(reading) if cython.compiled else reading
    given = row[VALUES]
    seq = row[SEQ]
    raw = None
    if row[TAGS] is None and not tags and type(given) is dict:
        values: dict[str, Any] = given  # compiled: a dict, typed
        shape = _bson_c.shape_of(values, seq)
        if shape >= 0:
            caps = _CAPS
            if caps[0] != max_readings or caps[1] != max_bytes:
                caps = _CAPS = (max_readings, max_bytes)
            template = _TEMPLATES.find(values, shape, caps)
            if template is None:
                _WRITER.recording = True
                try:
                    raw = _single_raw(
                        _WRITER, sensor_id, tags, start, reading, size, max_readings, max_bytes
                    )
                finally:
                    _WRITER.recording = False
                if raw is not None:
                    _TEMPLATES.record(_WRITER, raw, values, shape, caps)
                return raw
            raw = _filled_in(template, sensor_id, start, row[MS], seq, values)
    if raw is None:
        raw = _single_raw(_WRITER, sensor_id, tags, start, reading, size, max_readings, max_bytes)
    return raw


def _filled_in(
    template: _Template,
    sensor_id: str,
    start: BsonDate,
    ms: object,
    seq: int | None,
    values: dict[str, Any],
) -> Mapping[str, Any] | None:
    """A single reading's statement, its values in ``template``'s slots; None if not sure.

    The slots are those :func:`_raw_start`, :func:`_raw_single_stats` and
    :func:`_raw_values` mark, each filled with what they write there.
    """
    if (
        template.begin(sensor_id)
        or template.date(_S_START, start.ms)
        or template.date(_S_NIN, ms)
        or template.date(_S_TS, ms)
        or template.date(_S_FIRST, ms)
        or template.date(_S_LAST, ms)
        or (seq is not None and template.value(_S_SEQ, seq))
    ):
        return None
    slot = _S_VALUES
    for value in values.values():
        if (
            template.value(slot, value)
            or template.real(slot + 1, value)  # float(value), without the object
            or template.value(slot + 2, value)
            or template.value(slot + 3, value)
        ):
            return None
        slot += 4
    raw = template.finish()  # None unless every slot was filled
    if raw is not None:
        _TEMPLATES.filled += 1
    return raw  # type: ignore[no-any-return]


def _fast_update(
    sensor_id: str,
    tags: dict[str, str],
    start: BsonDate,
    group: list[Reading],
    max_readings: int,
    max_bytes: int,
) -> Mapping[str, Any] | None:
    """:func:`update_for` of a whole group in one pass, for the default decoder's readings.

    For a group whose readings are numbers only (no tags, values in a dict), all timed in
    milliseconds, each at its own millisecond, and that fit one document; otherwise None
    (the general path then splits, settles repeats and labels). Builds the same statement.
    """
    count = len(group)
    if count == 1:
        return _one_update(sensor_id, tags, start, group[0], max_readings, max_bytes)
    if count > max_readings:
        return None
    size = 41 * count  # reading_bytes of each: numbers only
    ordered = True  # in time order (the usual batch): distinct, first and last at the ends
    last: int | None = None
    for reading in group:
        row = _fields(reading) if cython.compiled else reading
        ms = row[MS]
        values = row[VALUES]
        if ms is None or row[TAGS] is not None or type(values) is not dict:
            return None
        if ordered and last is not None and (_le(ms, last) if cython.compiled else ms <= last):
            ordered = False
        last = ms
    stats = _by_reading(group)
    for stat in stats:  # each value adds its name's bytes (reading_bytes)
        size += stat.count * (70 + 2 * len(stat.name))
    if size > max_bytes:
        return None
    if ordered:
        first, last = ms_of(group[0]), ms_of(group[-1])
    else:
        stamps = [ms_of(reading) for reading in group]
        if len(set(stamps)) < count:
            return None
        first, last = min(stamps), max(stamps)
    return _group_statement(
        sensor_id, tags, start, group, size, max_readings, max_bytes, stats, (first, last)
    )


def _group_statement(
    sensor_id: str,
    tags: dict[str, str],
    start: BsonDate,
    group: list[Reading],
    size: int,
    max_readings: int,
    max_bytes: int,
    stats: list[_Stat],
    bounds: tuple[int, int],
) -> Mapping[str, Any]:
    """:func:`_fast_update`'s statement; compiled, its bytes.

    The dict when the kernel is not sure of a part, when the group has more readings
    than :data:`_INDEX` names, or run as Python.
    """
    if (
        cython.compiled
        and len(group) <= len(_INDEX)
        and not _raw_start(_WRITER, sensor_id, tags, start, group, size, max_readings, max_bytes)
        and not _raw_group_stats(_WRITER, stats, len(group), size, bounds)
    ):
        raw = _raw_end(_WRITER, len(stats) > 0)
        if raw is not None:
            return raw
    first, last = bounds
    inc, mins, maxs = _statistics(stats, len(group), size, bson_date(first), bson_date(last))
    dates, pushed = _entries(group)
    return statement(
        sensor_id, tags, start, dates, pushed, size, max_readings, (inc, mins, maxs, {}), max_bytes
    )


# --- compiled: statements written as BSON bytes -----------------------------------------
# Each function below writes a part of :func:`statement`'s dict through the BSON writer
# kernel, in the dict's key order, with the same value types (tests/store/
# test_bucket_twins.py compares the bytes with the driver's encoding of the dict). A part
# answers WRITTEN (0) or NOT_SURE (1); on NOT_SURE the statement is built as a dict.


def _raw_start(
    writer: BsonWriter,
    sensor_id: str,
    tags: dict[str, str],
    start: BsonDate,
    group: list[Reading],
    size: int,
    max_readings: int,
    max_bytes: int,
) -> int:
    """The statement up to ``$inc``: its filter and the readings pushed."""
    if (
        writer.start()
        or writer.open("q")
        or writer.value("sensor_id", sensor_id)
        or writer.mark_text()
        or writer.open("tags")
        or writer.items(tags, by_name=False, skip=None)
        or writer.close()
        or writer.date("bucket_start", start.ms)
        or writer.mark(_S_START)
        or writer.open("count")
        or writer.value("$lte", max_readings - len(group))
        or writer.close()
        or writer.open("bytes")
        or writer.value("$lte", max(max_bytes - size, 0))
        or writer.close()
        or writer.open("readings.ts")
        or writer.open_array("$nin")
    ):
        return 1
    for i, reading in enumerate(group):
        row = _fields(reading) if cython.compiled else reading
        # (marks are recorded for a single reading's statement only)
        if writer.date(_INDEX[i], row[MS]) or writer.mark(_S_NIN):
            return 1
    if (
        writer.close()
        or writer.close()
        or writer.close()
        or writer.open("u")
        or writer.open("$push")
        or writer.open("readings")
        or writer.open_array("$each")
    ):
        return 1
    for i, reading in enumerate(group):
        row = _fields(reading) if cython.compiled else reading
        seq = row[SEQ]
        if (
            writer.open(_INDEX[i])
            or writer.date("ts", row[MS])
            or writer.mark(_S_TS)
            or (seq is not None and (writer.value("seq", seq) or writer.mark(_S_SEQ)))
            or writer.items(row[VALUES], by_name=False, skip=_PUSHED_OWN, slot=_S_VALUES, stride=4)
            or writer.close()
        ):
            return 1
    return writer.close() or writer.close() or writer.close()


def _raw_end(
    writer: BsonWriter, measured: bool, labels: dict[str, str] | None = None
) -> Mapping[str, Any] | None:
    """The statement after ``$max``, and the whole as a ``RawBSONDocument``; or None."""
    if (
        writer.open("$setOnInsert")
        or writer.value("schema_version", SCHEMA_VERSION)
        or (not measured and (writer.open("stats") or writer.close()))
        or writer.close()
        or (labels and (writer.open("$set") or writer.items(labels, by_name=False, skip=None)))
        or (labels and writer.close())
        or writer.close()  # u
        or writer.value("multi", False)  # noqa: FBT003 - the statement's field
        or writer.value("upsert", True)  # noqa: FBT003
        or writer.value("hint", BUCKET_INDEX)
    ):
        return None
    return writer.finish()  # type: ignore[return-value]  # a RawBSONDocument, or None


def _raw_single_stats(writer: BsonWriter, values: dict[str, Any], size: int, ms: int) -> int:
    """``$inc``, ``$min`` and ``$max`` of one reading (:func:`_single`)."""
    if writer.open("$inc") or writer.value("count", 1) or writer.value("bytes", size):
        return 1
    i = 0
    for name, value in values.items():
        keys = _STAT_KEYS.get(name) or _stat_keys(name)
        if (
            writer.value(keys[0], 1)
            or writer.value(keys[1], float(value))
            or writer.mark(_S_VALUES + 4 * i + 1)
        ):
            return 1
        i += 1  # noqa: SIM113 - compiled: the dict's iteration in C, with a C index
    return (
        writer.close()
        or _raw_values(writer, "$min", "first_ts", ms, values, 2)
        or _raw_values(writer, "$max", "last_ts", ms, values, 3)
    )


def _raw_values(
    writer: BsonWriter, field: str, date: str, ms: int, values: dict[str, Any], key: int
) -> int:
    """``$min`` (``key`` 2) or ``$max`` (3) of one reading: its date, then each value."""
    if (
        writer.open(field)
        or writer.date(date, ms)
        or writer.mark(_S_FIRST if key == 2 else _S_LAST)
    ):
        return 1
    i = 0
    for name, value in values.items():
        if writer.value((_STAT_KEYS.get(name) or _stat_keys(name))[key], value) or writer.mark(
            _S_VALUES + 4 * i + key
        ):
            return 1
        i += 1  # noqa: SIM113 - compiled: the dict's iteration in C, with a C index
    return writer.close()


def _raw_group_stats(
    writer: BsonWriter, stats: list[_Stat], count: int, size: int, bounds: tuple[int, int]
) -> int:
    """``$inc``, ``$min`` and ``$max`` of a group's statistics (:func:`_statistics`)."""
    if writer.open("$inc") or writer.value("count", count) or writer.value("bytes", size):
        return 1
    for stat in stats:
        keys = _STAT_KEYS.get(stat.name) or _stat_keys(stat.name)
        if writer.value(keys[0], stat.count) or writer.value(keys[1], stat.total):
            return 1
    return (
        writer.close()
        or _raw_bounds(writer, "$min", "first_ts", bounds[0], stats, False)  # noqa: FBT003
        or _raw_bounds(writer, "$max", "last_ts", bounds[1], stats, True)  # noqa: FBT003
    )


def _raw_bounds(
    writer: BsonWriter,
    field: str,
    date: str,
    ms: int,
    stats: list[_Stat],
    high: bool,
) -> int:
    """``$min`` (``high`` false) or ``$max`` of a group: its date, then each low or high."""
    if writer.open(field) or writer.date(date, ms):
        return 1
    for stat in stats:
        keys = _STAT_KEYS.get(stat.name) or _stat_keys(stat.name)
        if writer.value(keys[3], stat.high) if high else writer.value(keys[2], stat.low):
            return 1
    return writer.close()


def _single_raw(
    writer: BsonWriter,
    sensor_id: str,
    tags: dict[str, str],
    start: BsonDate,
    reading: Reading,
    size: int,
    max_readings: int,
    max_bytes: int,
) -> Mapping[str, Any] | None:
    """The bytes of :func:`update_for`'s statement for one reading (:func:`_one_update`).

    None when the kernel is not sure of a part.
    """
    row = _fields(reading) if cython.compiled else reading
    values = row[VALUES]
    ms = row[MS]
    if ms is None or type(values) is not dict:
        return None
    measured = values
    labels: dict[str, str] | None = None
    if row[TAGS] is not None:  # the mapping path: booleans as 0/1, no strings; labels
        measured = stat_values(values)
        if row[UNITS] is not None or row[INFO] is not None:
            labels = {}
            _label(reading, labels)
    if _raw_start(
        writer, sensor_id, tags, start, [reading], size, max_readings, max_bytes
    ) or _raw_single_stats(writer, measured, size, ms):
        return None
    return _raw_end(writer, len(measured) > 0, labels)


def _label(reading: Reading, labels: dict[str, str]) -> None:
    """Add a reading's units and info to the ``$set`` (``units.<m>``, ``info.<k>``).

    The last one wins. Only readings of the mapping path (tags not None) have any. The
    series' tags are part of the document's key, never set here.
    """
    if reading.info is not None:
        for key, value in reading.info.items():
            labels[f"info.{key}"] = value
    if reading.units is not None:
        for name, unit in reading.units.items():
            labels[f"units.{name}"] = unit


def _single(reading: Reading, size: int) -> _Stats:
    """``$inc``, ``$min`` and ``$max`` for one reading."""
    inc: dict[str, Any] = {"count": 1, "bytes": size}
    mins: dict[str, Any] = {"first_ts": None}  # set by update_for
    maxs: dict[str, Any] = {"last_ts": None}
    labels: dict[str, str] = {}
    row = _fields(reading) if cython.compiled else reading
    values = row[VALUES]
    if row[TAGS] is not None:  # the mapping path: booleans as 0/1, no strings
        values = stat_values(values)
        _label(reading, labels)
    for name, value in values.items():
        keys = _STAT_KEYS.get(name) or _stat_keys(name)
        inc[keys[0]] = 1
        inc[keys[1]] = float(value)
        mins[keys[2]] = value
        maxs[keys[3]] = value
    return inc, mins, maxs, labels


def _coalesced(chunk: list[Reading], size: int) -> _Stats:
    """``$inc``, ``$min`` and ``$max`` for several readings of one sensor-span."""
    labels: dict[str, str] = {}
    stats = _by_reading(chunk, labels)
    inc, mins, maxs = _statistics(stats, len(chunk), size, None, None)  # dates: update_for
    return inc, mins, maxs, labels


def _statistics(
    stats: list[_Stat], count: int, size: int, first: BsonDate | None, last: BsonDate | None
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``$inc``, ``$min`` and ``$max`` of a group from its measurements' statistics."""
    inc: dict[str, Any] = {"count": count, "bytes": size}
    mins: dict[str, Any] = {"first_ts": first}
    maxs: dict[str, Any] = {"last_ts": last}
    keys_of = _STAT_KEYS
    for stat in stats:
        name = stat.name
        keys = keys_of.get(name) or _stat_keys(name)
        inc[keys[0]] = stat.count
        inc[keys[1]] = stat.total
        mins[keys[2]] = stat.low
        maxs[keys[3]] = stat.high
    return inc, mins, maxs


def plan_buckets(
    readings: list[Reading], span: int, max_readings: int, max_bytes: int = MAX_BUCKET_BYTES
) -> Plan:
    """One upsert per series-span of ``span`` seconds (more only past ``max_readings``).

    The statements, each with the readings it carries, and the readings deferred to a
    later round (:func:`unique_readings`). ``max_bytes`` caps a document's estimated size.
    """
    ops: list[Any] = []
    groups: list[list[Reading]] = []
    plan = Plan(ops, groups)
    last_start: object = None
    start_dt: BsonDate | None = None
    for sensor_id, tags_of, start, group in group_readings(readings, span):
        # Most groups of a batch share their span: one date for them.
        if start_dt is None or start != last_start:
            start_dt = bson_date(int(start) * 1000)
            last_start = start
        tags = dict(tags_of) if tags_of else _EMPTY
        op = _fast_update(sensor_id, tags, start_dt, group, max_readings, max_bytes)
        if op is not None:
            ops.append(op)
            groups.append(group)
            continue
        unique, sources = unique_readings(group, plan)
        for chunk, size in chunks(unique, max_readings, max_bytes):
            ops.append(update_for(sensor_id, tags, start_dt, chunk, max_readings, size, max_bytes))
            groups.append(
                chunk if sources is None else [o for reading in chunk for o in sources[id(reading)]]
            )
    return plan

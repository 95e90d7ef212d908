# cython: annotation_typing=False
"""Time-series documents of a batch: the rules, once.

Run as Python, and compiled by Cython as ``_timeseries_c`` with the types of
``_timeseries_c.pxd`` (setup.py); :mod:`ingest.store.writers.timeseries` picks one
(``accel.pick``). Compiled, :func:`batch_documents` hands each document's parts to the BSON
writer kernel (``_bson_c.Writer``) and gives the ``RawBSONDocument`` of the bytes the
driver would write for the dict built here, which the driver then sends as they are; a
document the kernel is not sure of (another type of value, an int beyond int64, a string
that is not UTF-8, a name with a NUL or one of the document's own fields, a ``Reading``
subclass, a ``when``) stays this module's dict, which the driver encodes or refuses.
"""

from __future__ import annotations

import json
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from bson.datetime_ms import DatetimeMS
from bson.objectid import ObjectId

from ingest.model import Reading
from ingest.store.writers._bucket_py import _INDEX, RAW_OPTIONS  # _INDEX: array keys
from ingest.store.writers.bucket import BsonDate, ts_key

try:
    import cython
except ImportError:  # Cython builds the accelerators; it is not needed to run
    from ingest import _cython_shim as cython

# Compiled, these are cimported (_timeseries_c.pxd): the BSON writer kernel
# (ingest/store/writers/_bson_c.pyx) and the C-level helpers (ingest/_capi.pxd).
_bson_c: Any = None
_capi: Any = None

if TYPE_CHECKING:
    from collections.abc import Callable

    from ingest.store.writers import BsonWriter as _Writer
    from ingest.store.writers.instants import TagsKey


_TIME = attrgetter("epoch")
_SENSOR_ID = Reading._fields.index("sensor_id")
_EPOCH = Reading._fields.index("epoch")
_MS = Reading._fields.index("ms")
_TAGS = Reading._fields.index("tags")
_VALUES = Reading._fields.index("values")
_new = object.__new__
_NOTHING = object()
# Field names of a reading in name order, by their order in the payload (bounded: names
# are validated, but a fleet may invent many).
_SORTED: dict[tuple[str, ...], tuple[str, ...] | None] = {}
_SORTED_LIMIT = 10_000

_PREFIX_BYTES = 9  # of an ObjectId: seconds (4) and the process's random bytes (5)

# Where a BsonDate holds its milliseconds (compiled: set there, see ingest/_capi.pxd).
_DATE_MS_SLOT = _capi.slot_offset(BsonDate, "ms") if cython.compiled else -1
# Compiled: the writer of every batch's documents (one at a time; its buffer kept).
_WRITER = _bson_c.Writer(RAW_OPTIONS) if cython.compiled else None
# A document's own fields: a value of that name overwrites one in its dict.
_OWN = frozenset({"_id", "ts", "meta", "seq", "units", "info"})
_META_OWN = frozenset({"sensor_id"})
# The instants a Python datetime holds (years 1 to 9999), in milliseconds: ``Reading.ts``
# raises OverflowError beyond them.
_MIN_DATETIME_MS = -62_135_596_800_000
_MAX_DATETIME_MS = 253_402_300_799_999


def reading_document(reading: Reading) -> dict[str, Any]:
    """The time-series document for one reading."""
    meta: dict[str, Any] = {"sensor_id": reading.sensor_id}
    if reading.tags:  # in name order: a meta field order is part of the series
        tags = reading.tags
        for key in sorted(tags):
            meta[key] = tags[key]
    doc: dict[str, Any] = {"ts": reading.ts, "meta": meta}
    if reading.seq is not None:
        doc["seq"] = reading.seq
    if reading.units is not None:
        doc["units"] = dict(sorted(reading.units.items()))
    if reading.info is not None:
        doc["info"] = dict(sorted(reading.info.items()))
    values = reading.values
    for name in sorted(values):
        doc[name] = values[name]
    return doc


def _sorted_names(names: tuple[str, ...]) -> tuple[str, ...] | None:
    """``names`` in name order, or None if they are in name order already."""
    try:
        return _SORTED[names]
    except KeyError:
        order = tuple(sorted(names))
        result = None if order == names else order
        if len(_SORTED) < _SORTED_LIMIT:
            _SORTED[names] = result
        return result


def sorted_readings(readings: list[Reading]) -> list[Reading]:
    """A batch in its documents' order: by sensor, then time, ties in the batch's order.

    Each sensor's readings are gathered in the batch's order (a sensor's readings arrive
    in time order, as a rule), the sensors sorted, and a run sorted by time only if it
    is out of order.
    """
    by_sensor: dict[str, list[Reading]] = {}
    last: object = _NOTHING
    run: list[Reading] = []
    reading_type = Reading
    for reading in readings:
        if cython.compiled:  # a Reading's field by index
            sensor = _capi.field(reading, reading_type, _SENSOR_ID, "sensor_id")
        else:
            sensor = reading.sensor_id
        if sensor is not last:
            found = by_sensor.get(sensor)
            if found is None:
                found = by_sensor[sensor] = []
            run, last = found, sensor
        run.append(reading)
    out: list[Reading] = []
    for sensor in sorted(by_sensor):
        run = by_sensor[sensor]
        if len(run) > 1 and not _in_time_order(run):
            run.sort(key=_TIME)
        out += run
    return out


def _in_time_order(run: list[Reading]) -> bool:
    """Whether no reading of ``run`` is earlier than the one before it."""
    reading_type = Reading
    earlier = run[0].epoch
    for k in range(1, len(run)):
        if cython.compiled:  # a Reading's field by index
            epoch = _capi.field(run[k], reading_type, _EPOCH, "epoch")
        else:
            epoch = run[k].epoch
        if epoch < earlier:
            return False
        earlier = epoch
    return True


def batch_documents(  # noqa: C901, PLR0912, PLR0915 - one loop, the batch's hot path
    readings: list[Reading], prefix: bytes, start: int
) -> tuple[list[Any], list[tuple[str, list[Any]]], bool]:
    """The documents of ``readings``, with what the lookup before the insert needs.

    ``readings`` are sorted by sensor and time. Also returns each sensor's run of times
    (BSON dates, in order: a run is what ``itertools.groupby`` makes of the sensor ids)
    and whether two readings of one sensor share a millisecond. Document ``i``'s ``_id``
    is ``prefix`` (9 bytes) and the 3-byte counter ``start + i``.

    The same documents as :func:`reading_document`'s, built with less work for readings
    without tags, units or info: the sorted field order is looked up once per field
    list, one ``meta`` object is shared by a sensor's documents (nothing changes them),
    and ``ts`` is a :class:`~ingest.store.writers.bucket.BsonDate`. The ``_id`` is what
    the driver would add; given here, the driver does not make one per document.
    Compiled, a document is the ``RawBSONDocument`` of its bytes where the kernel is sure
    of them (see the module docstring); either reads as a mapping.
    """
    count = len(readings)
    if cython.compiled:
        writer = _WRITER
        ids = ids_of(prefix, start, 0)  # the checks: an id is made for a document left a dict
    else:
        writer = None
        ids = ids_of(prefix, start, count)
    counter = start & 0xFFFFFF
    new, date_type, reading_type = _new, BsonDate, Reading
    metas: dict[str, dict[str, Any]] = {}
    docs: list[Any] = []
    dates: list[BsonDate] = []
    runs: list[tuple[str, list[Any]]] = []  # timeseries.Runs
    collided = False
    begin = 0
    last: Any = None
    previous: Any = None
    row: tuple[Any, ...]
    for i, reading in enumerate(readings):
        try:
            if cython.compiled:  # a Reading's fields by index; anything else as Python would
                row = _capi.as_tuple(reading) if type(reading) is reading_type else tuple(reading)
            else:
                row = reading
            sensor, when, _, values, seq, ms, tags, units, info = row
        except (TypeError, ValueError):  # the same message, compiled or not
            raise TypeError(f"not a Reading: {reading!r}") from None
        if ms is None:
            ms = ts_key(reading.ts)
        if cython.compiled and _DATE_MS_SLOT > 0:  # as bucket mode's bson_date makes one
            date = _capi.new_with_slot(date_type, _DATE_MS_SLOT, ms)
        else:
            date = new(date_type)
            date.ms = ms
        dates.append(date)
        if i == 0 or not (sensor is last or last == sensor):  # a new run
            if i:
                runs.append((last, dates[begin:i]))
            begin, last = i, sensor
        elif not collided and previous == ms:
            collided = True
        previous = ms
        mapped = tags or units is not None or info is not None
        if writer is not None and type(reading) is reading_type:
            raw = (
                _mapped_raw(writer, counter + i, reading, when, ms, prefix)
                if mapped
                else _plain_raw(writer, counter + i, sensor, ms, seq, values, prefix)
            )
            if raw is not None:
                docs.append(raw)
                continue
        oid = ids[i] if writer is None else ids_of(prefix, counter + i, 1)[0]
        if mapped:
            docs.append({"_id": oid, **reading_document(reading)})
        else:
            docs.append(_plain_document(oid, date, sensor, seq, values, metas))
    if readings:
        runs.append((last, dates[begin:]))
    return docs, runs, collided


def _plain_document(
    oid: ObjectId,
    date: BsonDate,
    sensor: str,
    seq: object,
    values: dict[str, Any],
    metas: dict[str, Any],
) -> dict[str, Any]:
    """:func:`reading_document`'s dict for a reading without tags, units or info.

    ``metas``: the ``meta`` of each sensor so far, shared by its documents.
    """
    meta = metas.get(sensor)
    if meta is None:
        meta = metas[sensor] = {"sensor_id": sensor}
    names = tuple(values)
    try:
        order = _SORTED[names]
    except KeyError:
        order = _sorted_names(names)
    if seq is None:
        doc = {"_id": oid, "ts": date, "meta": meta}
    else:
        doc = {"_id": oid, "ts": date, "meta": meta, "seq": seq}
    if order is None:
        doc.update(values)
    else:
        for name in order:
            doc[name] = values[name]
    return doc


def _plain_raw(
    writer: _Writer,
    counter: int,
    sensor: object,
    ms: object,
    seq: object,
    values: object,
    prefix: bytes,
) -> object:
    """Compiled: the bytes of :func:`_plain_document`'s dict, or None if the kernel is not sure."""
    if (
        writer.start()
        or writer.object_id("_id", prefix, counter)
        or writer.date("ts", ms)
        or writer.open("meta")
        or writer.value("sensor_id", sensor)
        or writer.close()
        or (seq is not None and writer.value("seq", seq))
        or writer.items(values, by_name=True, skip=_OWN)
    ):
        return None
    return writer.finish()


def _mapped_raw(
    writer: _Writer, counter: int, reading: Reading, when: object, ms: object, prefix: bytes
) -> object:
    """Compiled: the bytes of ``{"_id": ..., **reading_document(reading)}``, or None.

    For a reading with tags, units or info; None when the kernel is not sure of a part.
    """
    if (
        when is not None  # the driver encodes the datetime given
        or type(ms) is not int
        or not _MIN_DATETIME_MS <= ms <= _MAX_DATETIME_MS
    ):
        return None
    tags, units, info, seq = reading.tags, reading.units, reading.info, reading.seq
    if (
        writer.start()
        or writer.object_id("_id", prefix, counter)
        or writer.date("ts", ms)
        or writer.open("meta")
        or writer.value("sensor_id", reading.sensor_id)
        or (tags and writer.items(tags, by_name=True, skip=_META_OWN))
        or writer.close()
        or (seq is not None and writer.value("seq", seq))
        or (
            units is not None
            and (
                writer.open("units")
                or writer.items(units, by_name=True, skip=None)
                or writer.close()
            )
        )
        or (
            info is not None
            and (
                writer.open("info") or writer.items(info, by_name=True, skip=None) or writer.close()
            )
        )
        or writer.items(reading.values, by_name=True, skip=_OWN)
    ):
        return None
    return writer.finish()


def claim_id(instant: tuple[str, TagsKey, int]) -> str:
    """The ``_id`` of an instant's claim: its millisecond, then the series.

    ``"<ms> <sensor>"`` without tags (the first space ends the number), a JSON array
    ``[ms, sensor, [[k, v], ...]]`` with tags (tags in name order, as ``TagsKey``). The
    millisecond first keeps an unsharded collection's ``_id`` index growing at its end,
    as time does.
    """
    sensor, tags, ms = instant
    if not tags:
        return _usual_claim_id(ms, sensor)
    return json.dumps([ms, sensor, tags], ensure_ascii=False, separators=(",", ":"))


def _usual_claim_id(ms: object, sensor: object) -> str:
    """The claim ``_id`` of an instant of a series without tags: ``"<ms> <sensor>"``."""
    if cython.compiled:  # written in place (ingest/_capi.pxd), for the usual id
        made = _capi.number_space_text(ms, sensor)
        if made is not None:
            return made  # type: ignore[no-any-return]
    return f"{ms} {sensor}"


def claim_ids(readings: list[Reading], other: Callable[[Reading], str]) -> list[str]:
    """The claim id of each reading's series and instant (ingest/store/writers/claims.py).

    ``"<ms> <sensor_id>"`` for a reading with its millisecond and no tags (the usual
    one), ``other(reading)`` for the rest.
    """
    reading_type = Reading
    ids: list[str] = []
    for reading in readings:
        if cython.compiled:  # a Reading's fields by index
            ms = _capi.field(reading, reading_type, _MS, "ms")
            tags = _capi.field(reading, reading_type, _TAGS, "tags")
            sensor = _capi.field(reading, reading_type, _SENSOR_ID, "sensor_id")
        else:
            ms, tags, sensor = reading.ms, reading.tags, reading.sensor_id
        if ms is not None and not tags:
            ids.append(_usual_claim_id(ms, sensor))
        else:
            ids.append(other(reading))
    return ids


def claim_documents(ids: list[str], readings: list[Reading], at: int, owner: str) -> list[Any]:
    """The claims of single readings, in order: ``{"_id", "at", "by", "f"}`` each.

    ``ids[i]`` is the claim id of ``readings[i]``'s instant, ``at`` the time of the claims
    (epoch ms), ``owner`` the session that makes them; ``f`` is the reading's values, as
    they are (see ingest/store/writers/claims.py). Compiled, a claim is the
    ``RawBSONDocument`` of the bytes the driver would write for this dict, where the
    kernel is sure of them; else this dict.
    """
    if len(ids) != len(readings):
        raise ValueError(f"{len(ids)} claim ids for {len(readings)} readings")
    writer = _WRITER if cython.compiled else None
    date = DatetimeMS(at)
    reading_type = Reading
    docs: list[Any] = []
    for i, reading in enumerate(readings):
        key = ids[i]
        if writer is not None and type(reading) is reading_type and type(key) is str:
            # Compiled: its values by position, in C (an attribute is found by name).
            values = _capi.as_tuple(reading)[_VALUES]
            raw = _claim_raw(writer, key, at, owner, values)
            if raw is not None:
                docs.append(raw)
                continue
        docs.append({"_id": key, "at": date, "by": owner, "f": reading.values})
    return docs


def _claim_raw(writer: _Writer, key: str, at: object, owner: object, values: object) -> object:
    """Compiled: the bytes of one claim of :func:`claim_documents`, or None if not sure."""
    if (
        type(owner) is not str
        or writer.start()
        or writer.value("_id", key)
        or writer.date("at", at)
        or writer.value("by", owner)
        or writer.open("f")
        or writer.items(values, by_name=False, skip=None)
        or writer.close()
    ):
        return None
    return writer.finish()


def lookup_clauses(runs: list[tuple[str, list[Any]]]) -> list[Any]:
    """The clauses of the lookup of ``runs`` (each sensor's times, a plan's ``lookup``).

    One a sensor: ``{"meta.sensor_id": sensor, "ts": the time}``, or for several times
    ``{"meta.sensor_id": sensor, "ts": {"$gte": first, "$lte": last, "$in": times}}`` (the
    range bounds the index scan, ``$in`` picks the instants). Compiled, a clause is the
    ``RawBSONDocument`` of the bytes the driver would write for this dict, where the
    kernel is sure of them; else this dict.
    """
    writer = _WRITER if cython.compiled else None
    clauses: list[Any] = []
    for sensor, times in runs:
        if writer is not None:
            raw = _clause_raw(writer, sensor, times)
            if raw is not None:
                clauses.append(raw)
                continue
        clauses.append(
            {
                "meta.sensor_id": sensor,
                "ts": times[0]
                if len(times) == 1
                else {"$gte": times[0], "$lte": times[len(times) - 1], "$in": times},
            }
        )
    return clauses


def _clause_raw(writer: _Writer, sensor: object, times: list[Any]) -> object:
    """Compiled: the bytes of one clause of :func:`lookup_clauses`, or None if not sure."""
    count = len(times)
    if type(sensor) is not str or count == 0 or count > len(_INDEX):
        return None
    for date in times:
        if type(date) is not BsonDate:
            return None
    if writer.start() or writer.value("meta.sensor_id", sensor) or _times_raw(writer, times, count):
        return None
    return writer.finish()


def _times_raw(writer: _Writer, times: list[Any], count: int) -> int:
    """Compiled: a clause's ``ts``, its one time or the range and the times (1: not sure)."""
    if count == 1:
        return writer.date("ts", times[0].ms)
    if (
        writer.open("ts")
        or writer.date("$gte", times[0].ms)
        or writer.date("$lte", times[count - 1].ms)
        or writer.open_array("$in")
    ):
        return 1
    for k in range(count):
        if writer.date(_INDEX[k], times[k].ms):
            return 1
    return writer.close() or writer.close()


def ids_of(prefix: bytes, start: int, count: int) -> list[ObjectId]:
    """``count`` ObjectIds: ``prefix`` then the counters from ``start`` (24 bits, wrapping).

    ``ObjectId()`` costs several times more per id: it reads the clock, checks the pid
    and takes a lock for every one; ``ObjectId(bytes)`` checks its argument in Python.
    Here each id's 12 bytes are set in its slot.
    """
    if type(prefix) is not bytes or type(start) is not int:
        raise TypeError(
            f"an ObjectId prefix and counter are bytes and int, not "
            f"{type(prefix).__name__} and {type(start).__name__}"
        )
    if len(prefix) != _PREFIX_BYTES:
        raise ValueError(f"an ObjectId prefix is {_PREFIX_BYTES} bytes, not {len(prefix)}")
    new = _new
    ids: list[ObjectId] = []
    append = ids.append
    for counter in range(start, start + count):
        oid = new(ObjectId)
        oid._ObjectId__id = (  # type: ignore[attr-defined]  # noqa: SLF001 - its one slot
            prefix + (counter & 0xFFFFFF).to_bytes(3, "big")
        )
        append(oid)
    return ids

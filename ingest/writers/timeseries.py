"""Time-series mode (the bridge): one document per reading in a native time-series collection.

Documents are ``{"ts", "meta": {"sensor_id", <tags>?}, "seq"?, "units"?, <measurements in
name order>}``:
a stable field order and no null or empty fields, because a change of a field's type
closes MongoDB's internal bucket early. A batch is sorted by sensor and time and sent with
one unordered bulk insert (:mod:`ingest.writers.bulk`) so MongoDB's bucket catalog fills
buckets densely. A partial failure retries only the documents that failed with a
transient error.

A time-series collection has no unique index, so a reading written twice is stored twice.
The daemon knows when that can happen (a message redelivered with DUP, a write retried
after a failure that may have come after it landed); for exactly those readings,
:meth:`TimeseriesWriter.skip_stored` first looks up which are stored (the
``{meta.sensor_id, ts}`` index serves it) and only the rest are inserted. The normal
path sends no lookup.
"""

from __future__ import annotations

import os
import time
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from bson.errors import InvalidDocument
from bson.objectid import ObjectId
from pymongo import ReadPreference
from pymongo.errors import PyMongoError

from ingest import mongo_errors
from ingest.writers import Outcome, Plan, Singles, bulk, send
from ingest.writers.bucket import bson_dates, ts_key

if TYPE_CHECKING:
    from pymongo.asynchronous.collection import AsyncCollection

    from ingest.model import Reading
    from ingest.schema import Schema


_BY_SENSOR_AND_TIME = attrgetter("sensor_id", "epoch")
_new_object = object.__new__

# Sensors per duplicate lookup: a redelivery burst becomes several small queries.
LOOKUP_SENSORS = 256

# Field names of a reading in name order, by their order in the payload (bounded: names
# are validated, but a fleet may invent many).
_SORTED: dict[tuple[str, ...], tuple[str, ...] | None] = {}
_SORTED_LIMIT = 10_000


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


def documents(readings: list[Reading]) -> list[dict[str, Any]]:
    """:func:`reading_document` for each reading, each with a new ``_id`` first.

    The same documents, built with less work for readings without tags or units: the
    sorted field order is looked up once per field list, one ``meta`` object is shared by
    a sensor's documents (nothing changes them), and ``ts`` is a
    :class:`~ingest.writers.bucket.BsonDate`. The ``_id`` is what the driver would add
    (see :func:`object_ids`); given here, the driver does not make one per document.
    """
    ids = object_ids(len(readings))
    dates = bson_dates(readings)
    metas: dict[str, dict[str, Any]] = {}
    sorted_names = _SORTED
    docs: list[dict[str, Any]] = []
    append = docs.append
    for oid, date, reading in zip(ids, dates, readings, strict=True):
        if reading.tags or reading.units is not None:
            append({"_id": oid, **reading_document(reading)})
            continue
        sensor = reading.sensor_id
        meta = metas.get(sensor)
        if meta is None:
            meta = metas[sensor] = {"sensor_id": sensor}
        values = reading.values
        names = tuple(values)
        try:
            order = sorted_names[names]
        except KeyError:
            order = _sorted_names(names)
        if reading.seq is None:
            doc = {"_id": oid, "ts": date, "meta": meta}
        else:
            doc = {"_id": oid, "ts": date, "meta": meta, "seq": reading.seq}
        if order is None:
            doc.update(values)
        else:
            for name in order:
                doc[name] = values[name]
        append(doc)
    return docs


class _IdState:
    """The per-process part of the ObjectIds this module makes."""

    pid = -1
    random = b""
    counter = 0


def object_ids(count: int) -> list[ObjectId]:
    """``count`` new ObjectIds as the BSON spec makes them (and the driver would).

    4 bytes of seconds, 5 random bytes drawn once per process, a 3-byte counter from a
    random start. ``ObjectId()`` costs several times more per id: it reads the clock,
    checks the pid and takes a lock for every one; ``ObjectId(bytes)`` checks its
    argument in Python. Here each id's 12 bytes are one integer's, set in its slot.
    """
    state = _IdState
    pid = os.getpid()
    if state.pid != pid:  # a new process (fork): new random bytes, as the driver does
        state.pid, state.random = pid, os.urandom(5)
        state.counter = int.from_bytes(os.urandom(3), "big")
    # seconds (32 bits), random (40), counter (24): the id as one big-endian integer
    head = (int(time.time()) & 0xFFFFFFFF) << 64 | int.from_bytes(state.random, "big") << 24
    start = state.counter
    state.counter = (start + count) & 0xFFFFFF
    new = _new_object
    ids: list[ObjectId] = []
    append = ids.append
    for counter in range(start, start + count):
        oid = new(ObjectId)
        oid._ObjectId__id = (  # type: ignore[attr-defined]  # noqa: SLF001 - its one slot
            head | counter & 0xFFFFFF).to_bytes(12, "big")
        append(oid)
    return ids


class TimeseriesWriter:
    """Inserts one document per reading."""

    mode = "timeseries"

    def __init__(self, collection: AsyncCollection[dict[str, Any]], schema: Schema) -> None:
        self._collection = collection
        # The lookup must see what the primary just acknowledged.
        self._primary_coll: AsyncCollection[dict[str, Any]] | None = None
        self._schema = schema

    def _primary(self) -> AsyncCollection[dict[str, Any]]:
        """The collection, read from the primary whatever its read preference says."""
        if self._primary_coll is None:
            self._primary_coll = self._collection.with_options(
                read_preference=ReadPreference.PRIMARY)
        return self._primary_coll

    async def ensure_schema(self) -> None:
        """Create (or check) the time-series collection and its index."""
        await self._schema.ensure_timeseries()

    def plan(self, readings: list[Reading]) -> Plan:
        """One document per reading, sorted by sensor and time."""
        ordered = sorted(readings, key=_BY_SENSOR_AND_TIME)
        return Plan(documents(ordered), Singles(ordered))

    async def write(self, plan: Plan) -> Outcome:
        """Send the plan in one unordered bulk insert."""
        return await send(bulk.execute(self._collection, bulk.INSERT, plan.ops), plan)

    async def skip_stored(self, readings: list[Reading]) -> list[Reading]:
        """Those of ``readings`` not stored yet: same sensor, ts, seq and values.

        One ``find`` per ``LOOKUP_SENSORS`` sensors, each clause a sensor and its times
        (the ``{meta.sensor_id, ts}`` index, and the time range prunes buckets).
        """
        by_sensor: dict[str, list[Reading]] = {}
        for reading in readings:
            by_sensor.setdefault(reading.sensor_id, []).append(reading)
        groups = list(by_sensor.items())
        stored: set[tuple[Any, ...]] = set()
        for start in range(0, len(groups), LOOKUP_SENSORS):
            query = {"$or": [
                {"meta.sensor_id": sensor,
                 "ts": {"$gte": min(r.ts for r in group), "$lte": max(r.ts for r in group),
                        "$in": [r.ts for r in group]}}
                for sensor, group in groups[start:start + LOOKUP_SENSORS]]}
            try:
                docs = await self._primary().find(query, {"_id": 0}).to_list()
            except (PyMongoError, InvalidDocument) as exc:
                raise mongo_errors.translate(exc, "lookup") from exc
            stored.update(_identity(doc) for doc in docs)
        return [r for r in readings if _identity(reading_document(r)) not in stored]

def _identity(doc: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two time-series documents the same reading (field order aside)."""
    values = tuple(sorted((k, v) for k, v in doc.items() if k not in {"ts", "meta", "_id"}))
    return doc["meta"]["sensor_id"], ts_key(doc["ts"]), values

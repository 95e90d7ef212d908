"""Bucket mode: one document per series per span, upserted with running statistics.

A series is a sensor id and its identity tags: a document's key is ``sensor_id``,
``tags`` (the identity tags in name order, ``{}`` for none) and ``bucket_start``, and its
tags are exactly the series' own. A batch is coalesced so that all readings of one
series-span become one upsert
(``$push``/``$each``, ``$inc``, ``$min``, ``$max``, ``$setOnInsert``), all sent in one
unordered bulk write (:mod:`ingest.store.writers.bulk`). A document never holds more than
``max_readings``: the filter only matches a document with room for the whole group
(``count <= max - n``); otherwise the upsert starts a new document with the same
``sensor_id``, ``tags`` and ``bucket_start``. The match and the update are one atomic step per
document, so concurrent writers never overfill a document; at worst they start two
documents for one span, which readers sum.

Writes are idempotent. A reading is identified by its series and its instant (the
millisecond, as BSON stores it), and one instant of a series is one entry of
``readings`` (:mod:`ingest.store.writers.instants`): readings that meet within a batch are
merged before writing, and no instant is ever stored twice:

- within a document, the filter only matches a document holding none of the group's
  timestamps (``readings.ts: {$nin: [...]}``);
- across documents, the unique index ``{sensor_id: 1, tags: 1, readings.ts: 1}``
  refuses, with a duplicate-key error, any update or insert that would store a stored
  instant again.

Either check makes the whole update fail atomically, counts and statistics included. The
writer then looks up the stored entries at those instants (:meth:`BucketWriter.settle`):
a reading whose fields are all stored with the same values is a duplicate (a redelivery
after a crash, or a retried write whose first attempt did land); one with a stored field
of another value is refused as ``ts_conflict``; one that only adds fields is merged into
the stored entry (``$set`` of ``readings.$.<field>`` and its statistics, matched only
while those fields are absent, so a retried merge never applies twice); the rest are
written again.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from functools import reduce
from operator import add, attrgetter
from typing import TYPE_CHECKING, Any, cast

from bson.datetime_ms import DatetimeMS
from bson.errors import InvalidDocument
from pymongo.errors import PyMongoError

from ingest import accel
from ingest.errors import WriteError
from ingest.store import mongo_errors
from ingest.store.schema import BUCKET_INDEX, READINGS_INDEX
from ingest.store.writers import Outcome, Plan, PrimaryReads, bulk, send
from ingest.store.writers.instants import (
    NO_TAGS,
    TagsKey,
    merge_series,
    new_fields,
    stored_values,
    tags_key,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, KeysView

    from pymongo.asynchronous.collection import AsyncCollection

    from ingest.model import Reading
    from ingest.store.schema import Schema

logger = logging.getLogger(__name__)
# 2: the series' tags are part of a document's key (``tags``, always present), sensor
# ids are kept exactly, one entry per instant.
SCHEMA_VERSION = 2
# Estimated BSON bytes of one document (its readings, and the statistics and units their
# measurements add): half of MongoDB's 16 MiB limit, so the estimate can be off by 2x and
# an update still fits (the key's tags and info are bounded: 32 of 256 bytes each).
MAX_BUCKET_BYTES = 8 * 1024 * 1024
# Rounds of "write, settle the collisions, write what is left" before giving the rest
# back to the pipeline's retry loop (only a writer racing on the very same readings
# could make a round settle nothing).
SETTLE_ROUNDS = 3
SETTLE_CONCURRENCY = 16
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_new = object.__new__
_ms_of = attrgetter("ms")
_EMPTY: dict[str, str] = {}  # the tags of a series without any (shared, never changed)


def ts_key(ts: datetime | DatetimeMS) -> int:
    """A timestamp as BSON stores it: whole milliseconds since the epoch (floored)."""
    if isinstance(ts, DatetimeMS):  # a BsonDate of a document built here
        return int(ts)
    if ts.tzinfo is None:  # a client without tz_aware returns naive UTC datetimes
        ts = ts.replace(tzinfo=UTC)
    return (ts - _EPOCH) // _MS


def bson_date_int_py(date: BsonDate) -> int:
    """``int()`` of a :class:`BsonDate`: its milliseconds, which pymongo's encoder writes."""
    return date.ms


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

    # The encoder calls it for every date it writes; the compiled twin spares it a frame.
    __int__ = accel.pick(bson_date_int_py, "ingest.store.writers._bucket_c", "bson_date_int")

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


def bson_date(ms: int) -> BsonDate:
    """A :class:`BsonDate` of ``ms`` milliseconds since the epoch."""
    date = _new(BsonDate)
    date.ms = ms
    return date


def bson_dates(readings: list[Reading]) -> list[BsonDate]:
    """The readings' times as :class:`BsonDate` objects, in order."""
    new, out = _new, []
    for reading in readings:
        date = new(BsonDate)
        date.ms = reading.ms if reading.ms is not None else ts_key(reading.ts)
        out.append(date)
    return out


def reading_bytes(reading: Reading) -> int:
    """Upper estimate of what a reading adds to its document's BSON size.

    Its entry in ``readings`` and, for each of its measurements, the ``stats.<m>`` entry
    (and ``units.<m>``) it may add: a document whose readings each bring new names grows
    by its statistics as much as by its readings.
    """
    # entry: array index key and sub-document framing ~16, ts 12, seq 13, each value
    # 10 + name; stats.<m>: {count, sum, min, max} 60 + name
    values = reading.values
    size = 41 + 70 * len(values) + 2 * sum(map(len, values))
    if reading.tags is not None:  # the mapping path: strings too (UTF-8: 4 bytes a character)
        size += sum([len(v) * 4 for v in values.values() if type(v) is str])
        if reading.units:
            size += sum(len(m) + 7 + 4 * len(u) for m, u in reading.units.items())
        if reading.info:
            size += sum(len(k) + 7 + 4 * len(v) for k, v in reading.info.items())
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


type GroupKey = tuple[str, TagsKey, float]


def group_readings(readings: list[Reading], span: int) -> dict[GroupKey, list[Reading]]:
    """Group readings by series and span, keeping arrival order inside each group."""
    groups: dict[GroupKey, list[Reading]] = {}
    last_sensor: str | None = None
    last_tags: dict[str, str] | None = None
    last_start = 0.0
    group: list[Reading] = []
    keys: dict[int, TagsKey] = {}  # by id() of a tags dict: topics share theirs
    for reading in readings:
        sensor = reading.sensor_id
        tags = reading.tags
        start = reading.epoch // span * span
        # A message's readings come one after the other, of one series (the same string
        # and tags objects) and mostly of one span: no key to build and look up for those.
        if sensor is last_sensor and tags is last_tags and start == last_start:
            group.append(reading)
            continue
        if not tags:
            tags_of = NO_TAGS
        else:
            found_key = keys.get(id(tags))
            if found_key is None:
                found_key = keys[id(tags)] = tags_key(tags)
            tags_of = found_key
        key = (sensor, tags_of, start)
        found = groups.get(key)
        if found is None:
            group = groups[key] = [reading]
        else:
            group = found
            group.append(reading)
        last_sensor, last_tags, last_start = sensor, tags, start
    return groups


def ms_of(reading: Reading) -> int:
    """A reading's instant: whole milliseconds since the epoch."""
    return reading.ms if reading.ms is not None else ts_key(reading.ts)


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


def chunks(group: list[Reading], max_readings: int) -> list[tuple[list[Reading], int]]:
    """Split one sensor-span's readings so each piece fits one document: (readings, bytes)."""
    out: list[tuple[list[Reading], int]] = []
    chunk: list[Reading] = []
    size = 0
    for reading in group:
        values = reading.values
        # reading_bytes, inlined for the default decoder's readings (numbers only)
        grow = (
            41 + 70 * len(values) + 2 * sum(map(len, values))
            if reading.tags is None
            else reading_bytes(reading)
        )
        if chunk and (len(chunk) >= max_readings or size + grow > MAX_BUCKET_BYTES):
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
) -> dict[str, Any]:
    """One upsert that appends ``chunk`` to a document of that series-span with room for it.

    Room means both fewer than ``max_readings - n`` readings and fewer than
    ``MAX_BUCKET_BYTES - size`` estimated bytes, so no document outgrows MongoDB's limit,
    and none of the chunk's timestamps, so no document holds a reading twice.

    Returned as the update command's statement (:func:`statement`), which
    :mod:`ingest.store.writers.bulk` sends.
    """
    if len(chunk) == 1:  # the common case of a large fleet: no coalescing to do
        reading = chunk[0]
        date = _new(BsonDate)
        date.ms = reading.ms if reading.ms is not None else ts_key(reading.ts)
        dates = [date]
        inc, mins, maxs, labels = _single(reading, size)
        mins["first_ts"] = maxs["last_ts"] = date
        # reading_doc's document, with the BSON date
        pushed = [
            {"ts": date, **reading.values}
            if reading.seq is None
            else {"ts": date, "seq": reading.seq, **reading.values}
        ]
    else:
        dates = bson_dates(chunk)
        inc, mins, maxs, labels = _coalesced(chunk, size)
        mins["first_ts"] = min(dates, key=_ms_of)
        maxs["last_ts"] = max(dates, key=_ms_of)
        # reading_doc's documents, with the BSON dates
        pushed = [
            {"ts": d, **r.values} if r.seq is None else {"ts": d, "seq": r.seq, **r.values}
            for d, r in zip(dates, chunk, strict=True)
        ]
    return statement(
        sensor_id, tags, start, dates, pushed, size, max_readings, (inc, mins, maxs, labels)
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
            "bytes": {"$lte": max(MAX_BUCKET_BYTES - size, 0)},
            "readings.ts": {"$nin": dates},
        },
        "u": update,
        "multi": False,
        "upsert": True,
        "hint": BUCKET_INDEX,
    }


def _by_reading(group: list[Reading], labels: dict[str, str] | None = None) -> dict[str, list[Any]]:
    """Each measurement's ``[count, sum, min, max]``, reading by reading.

    Readings of the mapping path (tags not None) count booleans as 0/1 and strings not
    at all; their units go to ``labels`` when it is given.
    """
    acc: dict[str, list[Any]] = {}
    for reading in group:
        values = reading.values
        if reading.tags is not None:
            values = stat_values(values)
            if labels is not None:
                _label(reading, labels)
        for name, value in values.items():
            stat = acc.get(name)
            if stat is None:
                acc[name] = [1, float(value), value, value]
                continue
            stat[0] += 1
            stat[1] += value
            if value < stat[2]:
                stat[2] = value
            elif value > stat[3]:
                stat[3] = value
    return acc


def _by_column(group: list[Reading]) -> dict[str, list[Any]]:
    """:func:`_by_reading` of readings that all have the same names, a column at a time.

    The same figures: the sum is added up in reading order from the first value as a
    float, and ``min``/``max`` keep the first of equal values, as :func:`_by_reading`.
    """
    count = len(group)
    acc: dict[str, list[Any]] = {}
    for name in group[0].values:
        column = [reading.values[name] for reading in group]
        acc[name] = [count, reduce(add, column[1:], float(column[0])), min(column), max(column)]
    return acc


def _one_update(
    sensor_id: str, tags: dict[str, str], start: BsonDate, reading: Reading, max_readings: int
) -> dict[str, Any] | None:
    """:func:`_fast_update` of a group of one reading (a large fleet's usual group).

    :func:`update_for` without the splitting and settling a group of one never needs.
    """
    if reading.ms is None or reading.tags is not None:
        return None
    size = reading_bytes(reading)
    if size > MAX_BUCKET_BYTES:
        return None
    return update_for(sensor_id, tags, start, [reading], max_readings, size)


def _fast_update(
    sensor_id: str, tags: dict[str, str], start: BsonDate, group: list[Reading], max_readings: int
) -> dict[str, Any] | None:
    """:func:`update_for` of a whole group in one pass, for the default decoder's readings.

    For a group whose readings are numbers only (no tags), all timed in milliseconds,
    each at its own millisecond, and that fit one document; otherwise None (the general
    path then splits, settles repeats and labels). Builds the same statement.
    """
    count = len(group)
    if count == 1:
        return _one_update(sensor_id, tags, start, group[0], max_readings)
    times = [reading.ms for reading in group]
    if count > max_readings or None in times or len(set(times)) < count:
        return None
    stamps = cast("list[int]", times)
    new, date_type = _new, BsonDate
    dates: list[BsonDate] = []
    pushed: list[dict[str, Any]] = []
    size = grow = 0
    names: KeysView[str] | None = None
    uniform = True  # every reading has the same measurement names
    for reading, ms in zip(group, stamps, strict=True):
        if reading.tags is not None:
            return None
        date = new(date_type)
        date.ms = ms
        dates.append(date)
        values = reading.values
        if values.keys() != names:  # the same names have the same reading_bytes
            uniform = names is None
            names = values.keys()
            grow = reading_bytes(reading)
        size += grow
        pushed.append(
            {"ts": date, **values}
            if reading.seq is None
            else {"ts": date, "seq": reading.seq, **values}
        )
    if size > MAX_BUCKET_BYTES:
        return None
    acc = _by_column(group) if uniform and count > 2 else _by_reading(group)
    inc, mins, maxs = _statistics(acc, count, size, bson_date(min(stamps)), bson_date(max(stamps)))
    return statement(
        sensor_id, tags, start, dates, pushed, size, max_readings, (inc, mins, maxs, {})
    )


type _Stats = tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, str]]


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
    values = reading.values
    if reading.tags is not None:  # the mapping path: booleans as 0/1, no strings
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
    acc = _by_reading(chunk, labels)
    inc, mins, maxs = _statistics(acc, len(chunk), size, None, None)  # dates: update_for
    return inc, mins, maxs, labels


def _statistics(
    acc: dict[str, list[Any]], count: int, size: int, first: BsonDate | None, last: BsonDate | None
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``$inc``, ``$min`` and ``$max`` of a group from its measurements' statistics."""
    inc: dict[str, Any] = {"count": count, "bytes": size}
    mins: dict[str, Any] = {"first_ts": first}
    maxs: dict[str, Any] = {"last_ts": last}
    keys_of = _STAT_KEYS
    for name, (n, total, smallest, largest) in acc.items():
        keys = keys_of.get(name) or _stat_keys(name)
        inc[keys[0]] = n
        inc[keys[1]] = total
        mins[keys[2]] = smallest
        maxs[keys[3]] = largest
    return inc, mins, maxs


def plan_buckets_py(readings: list[Reading], span: int, max_readings: int) -> Plan:
    """One upsert per series-span of ``span`` seconds (more only past ``max_readings``).

    The statements, each with the readings it carries, and the readings deferred to a
    later round (:func:`unique_readings`).
    """
    ops: list[Any] = []
    groups: list[list[Reading]] = []
    plan = Plan(ops, groups)
    for (sensor_id, tags_of, start), group in group_readings(readings, span).items():
        start_dt = bson_date(int(start) * 1000)
        tags = dict(tags_of) if tags_of else _EMPTY
        op = _fast_update(sensor_id, tags, start_dt, group, max_readings)
        if op is not None:
            ops.append(op)
            groups.append(group)
            continue
        unique, sources = unique_readings(group, plan)
        for chunk, size in chunks(unique, max_readings):
            ops.append(update_for(sensor_id, tags, start_dt, chunk, max_readings, size))
            groups.append(
                chunk if sources is None else [o for reading in chunk for o in sources[id(reading)]]
            )
    return plan


# The compiled twin (_bucket_c.pyx) builds the same statements; it reads this module's
# names (MAX_BUCKET_BYTES at every call) and falls back to plan_buckets_py for input
# outside the shapes it handles.
plan_buckets = accel.pick(plan_buckets_py, "ingest.store.writers._bucket_c", "plan_buckets")


class BucketWriter(PrimaryReads):
    """Writes coalesced bucket upserts."""

    mode = "bucket"

    def __init__(
        self,
        collection: AsyncCollection[dict[str, Any]],
        schema: Schema,
        span_seconds: int,
        max_readings: int,
    ) -> None:
        self._collection = collection
        self._schema = schema
        self._span = span_seconds
        self._max = max_readings

    async def ensure_schema(self) -> None:
        """Create the bucket collection, its validator and indexes."""
        await self._schema.ensure_buckets()

    def plan(self, readings: list[Reading]) -> Plan:
        """Coalesce a batch into one upsert per sensor-span (more only past the cap)."""
        return plan_buckets(readings, self._span, self._max)

    async def write(self, plan: Plan) -> Outcome:
        """Send the plan in one unordered bulk write; settle readings already stored.

        Operations refused with a duplicate key are settled (:meth:`settle`) and what is
        not stored yet is planned and sent again, for up to ``SETTLE_ROUNDS`` rounds;
        the plan's deferred readings follow in rounds of their own.
        """
        outcome = Outcome()
        settled = 0
        while True:
            result = await self._send(plan)
            outcome.add(result, plan)
            collided = [plan.groups[i] for i in result.collided]
            pending: list[Reading] = []
            if collided:
                if settled == SETTLE_ROUNDS:  # still racing: the pipeline retries the rest
                    outcome.retry.extend(r for group in collided for r in group)
                else:
                    try:
                        pending = await self.settle(collided, outcome)
                    except WriteError as exc:  # the pipeline retries them after a backoff
                        outcome.retry.extend(r for group in collided for r in group)
                        outcome.error = exc
                    # Only a round that settles nothing counts towards the limit (a
                    # racing writer); one that settles some readings made progress.
                    settled += len(pending) == sum(map(len, collided))
            if outcome.retry:  # deferred readings come after the ones to retry
                outcome.retry.extend(pending + plan.deferred)
                break
            pending.extend(plan.deferred)
            if not pending:
                break
            plan = self.plan(pending)
        return outcome

    def take_lookups(self) -> tuple[int, float]:
        """None: the unique index finds stored instants; settle looks only those up."""
        return 0, 0.0

    async def _send(self, plan: Plan) -> Outcome:
        return await send(bulk.execute(self._collection, bulk.UPDATE, plan.ops), plan, collide=True)

    async def settle(self, groups: list[list[Reading]], outcome: Outcome) -> list[Reading]:
        """Sort readings refused with a duplicate key: stored already, conflicting, or not.

        Raises :class:`WriteError` if a lookup fails (nothing is counted then). Stored
        duplicates are counted in ``outcome.duplicates``, conflicts go to
        ``outcome.conflicts``, readings that add fields to a stored instant are merged
        into it (counted in ``outcome.written``); a reading whose merge failed goes to
        ``outcome.retry`` with the error. The readings not stored are returned, to be
        written again (with those whose merge found the entry changed meanwhile).
        """
        limit = asyncio.Semaphore(SETTLE_CONCURRENCY)

        async def lookup(group: list[Reading]) -> dict[int, tuple[Any, dict[str, Any]]]:
            async with limit:
                return await self.stored(group)

        found = await _all([lookup(group) for group in groups])
        fresh, merges, duplicates, conflicts = _sort_stored(groups, found)
        if duplicates or conflicts or merges:
            logger.info(
                "settled %d readings at stored instants: %d duplicates, %d conflicts, %d merged",
                duplicates + len(conflicts) + len(merges),
                duplicates,
                len(conflicts),
                len(merges),
            )
        if merges:

            async def merge(reading: Reading, doc_id: Any, new: dict[str, Any]) -> bool:  # noqa: ANN401
                async with limit:
                    return await self._merge(reading, doc_id, new)

            done = await asyncio.gather(*[merge(*m) for m in merges], return_exceptions=True)
            for (reading, _, _), applied in zip(merges, done, strict=True):
                if isinstance(applied, WriteError):  # retried; the merges that landed count
                    outcome.retry.append(reading)
                    outcome.error = applied
                elif isinstance(applied, BaseException):
                    raise applied
                elif applied:
                    outcome.written += 1
                else:
                    fresh.append(reading)
        outcome.duplicates += duplicates
        outcome.conflicts.extend(conflicts)
        return fresh

    async def _merge(self, reading: Reading, doc_id: Any, new: dict[str, Any]) -> bool:  # noqa: ANN401
        """Add ``new`` fields to the stored entry of the reading's instant in ``doc_id``.

        Matched only while the entry lacks every one of them, so a merge retried after it
        landed changes nothing (False: settle that reading again).
        """
        date = bson_date(ms_of(reading))
        part = reading._replace(values=new)
        inc, mins, maxs, labels = _single(part, reading_bytes(part) - 41)  # no new entry
        del inc["count"], mins["first_ts"], maxs["last_ts"]
        update: dict[str, Any] = {
            op: fields for op, fields in (("$inc", inc), ("$min", mins), ("$max", maxs)) if fields
        }
        update["$set"] = {f"readings.$.{k}": v for k, v in new.items()} | labels
        query = {
            "_id": doc_id,
            "readings": {"$elemMatch": {"ts": date, **{k: {"$exists": False} for k in new}}},
        }
        try:
            result = await self._collection.update_one(query, update)
        except (PyMongoError, InvalidDocument) as exc:
            raise mongo_errors.translate(exc, "write") from exc
        return result.matched_count == 1

    async def stored(self, group: list[Reading]) -> dict[int, tuple[Any, dict[str, Any]]]:
        """Stored ``readings`` entries of one series at the group's instants, by instant.

        Each with the ``_id`` of the document that holds it.
        """
        first = group[0]
        dates = [bson_date(ms_of(r)) for r in group]
        low, high = min(dates, key=_ms_of), max(dates, key=_ms_of)
        tags = dict(tags_key(first.tags))
        pipeline: list[dict[str, Any]] = [
            {"$match": {"sensor_id": first.sensor_id, "tags": tags, "readings.ts": {"$in": dates}}},
            {
                "$project": {
                    "_id": 1,
                    "readings": {
                        "$filter": {
                            "input": "$readings",
                            "as": "r",
                            "cond": {
                                "$and": [{"$gte": ["$$r.ts", low]}, {"$lte": ["$$r.ts", high]}]
                            },
                        }
                    },
                }
            },
        ]
        try:
            cursor = await self._primary().aggregate(pipeline, hint=READINGS_INDEX)
            return {
                ts_key(entry["ts"]): (doc["_id"], entry)
                async for doc in cursor
                for entry in doc["readings"]
            }
        except (PyMongoError, InvalidDocument) as exc:
            raise mongo_errors.translate(exc, "lookup") from exc


type _Merge = tuple["Reading", Any, dict[str, Any]]


def _sort_stored(
    groups: list[list[Reading]], found: list[dict[int, tuple[Any, dict[str, Any]]]]
) -> tuple[list[Reading], list[_Merge], int, list[tuple[Reading, str]]]:
    """Each reading against the stored entry of its instant, if any.

    Returns the readings not stored, the merges to make (reading, document, new fields),
    how many are duplicates, and the conflicts. A later reading of one instant meets
    the entry with the fields of the earlier merges.
    """
    fresh: list[Reading] = []
    merges: list[_Merge] = []
    duplicates = 0
    conflicts: list[tuple[Reading, str]] = []
    for group, stored in zip(groups, found, strict=True):
        for reading in group:
            hit = stored.get(ms_of(reading))
            if hit is None:
                fresh.append(reading)
                continue
            doc_id, entry = hit
            new = new_fields(reading, stored_values(entry))
            if isinstance(new, str):
                conflicts.append((reading, new))
            elif not new:
                duplicates += 1
            else:
                merges.append((reading, doc_id, new))
                entry.update(new)
    return fresh, merges, duplicates, conflicts


async def _all[T](requests: list[Awaitable[T]]) -> list[T]:
    """The results of ``requests`` run together; the first failure raised after all end."""
    results = await asyncio.gather(*requests, return_exceptions=True)
    out: list[T] = []
    for result in results:
        if isinstance(result, BaseException):
            raise result
        out.append(result)
    return out

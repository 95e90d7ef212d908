"""Bucket mode: one document per sensor per span, upserted with running statistics.

A batch is coalesced so that all readings of one sensor-span become one upsert
(``$push``/``$each``, ``$inc``, ``$min``, ``$max``, ``$setOnInsert``), all sent in one
unordered bulk write (:mod:`ingest.writers.bulk`). A document never holds more than
``max_readings``: the filter only matches a document with room for the whole group
(``count <= max - n``); otherwise the upsert starts a new document with the same
``sensor_id`` and ``bucket_start``. The match and the update are one atomic step per
document, so concurrent writers never overfill a document; at worst they start two
documents for one span, which readers sum.

Writes are idempotent. A reading is identified by its sensor and its timestamp (to the
millisecond, as BSON stores it), and no reading is ever stored twice:

- within a document, the filter only matches a document holding none of the group's
  timestamps (``readings.ts: {$nin: [...]}``);
- across documents, the unique index ``{sensor_id: 1, readings.ts: 1}`` refuses, with a
  duplicate-key error, any update or insert that would store a stored reading again.

Either check makes the whole update fail atomically, counts and statistics included. The
writer then looks up which readings of that group are stored (:meth:`BucketWriter.settle`):
identical ones are dropped and counted as duplicates (a redelivery after a crash, or a
retried write whose first attempt did land), ones with other values are refused as
``ts_conflict``, and the rest are written again.
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
from pymongo import ReadPreference
from pymongo.errors import PyMongoError

from ingest import mongo_errors
from ingest.errors import WriteError
from ingest.schema import BUCKET_INDEX, READINGS_INDEX
from ingest.writers import Outcome, Plan, bulk, send

if TYPE_CHECKING:
    from collections.abc import KeysView

    from pymongo.asynchronous.collection import AsyncCollection

    from ingest.model import Reading
    from ingest.schema import Schema

logger = logging.getLogger(__name__)
SCHEMA_VERSION = 1
# Estimated BSON bytes of readings one document may hold: half of MongoDB's 16 MiB limit,
# so the estimate can be off by 2x and an update still fits.
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


def ts_key(ts: datetime) -> int:
    """A timestamp as BSON stores it: whole milliseconds since the epoch (floored)."""
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


def same_values(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two readings' values are the same, ``True`` and ``1`` being different."""
    if a != b:
        return False
    return all((type(value) is bool) is (type(b[name]) is bool) for name, value in a.items())


def same_reading(reading: Reading, stored: dict[str, Any]) -> bool:
    """Whether a stored ``readings`` entry holds exactly this reading's values and seq."""
    if stored.get("seq") != reading.seq:
        return False
    values = {k: v for k, v in stored.items() if k not in {"ts", "seq"}}
    return same_values(values, reading.values)


def conflict_detail(reading: Reading) -> str:
    """Why a reading whose sensor and time are stored with other values is refused."""
    return (f"sensor {reading.sensor_id} already has a reading at "
            f"{reading.ts.isoformat(timespec='milliseconds')} with other values; "
            "the stored one is kept")


def reading_bytes(reading: Reading) -> int:
    """Upper estimate of a reading's BSON size inside the ``readings`` array."""
    # array index key and sub-document framing ~16, ts 12, seq 13, each value 10 + name
    values = reading.values
    size = 41 + 10 * len(values) + sum(map(len, values))
    if reading.tags is not None:  # the mapping path: strings too (UTF-8: 4 bytes a character)
        size += sum([len(v) * 4 for v in values.values() if type(v) is str])
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


def group_readings(readings: list[Reading], span: int) -> dict[tuple[str, float], list[Reading]]:
    """Group readings by sensor and span, keeping arrival order inside each group."""
    groups: dict[tuple[str, float], list[Reading]] = {}
    last_sensor: str | None = None
    last_start = 0.0
    group: list[Reading] = []
    for reading in readings:
        sensor = reading.sensor_id
        start = reading.epoch // span * span
        # A message's readings come one after the other, of one sensor (the same string
        # object) and mostly of one span: no key to build and look up for those.
        if sensor is last_sensor and start == last_start:
            group.append(reading)
            continue
        key = (sensor, start)
        found = groups.get(key)
        if found is None:
            group = groups[key] = [reading]
        else:
            group = found
            group.append(reading)
        last_sensor, last_start = sensor, start
    return groups


def unique_readings(group: list[Reading], plan: Plan) -> list[Reading]:
    """The group without repeated timestamps: the first reading of each millisecond wins.

    Repeats with the same values are counted in ``plan.duplicates``; repeats with other
    values are refused in ``plan.conflicts``.
    """
    keys = {reading.ms for reading in group}
    if len(keys) == len(group) and None not in keys:
        return group  # the common case (every reading decoded), checked at C speed
    seen: dict[int, Reading] = {}
    for reading in group:
        key = reading.ms if reading.ms is not None else ts_key(reading.ts)
        first = seen.get(key)
        if first is None:
            seen[key] = reading
        elif first.seq == reading.seq and same_values(first.values, reading.values):
            plan.duplicates += 1
        else:
            plan.conflicts.append((reading, conflict_detail(reading)))
    return list(seen.values())


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
        grow = (41 + 10 * len(values) + sum(map(len, values)) if reading.tags is None
                else reading_bytes(reading))
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
    keys = (f"stats.{name}.count", f"stats.{name}.sum", f"stats.{name}.min",
            f"stats.{name}.max")
    if len(_STAT_KEYS) < 10_000:  # names are validated, but a fleet may invent many
        _STAT_KEYS[name] = keys
    return keys


def update_for(sensor_id: str, start: datetime | BsonDate, chunk: list[Reading],
               max_readings: int, size: int) -> dict[str, Any]:
    """One upsert that appends ``chunk`` to a document of that sensor-span with room for it.

    Room means both fewer than ``max_readings - n`` readings and fewer than
    ``MAX_BUCKET_BYTES - size`` estimated bytes, so no document outgrows MongoDB's limit,
    and none of the chunk's timestamps, so no document holds a reading twice.

    Returned as the update command's statement (:func:`statement`), which
    :mod:`ingest.writers.bulk` sends.
    """
    if len(chunk) == 1:  # the common case of a large fleet: no coalescing to do
        reading = chunk[0]
        date = _new(BsonDate)
        date.ms = reading.ms if reading.ms is not None else ts_key(reading.ts)
        dates = [date]
        inc, mins, maxs, labels = _single(reading, size)
        mins["first_ts"] = maxs["last_ts"] = date
        # reading_doc's document, with the BSON date
        pushed = [{"ts": date, **reading.values} if reading.seq is None
                  else {"ts": date, "seq": reading.seq, **reading.values}]
    else:
        dates = bson_dates(chunk)
        inc, mins, maxs, labels = _coalesced(chunk, size)
        mins["first_ts"] = min(dates, key=_ms_of)
        maxs["last_ts"] = max(dates, key=_ms_of)
        # reading_doc's documents, with the BSON dates
        pushed = [
            {"ts": d, **r.values} if r.seq is None else {"ts": d, "seq": r.seq, **r.values}
            for d, r in zip(dates, chunk, strict=True)]
    return statement(sensor_id, start, dates, pushed, size, max_readings,
                     (inc, mins, maxs, labels))


def statement(sensor_id: str, start: datetime | BsonDate, dates: list[BsonDate],
              pushed: list[dict[str, Any]], size: int, max_readings: int,
              stats: _Stats) -> dict[str, Any]:
    """The update command's statement for one bucket upsert, as pymongo builds it.

    ``stats`` are the ``$inc``, ``$min``, ``$max`` and ``$set`` (tags and units) of the
    readings pushed. The filter could also be served by the unique
    ``{sensor_id, readings.ts}`` index, which would scan every reading of the sensor: the
    hint names the index that finds the sensor-span's few documents.
    """
    inc, mins, maxs, labels = stats
    update: dict[str, Any] = {
        "$push": {"readings": {"$each": pushed}},
        "$inc": inc, "$min": mins, "$max": maxs,
        "$setOnInsert": {"schema_version": SCHEMA_VERSION}}
    if labels:
        update["$set"] = labels
    if len(inc) == 2:  # only strings: no statistics, and the validator wants a stats object
        update["$setOnInsert"]["stats"] = {}
    return {"q": {"sensor_id": sensor_id, "bucket_start": start,
                  "count": {"$lte": max_readings - len(dates)},
                  "bytes": {"$lte": max(MAX_BUCKET_BYTES - size, 0)},
                  "readings.ts": {"$nin": dates}},
            "u": update, "multi": False, "upsert": True, "hint": BUCKET_INDEX}


def _by_reading(group: list[Reading], labels: dict[str, str] | None = None
                ) -> dict[str, list[Any]]:
    """Each measurement's ``[count, sum, min, max]``, reading by reading.

    Readings of the mapping path (tags not None) count booleans as 0/1 and strings not
    at all; their tags and units go to ``labels`` when it is given.
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
        acc[name] = [count, reduce(add, column[1:], float(column[0])), min(column),
                     max(column)]
    return acc


def _one_update(sensor_id: str, start: BsonDate, reading: Reading,
                max_readings: int) -> dict[str, Any] | None:
    """:func:`_fast_update` of a group of one reading (a large fleet's usual group).

    :func:`update_for` without the splitting and settling a group of one never needs.
    """
    if reading.ms is None or reading.tags is not None:
        return None
    size = reading_bytes(reading)
    if size > MAX_BUCKET_BYTES:
        return None
    return update_for(sensor_id, start, [reading], max_readings, size)


def _fast_update(sensor_id: str, start: BsonDate, group: list[Reading],
                 max_readings: int) -> dict[str, Any] | None:
    """:func:`update_for` of a whole group in one pass, for the default decoder's readings.

    For a group whose readings are numbers only (no tags), all timed in milliseconds,
    each at its own millisecond, and that fit one document; otherwise None (the general
    path then splits, settles repeats and labels). Builds the same statement.
    """
    count = len(group)
    if count == 1:
        return _one_update(sensor_id, start, group[0], max_readings)
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
        pushed.append({"ts": date, **values} if reading.seq is None
                      else {"ts": date, "seq": reading.seq, **values})
    if size > MAX_BUCKET_BYTES:
        return None
    acc = _by_column(group) if uniform and count > 2 else _by_reading(group)
    inc, mins, maxs = _statistics(acc, count, size, bson_date(min(stamps)),
                                  bson_date(max(stamps)))
    return statement(sensor_id, start, dates, pushed, size, max_readings,
                     (inc, mins, maxs, {}))


type _Stats = tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, str]]


def _label(reading: Reading, labels: dict[str, str]) -> None:
    """Add a reading's tags and units to the ``$set`` (``tags.<k>``, ``units.<m>``).

    Only readings of the mapping path (tags not None) have any; the last one wins.
    """
    if reading.tags:
        for key, value in reading.tags.items():
            labels[f"tags.{key}"] = value
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


def _statistics(acc: dict[str, list[Any]], count: int, size: int, first: BsonDate | None,
                last: BsonDate | None) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
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


class BucketWriter:
    """Writes coalesced bucket upserts."""

    mode = "bucket"

    def __init__(self, collection: AsyncCollection[dict[str, Any]], schema: Schema,
                 span_seconds: int, max_readings: int) -> None:
        self._collection = collection
        # The settle lookup must see the document that just refused a reading: a
        # secondary may not have it yet.
        self._primary_coll: AsyncCollection[dict[str, Any]] | None = None
        self._schema = schema
        self._span = span_seconds
        self._max = max_readings

    def _primary(self) -> AsyncCollection[dict[str, Any]]:
        """The collection, read from the primary whatever its read preference says."""
        if self._primary_coll is None:
            self._primary_coll = self._collection.with_options(
                read_preference=ReadPreference.PRIMARY)
        return self._primary_coll

    async def ensure_schema(self) -> None:
        """Create the bucket collection, its validator and indexes."""
        await self._schema.ensure_buckets()

    def plan(self, readings: list[Reading]) -> Plan:
        """Coalesce a batch into one upsert per sensor-span (more only past the cap)."""
        ops: list[Any] = []
        groups: list[list[Reading]] = []
        plan, limit = Plan(ops, groups), self._max
        for (sensor_id, start), group in group_readings(readings, self._span).items():
            start_dt = bson_date(int(start) * 1000)
            op = _fast_update(sensor_id, start_dt, group, limit)
            if op is not None:
                ops.append(op)
                groups.append(group)
                continue
            for chunk, size in chunks(unique_readings(group, plan), limit):
                ops.append(update_for(sensor_id, start_dt, chunk, limit, size))
                groups.append(chunk)
        return plan

    async def write(self, plan: Plan) -> Outcome:
        """Send the plan in one unordered bulk write; settle readings already stored.

        Operations refused with a duplicate key are settled (:meth:`settle`) and what is
        not stored yet is planned and sent again, for up to ``SETTLE_ROUNDS`` rounds.
        """
        outcome = Outcome()
        for round_no in range(SETTLE_ROUNDS + 1):
            result = await self._send(plan)
            outcome.written += result.written
            outcome.retry.extend(result.retry)
            outcome.refused.extend(result.refused)
            outcome.error = result.error or outcome.error
            outcome.duplicates += plan.duplicates
            outcome.conflicts.extend(plan.conflicts)
            collided = [plan.groups[i] for i in result.collided]
            if not collided:
                break
            if round_no == SETTLE_ROUNDS:  # still racing: the pipeline retries the rest
                outcome.retry.extend(r for group in collided for r in group)
                break
            try:
                fresh = await self.settle(collided, outcome)
            except WriteError as exc:  # the pipeline retries them after a backoff
                outcome.retry.extend(r for group in collided for r in group)
                outcome.error = exc
                break
            if not fresh:
                break
            plan = self.plan(fresh)
        return outcome

    async def skip_stored(self, readings: list[Reading]) -> list[Reading]:
        """All of them: bucket writes settle stored readings themselves (unique index)."""
        return readings

    async def _send(self, plan: Plan) -> Outcome:
        return await send(bulk.execute(self._collection, bulk.UPDATE, plan.ops), plan,
                          collide=True)

    async def settle(self, groups: list[list[Reading]], outcome: Outcome) -> list[Reading]:
        """Sort readings refused with a duplicate key: stored already, conflicting, or not.

        Raises :class:`WriteError` if the lookup fails (nothing is counted then). Stored
        duplicates are counted in ``outcome.duplicates``, conflicts go to
        ``outcome.conflicts``; the readings not stored are returned, to be written again.
        """
        limit = asyncio.Semaphore(SETTLE_CONCURRENCY)

        async def lookup(group: list[Reading]) -> dict[int, dict[str, Any]]:
            async with limit:
                return await self.stored(group)

        results = await asyncio.gather(*(lookup(group) for group in groups),
                                       return_exceptions=True)
        found: list[dict[int, dict[str, Any]]] = []
        for result in results:
            if isinstance(result, BaseException):
                raise result
            found.append(result)
        fresh: list[Reading] = []
        duplicates = 0
        conflicts: list[tuple[Reading, str]] = []
        for group, stored in zip(groups, found, strict=True):
            for reading in group:
                entry = stored.get(ts_key(reading.ts))
                if entry is None:
                    fresh.append(reading)
                elif same_reading(reading, entry):
                    duplicates += 1
                else:
                    conflicts.append((reading, conflict_detail(reading)))
        if duplicates or conflicts:
            logger.info("settled %d readings already stored: %d duplicates, %d conflicts",
                        duplicates + len(conflicts), duplicates, len(conflicts))
        outcome.duplicates += duplicates
        outcome.conflicts.extend(conflicts)
        return fresh

    async def stored(self, group: list[Reading]) -> dict[int, dict[str, Any]]:
        """Stored ``readings`` entries of one sensor within the group's time range, by ts."""
        low = min(r.ts for r in group)
        high = max(r.ts for r in group)
        pipeline: list[dict[str, Any]] = [
            {"$match": {"sensor_id": group[0].sensor_id,
                        "readings.ts": {"$in": [r.ts for r in group]}}},
            {"$project": {"_id": 0, "readings": {"$filter": {
                "input": "$readings", "as": "r",
                "cond": {"$and": [{"$gte": ["$$r.ts", low]}, {"$lte": ["$$r.ts", high]}]},
            }}}},
        ]
        try:
            cursor = await self._primary().aggregate(pipeline, hint=READINGS_INDEX)
            return {ts_key(entry["ts"]): entry
                    async for doc in cursor for entry in doc["readings"]}
        except (PyMongoError, InvalidDocument) as exc:
            raise mongo_errors.translate(exc, "lookup") from exc

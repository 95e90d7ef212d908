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
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from bson.errors import InvalidDocument
from pymongo.errors import PyMongoError

from ingest import accel
from ingest.errors import WriteError
from ingest.store import mongo_errors
from ingest.store.schema import READINGS_INDEX
from ingest.store.writers import Outcome, Plan, PrimaryReads, _bucket_py, bulk, send
from ingest.store.writers._bucket_py import (
    MAX_BUCKET_BYTES,
    SCHEMA_VERSION,
    _single,
    chunks,
    reading_bytes,
)
from ingest.store.writers.instants import new_fields, stored_values, tags_key

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from pymongo.asynchronous.collection import AsyncCollection

    from ingest.model import Reading
    from ingest.store.schema import Schema
    from ingest.store.writers._bucket_py import BsonDate, bson_date, bson_dates, ms_of, ts_key

__all__ = [
    "MAX_BUCKET_BYTES",
    "SCHEMA_VERSION",
    "BsonDate",
    "BucketWriter",
    "bson_date",
    "bson_dates",
    "chunks",
    "ms_of",
    "plan_buckets",
    "reading_bytes",
    "ts_key",
]

logger = logging.getLogger(__name__)
# Rounds of "write, settle the collisions, write what is left" before giving the rest
# back to the pipeline's retry loop (only a writer racing on the very same readings
# could make a round settle nothing).
SETTLE_ROUNDS = 3
SETTLE_CONCURRENCY = 16
_ms_of = attrgetter("ms")

# The plan (ingest/store/writers/_bucket_py.py), compiled as _bucket_c where it was built.
# The dates of the picked module are those the rest of the package makes (the time-series
# writer and its twins too): one class of BsonDate in a running daemon.
_COMPILED = "ingest.store.writers._bucket_c"
plan_buckets = accel.pick(_bucket_py.plan_buckets, _COMPILED, "plan_buckets")
if not TYPE_CHECKING:
    BsonDate = accel.pick(_bucket_py.BsonDate, _COMPILED, "BsonDate")
    bson_date = accel.pick(_bucket_py.bson_date, _COMPILED, "bson_date")
    bson_dates = accel.pick(_bucket_py.bson_dates, _COMPILED, "bson_dates")
    ms_of = accel.pick(_bucket_py.ms_of, _COMPILED, "ms_of")
    ts_key = accel.pick(_bucket_py.ts_key, _COMPILED, "ts_key")


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
        return plan_buckets(readings, self._span, self._max, MAX_BUCKET_BYTES)

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

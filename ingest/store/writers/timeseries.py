"""Time-series mode (the bridge): one document per reading in a native time-series collection.

Documents are ``{"ts", "meta": {"sensor_id", <tags>?}, "seq"?, "units"?, <measurements in
name order>}``:
a stable field order and no null or empty fields, because a change of a field's type
closes MongoDB's internal bucket early. A batch is sorted by sensor and time and sent with
one unordered bulk insert (:mod:`ingest.store.writers.bulk`) so MongoDB's bucket catalog fills
buckets densely. A partial failure retries only the documents that failed with a
transient error.

One instant of a series (its sensor id and tags, ``meta``) is one reading, as in bucket
mode (:mod:`ingest.store.writers.instants`): readings that meet within a batch are merged into
one document. A time-series collection has no unique index, so before each insert the
writer looks up what is stored at the batch's instants (one ``find`` per
``LOOKUP_SENSORS`` sensors, served by the ``{meta.sensor_id, ts}`` index, the batch's
time range pruning buckets): a reading whose fields are all stored with the same values
is a duplicate, one with a stored field of another value is refused (``ts_conflict``),
and one that adds fields is inserted with only those, as a second document at that
instant, which readers merge. So both layouts store and refuse the same readings.

Writers racing on one instant (two workers or daemons given readings of one series and
millisecond at once) would both find it free; so what the lookup leaves to insert is
first claimed (:mod:`ingest.store.writers.claims`): the server lets one claim of an
instant win, and the other writer judges its readings against the winning claim by the
same rules. Within one process, writes of one instant take turns (a write waits for the
one before it to finish), so its own claims never race.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from typing import TYPE_CHECKING, Any

from bson.errors import InvalidDocument
from pymongo.errors import PyMongoError

from ingest import accel
from ingest.errors import WriteError
from ingest.store import mongo_errors
from ingest.store.schema import claims_collection
from ingest.store.writers import (
    Outcome,
    Plan,
    PrimaryReads,
    Singles,
    _timeseries_py,
    bulk,
    send,
)
from ingest.store.writers.bucket import ms_of, ts_key
from ingest.store.writers.claims import Claims, Taken, claim_ids
from ingest.store.writers.instants import (
    NO_TAGS,
    TagsKey,
    merge_series,
    merged,
    new_fields,
    stored_values,
    tags_key,
    with_fields,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence

    from bson.objectid import ObjectId
    from pymongo.asynchronous.collection import AsyncCollection

    from ingest.model import Reading
    from ingest.store.schema import Schema


# Sensors per duplicate lookup: a redelivery burst becomes several small queries.
LOOKUP_SENSORS = 256

type Runs = list[tuple[str, list[Any]]]

# The rules of a batch's documents are in _timeseries_py, compiled as _timeseries_c
# (ingest/accel.py picks; the compiled one writes the documents' BSON bytes).
_COMPILED = "ingest.store.writers._timeseries_c"
reading_document = accel.pick(_timeseries_py.reading_document, _COMPILED, "reading_document")
sorted_readings = accel.pick(_timeseries_py.sorted_readings, _COMPILED, "sorted_readings")
batch_documents = accel.pick(_timeseries_py.batch_documents, _COMPILED, "batch_documents")
lookup_clauses = accel.pick(_timeseries_py.lookup_clauses, _COMPILED, "lookup_clauses")


def documents(readings: list[Reading]) -> list[dict[str, Any]]:
    """:func:`reading_document` for each reading, each with a new ``_id`` first."""
    return _documents(readings)[0]


def _documents(readings: list[Reading]) -> tuple[list[dict[str, Any]], Runs, bool]:
    """:func:`documents`, with what the lookup before the insert needs.

    See :func:`~ingest.store.writers._timeseries_py.batch_documents`; each document gets
    a new ``_id``.
    """
    return batch_documents(readings, *_reserve_ids(len(readings)))


class _IdState:
    """The per-process part of the ObjectIds this module makes."""

    pid = -1
    random = b""
    counter = 0


def _reserve_ids(count: int) -> tuple[bytes, int]:
    """The first 9 bytes and the first counter of ``count`` new ObjectIds.

    As the BSON spec makes them (and the driver would): 4 bytes of seconds, 5 random
    bytes drawn once per process, then a 3-byte counter from a random start, which this
    advances past the ``count`` ids.
    """
    state = _IdState
    pid = os.getpid()
    if state.pid != pid:  # a new process (fork): new random bytes, as the driver does
        state.pid, state.random = pid, os.urandom(5)
        state.counter = int.from_bytes(os.urandom(3), "big")
    start = state.counter
    state.counter = (start + count) & 0xFFFFFF
    return (int(time.time()) & 0xFFFFFFFF).to_bytes(4, "big") + state.random, start


def object_ids(count: int) -> list[ObjectId]:
    """``count`` new ObjectIds as the BSON spec makes them (and the driver would)."""
    return _timeseries_py.ids_of(*_reserve_ids(count), count)


class TimeseriesWriter(PrimaryReads):
    """Inserts one document per reading."""

    mode = "timeseries"

    def __init__(
        self,
        collection: AsyncCollection[dict[str, Any]],
        schema: Schema,
        owner: str | None = None,
        *,
        claims: bool = True,
    ) -> None:
        """A writer into ``collection``.

        ``owner``: the session whose claims it makes (the MQTT client id); by default
        one of its own. ``claims=False``: the lookup alone, right for one writer only.
        """
        self._collection = collection
        self._schema = schema
        self._owner = owner or f"writer-{uuid.uuid4().hex}"
        self._claiming = claims
        self._claims: Claims | None = None
        # The rounds in progress: the end of each, and the instants (claim ids) it holds.
        self._rounds: dict[asyncio.Future[None], set[str] | list[str]] = {}
        # Instants looked up before inserting, and the time it took (see take_lookups).
        self._checked = 0
        self._check_seconds = 0.0

    async def ensure_schema(self) -> None:
        """Create (or check) the time-series collection, its index and the claims."""
        await self._schema.ensure_timeseries()

    def plan(self, readings: list[Reading]) -> Plan:
        """One document per series and instant, sorted by sensor and time."""
        ordered = sorted_readings(readings)
        docs, runs, collided = _documents(ordered)
        if not collided:  # the common case: no two readings of one sensor at one instant
            return Plan(docs, Singles(ordered), lookup=runs)
        pairs, deferred = merge_series(ordered, _instant)
        ordered = [reading for reading, _ in pairs]
        docs, runs, _ = _documents(ordered)
        return Plan(docs, [originals for _, originals in pairs], deferred=deferred, lookup=runs)

    async def write(self, plan: Plan) -> Outcome:
        """Leave out what is stored, claim the rest, insert what the claims leave.

        Each round: the lookup of the plan's instants, their claims, then one unordered
        bulk insert. The plan's deferred readings follow in rounds of their own. Raises
        :class:`WriteError` if the first round's lookup or claims fail (nothing was
        inserted then).
        """
        outcome = Outcome()
        first = True
        while True:
            try:
                plan, result = await self._round(plan)
            except WriteError as exc:
                if first:
                    raise
                # a later round: what the earlier rounds wrote stays counted, and so does
                # what this round's lookup found stored
                outcome.duplicates += plan.duplicates
                outcome.conflicts.extend(plan.conflicts)
                outcome.retry.extend(r for group in plan.groups for r in group)
                outcome.retry.extend(plan.deferred)
                outcome.error = exc
                break
            first = False
            outcome.add(result, plan)
            if outcome.retry:  # deferred readings come after the ones to retry
                outcome.retry.extend(plan.deferred)
                break
            if not plan.deferred:
                break
            plan = self.plan(plan.deferred)
        return outcome

    async def _round(self, plan: Plan) -> tuple[Plan, Outcome]:
        """One round: lookup, claims and insert; the plan as sent, and what it did."""
        if not self._claiming:
            plan, _ = await self._without_stored(plan)
            return plan, await self._insert(plan)
        ids = claim_ids(_firsts(plan.groups))
        async with self._alone(ids):
            looked, stored = await self._without_stored(plan)
            if looked is not plan:
                ids = claim_ids(_firsts(looked.groups))
            plan = looked
            if not plan.ops:
                return plan, Outcome()
            taken = await self._claimed().take(plan.ops, plan.groups, ids, stored, reading_document)
            plan = Plan(
                taken.ops,
                taken.groups,
                plan.duplicates + taken.duplicates,
                plan.conflicts + taken.conflicts,
                plan.deferred,
            )
            result = await self._insert(plan)
        result.retry.extend(taken.retry)
        result.refused.extend(taken.refused)
        if result.refused:
            await self._release(result, taken)
        return plan, result

    async def _insert(self, plan: Plan) -> Outcome:
        """One unordered bulk insert of the plan's documents."""
        if not plan.ops:
            return Outcome()
        return await send(bulk.execute(self._collection, bulk.INSERT, plan.ops), plan)

    def _claimed(self) -> Claims:
        """The claims collection of this writer (made once, when first needed)."""
        if self._claims is None:
            coll = self._collection
            self._claims = Claims(coll.database[claims_collection(coll.name)], self._owner)
        return self._claims

    async def _release(self, result: Outcome, taken: Taken) -> None:
        """Remove the claims made for documents refused for their data."""
        refused = {id(reading) for reading, _ in result.refused}
        await self._claimed().release(
            [
                key
                for key, group in zip(taken.won, taken.groups, strict=True)
                if key is not None and any(id(r) in refused for r in group)
            ]
        )

    @contextlib.asynccontextmanager
    async def _alone(self, instants: list[str]) -> AsyncIterator[None]:
        """Hold ``instants`` (claim ids) for one round, once no other round holds one.

        Two rounds of one session on one instant would each take the other's claim for
        an earlier attempt of its own; taking turns, the later one's lookup finds what
        the earlier one stored.
        """
        rounds = self._rounds
        # A set only while another round is in progress to compare with: alone, the list.
        held: set[str] | list[str] = instants
        while rounds:
            if not isinstance(held, set):
                held = set(held)
            ahead = [done for done, theirs in rounds.items() if not held.isdisjoint(theirs)]
            if not ahead:
                break
            await asyncio.wait(ahead)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        rounds[done] = held
        try:
            yield
        finally:
            del rounds[done]
            done.set_result(None)

    async def _without_stored(self, plan: Plan) -> tuple[Plan, list[dict[str, Any] | None] | None]:
        """``plan`` without what is stored: duplicates, conflicts, and stored fields.

        A document whose instant holds stored fields is built again from the fields of
        its readings that are not stored (readings merged in order, as the plan did).
        Also returns the fields the lookup found at each document's instant (None when
        it found nothing at any).
        """
        started = time.perf_counter()
        try:
            stored = await self.stored_at(plan.lookup)
        finally:
            self._checked += len(plan.ops)
            self._check_seconds += time.perf_counter() - started
        if not stored:
            return plan, None
        ops: list[Any] = []
        groups: list[list[Reading]] = []
        found: list[dict[str, Any] | None] = []
        out = Plan(ops, groups, plan.duplicates, list(plan.conflicts), plan.deferred)
        for doc, group in zip(plan.ops, plan.groups, strict=True):
            fields = stored.get(_doc_instant(doc))
            if fields is None:
                ops.append(doc)
                groups.append(group)
                found.append(None)
                continue
            part, kept = self._unstored(group, dict(fields), out)
            if part is not None:
                ops.append({"_id": doc["_id"], **reading_document(part)})
                groups.append(kept)
                found.append(fields)
        return out, found

    @staticmethod
    def _unstored(
        group: list[Reading], fields: dict[str, Any], plan: Plan
    ) -> tuple[Reading | None, list[Reading]]:
        """The readings of one instant less what ``fields`` (stored there) already holds.

        Returns what is left to store, and the readings that still add something.
        """
        part: Reading | None = None
        kept: list[Reading] = []
        for reading in group:
            new = new_fields(reading, fields)
            if isinstance(new, str):
                plan.conflicts.append((reading, new))
                continue
            if not new:
                plan.duplicates += 1
                continue
            fields.update(new)
            kept.append(reading)
            rest = with_fields(reading, new)
            part = rest if part is None else merged(part, rest)  # type: ignore[assignment]
        return part, kept

    async def stored_at(self, runs: Runs) -> dict[tuple[Any, ...], dict[str, Any]]:
        """The fields stored at the given times, by (sensor, tags, millisecond).

        ``runs``: each sensor's times, in order (a plan's ``lookup``). One ``find`` per
        ``LOOKUP_SENSORS`` sensors, each clause a sensor and its times. Raises
        :class:`WriteError` if a lookup fails.
        """
        clauses = lookup_clauses(runs)  # compiled: each clause's BSON bytes
        found: dict[tuple[Any, ...], dict[str, Any]] = {}
        for start in range(0, len(clauses), LOOKUP_SENSORS):
            query = {"$or": clauses[start : start + LOOKUP_SENSORS]}
            try:
                cursor = self._primary().find(query, {"_id": 0, "seq": 0, "units": 0})
                async for doc in cursor:
                    key = _doc_instant(doc)
                    values = stored_values(doc)
                    known = found.get(key)
                    if known is None:
                        found[key] = values
                    else:  # several documents at one instant: the first holds a field
                        known.update({k: v for k, v in values.items() if k not in known})
            except (PyMongoError, InvalidDocument) as exc:
                raise mongo_errors.translate(exc, "lookup") from exc
        return found

    def take_lookups(self) -> tuple[int, float]:
        """Instants looked up since the last call, and the seconds it took."""
        taken = self._checked, self._check_seconds
        self._checked, self._check_seconds = 0, 0.0
        return taken


def _instant(reading: Reading) -> tuple[str, TagsKey, int]:
    """A reading's series and instant."""
    return reading.sensor_id, tags_key(reading.tags), ms_of(reading)


def _firsts(groups: Sequence[list[Reading]]) -> list[Reading]:
    """Each operation's first reading (its readings share a series and instant)."""
    if isinstance(groups, Singles):
        return groups.readings
    return [group[0] for group in groups]


def _doc_instant(doc: Mapping[str, Any]) -> tuple[str, TagsKey, int]:
    """A time-series document's series and instant (its ``meta`` less the sensor id).

    ``doc``: a dict, or a ``RawBSONDocument`` of the compiled twin (decoded on reading).
    """
    meta = doc["meta"]
    if len(meta) == 1:
        return meta["sensor_id"], NO_TAGS, ts_key(doc["ts"])
    tags = {k: v for k, v in meta.items() if k != "sensor_id"}
    return meta["sensor_id"], tags_key(tags), ts_key(doc["ts"])

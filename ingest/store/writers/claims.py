"""Claims: which writer stores an instant of a series in timeseries mode.

A time-series collection allows no unique index, so two writers (two workers of a shared
subscription, two daemons) that look up one instant at the same moment both find it free.
Before inserting, the time-series writer claims each instant it is about to store in a
plain collection, ``<collection>_claims``, whose ``_id`` is the series and instant
(:func:`claim_id`): the server's unique ``_id`` index lets exactly one insert of a claim
win. A claim is ``{_id, at, by, f, x?}``: when it was made (``at``, for its TTL index),
the session that made it (``by``, the MQTT client id), the fields known at that instant
with their values (``f``: what the lookup found stored, and what the claimer inserts),
and who added a field later (``x.<field>``: the session, for fields added by another
writer).

A writer whose claim collides reads the claim and judges its readings by the rules of
:mod:`ingest.store.writers.instants` against ``f``: a field claimed with another value
refuses the reading (``ts_conflict``); a field claimed with the same value is left to
the writer that claimed it (a duplicate); fields the claim lacks are added to it with one
conditional update (``$set`` of ``f.<field>``, matched only while those fields are
absent, so one writer wins each field), then inserted as an extra document at that
instant. A field this session claimed itself (``by``, or its own ``x.<field>``) proves
nothing: an earlier attempt of the session may have died before its insert (a crash,
a failed write), and the message comes back to the session that holds it unacknowledged.
For such a field the lookup before the claim decides, as without claims.

Claims live as long as the race window: the TTL index removes them ``CLAIM_SECONDS``
(600) after ``at`` (see :mod:`ingest.store.schema`), after which the lookup alone
decides, as it does for any instant stored earlier. A claim covers one write attempt,
its claim then its insert, sent at once: every attempt looks up and claims again, so a
write retried through an outage longer than that is judged afresh against whatever
claim or document is there by then. ``at`` is the writer's clock: hosts' clocks must
agree to well within ``CLAIM_SECONDS``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bson.datetime_ms import DatetimeMS
from bson.errors import InvalidDocument
from pymongo import ReadPreference
from pymongo.errors import BulkWriteError, PyMongoError

from ingest import accel
from ingest.store import mongo_errors
from ingest.store.writers import Plan, Singles, _timeseries_py, bulk, split_bulk_error
from ingest.store.writers.bucket import ms_of
from ingest.store.writers.instants import (
    TagsKey,
    conflict_detail,
    merged,
    same_value,
    tags_key,
    with_fields,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from pymongo.asynchronous.collection import AsyncCollection

    from ingest.model import Reading

# Rounds of "read the claims, judge, add the missing fields" before giving the rest back
# to the pipeline's retry: one to add fields and one to see them added; only writers
# adding the very same fields at once, or claims expiring meanwhile, need more.
CLAIM_ROUNDS = 4

type Instant = tuple[str, TagsKey, int]
type Rebuild = Callable[[Reading], Mapping[str, Any]]

# The claim ids of readings, and the claims of single readings, built by the time-series
# twins (compiled: the usual id formatted in C, a claim as BSON bytes).
_claim_ids = accel.pick(_timeseries_py.claim_ids, "ingest.store.writers._timeseries_c", "claim_ids")
# The _id of an instant's claim (written once, beside the claim ids).
claim_id = accel.pick(_timeseries_py.claim_id, "ingest.store.writers._timeseries_c", "claim_id")
claim_documents = accel.pick(
    _timeseries_py.claim_documents, "ingest.store.writers._timeseries_c", "claim_documents"
)


@dataclass(slots=True)
class Judged:
    """One instant's readings judged against its claim."""

    part: Reading | None = None  # what is left to insert
    kept: list[Reading] = field(default_factory=list)  # the readings it carries
    add: dict[str, Any] = field(default_factory=dict)  # fields to add to the claim
    duplicates: int = 0
    conflicts: list[tuple[Reading, str]] = field(default_factory=list)


def judge(
    group: list[Reading], claim: Mapping[str, Any], stored: Mapping[str, Any], owner: str
) -> Judged:
    """The readings of one instant against its claim and what the lookup found there.

    ``stored``: the fields the lookup before the claim found at the instant (the
    readings' fields in it were judged by the lookup and are left out). A field claimed
    with another value refuses its reading (``ts_conflict``); one claimed with the same
    value by another session is that session's to store (a duplicate here); one this
    session (``owner``) claimed, in an attempt that may have died before its insert, is
    inserted, the lookup having found it absent; one not claimed is added to the claim
    and inserted. Readings are judged in order, each seeing the fields of those before.
    """
    claimed: dict[str, Any] = dict(claim.get("f") or {})
    added_by: Mapping[str, str] = claim.get("x") or {}
    by = claim.get("by")
    out = Judged()
    for reading in group:
        insert: dict[str, Any] = {}
        add: dict[str, Any] = {}
        conflict = None
        for name, value in reading.values.items():
            if name in stored:
                continue
            if name not in claimed:
                add[name] = insert[name] = value
                continue
            held = claimed[name]
            if not same_value(held, value):
                conflict = conflict_detail(reading, name, held)
                break
            if added_by.get(name, by) == owner:
                insert[name] = value
        if conflict is not None:
            out.conflicts.append((reading, conflict))
            continue
        if not insert:
            out.duplicates += 1
            continue
        claimed.update(add)
        out.add.update(add)
        out.kept.append(reading)
        rest = with_fields(reading, insert)
        out.part = rest if out.part is None else merged(out.part, rest)  # type: ignore[assignment]
    return out


@dataclass(slots=True)
class Taken:
    """What the claims leave to insert, and what they decided."""

    ops: list[Any] = field(default_factory=list)
    groups: Sequence[list[Reading]] = field(default_factory=list)
    # Each op's claim id if this writer made the claim now (its session's own, removable
    # if the insert is refused for its data), else None.
    won: list[str | None] = field(default_factory=list)
    duplicates: int = 0
    conflicts: list[tuple[Reading, str]] = field(default_factory=list)
    retry: list[Reading] = field(default_factory=list)
    refused: list[tuple[Reading, str]] = field(default_factory=list)


class Claims:
    """The claims of one session (``owner``, its MQTT client id) in one collection."""

    def __init__(self, collection: AsyncCollection[dict[str, Any]], owner: str) -> None:
        self.collection = collection
        self.owner = owner
        self._primary = collection.with_options(read_preference=ReadPreference.PRIMARY)

    async def take(
        self,
        ops: list[Any],
        groups: Sequence[list[Reading]],
        ids: list[str],
        stored: list[dict[str, Any] | None] | None,
        rebuild: Rebuild,
    ) -> Taken:
        """Claim each operation's instant; what is left to insert, and what was decided.

        ``ids``: each operation's claim id (:func:`claim_ids`); ``stored``: the fields the
        lookup before found at each operation's instant (None: nothing anywhere);
        ``rebuild(reading)``: the document of a part of a reading. Raises
        :class:`~ingest.errors.WriteError` if the claims' insert or read fails as a whole
        (nothing is inserted then).
        """
        round_ = _Round(ops, groups, ids, stored, rebuild, Taken())
        pending = await self._claim(round_, None)
        for _ in range(CLAIM_ROUNDS):
            if not pending:
                break
            pending = await self._settle(round_, pending)
        for i in pending:  # still contested: the pipeline's retry writes them again
            round_.taken.retry.extend(groups[i])
        return round_.taken

    async def _claim(self, round_: _Round, indexes: list[int] | None) -> list[int]:
        """Insert the claims of ``indexes`` (None: all); those that found a claim there.

        A claim inserted keeps its operation as it is; one that failed otherwise sends
        its readings to the retry (or refuses them, for their data).
        """
        docs = self._documents(round_, indexes)
        if not docs:
            return []
        chosen = range(len(round_.ops)) if indexes is None else indexes
        try:
            await bulk.execute(self.collection, bulk.INSERT, docs)
        except BulkWriteError as exc:
            sorted_out = split_bulk_error(
                exc, Plan(docs, [round_.groups[i] for i in chosen]), collide=True
            )
            failed = {int(error["index"]) for error in exc.details.get("writeErrors", [])}
            round_.taken.retry.extend(sorted_out.retry)
            round_.taken.refused.extend(sorted_out.refused)
            round_.keep([i for n, i in enumerate(chosen) if n not in failed])
            return [chosen[n] for n in sorted_out.collided]
        except (PyMongoError, InvalidDocument) as exc:
            raise mongo_errors.translate(exc, "write") from exc
        round_.keep(indexes)
        return []

    def _documents(self, round_: _Round, indexes: list[int] | None) -> list[dict[str, Any]]:
        """The claim documents of ``indexes`` (None: all)."""
        ms = time.time_ns() // 1_000_000
        owner, ids, stored, groups = self.owner, round_.ids, round_.stored, round_.groups
        if indexes is None and stored is None and isinstance(groups, Singles):
            # the common case: one reading an instant, nothing stored there
            return claim_documents(ids, groups.readings, ms, owner)
        at = DatetimeMS(ms)  # as BSON stores it, cheaply encoded
        chosen = range(len(ids)) if indexes is None else indexes
        return [
            {
                "_id": ids[i],
                "at": at,
                "by": owner,
                "f": _fields(groups[i], stored[i] if stored is not None else None),
            }
            for i in chosen
        ]

    async def _settle(self, round_: _Round, pending: list[int]) -> list[int]:
        """Judge operations whose instant is claimed against the claims; those left open."""
        claims = await self._read([round_.ids[i] for i in pending])
        missing: list[int] = []
        extend: list[tuple[int, Judged]] = []
        stored = round_.stored
        for i in pending:
            claim = claims.get(round_.ids[i])
            if claim is None:  # removed (its TTL) since it collided: claim it anew
                missing.append(i)
                continue
            judged = judge(
                round_.groups[i],
                claim,
                (stored[i] if stored is not None else None) or {},
                self.owner,
            )
            if judged.add:
                extend.append((i, judged))
            else:
                round_.accept(i, judged)
        if extend:
            await self._extend([(round_.ids[i], judged.add) for i, judged in extend])
        # extended: judged again against the claims as they now are, this writer's new
        # fields among them (or another's, if it was faster)
        return [i for i, _ in extend] + await self._claim(round_, missing)

    async def _read(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        """The claims of ``ids``, by id, from the primary."""
        try:
            cursor = self._primary.find({"_id": {"$in": ids}})
            return {doc["_id"]: doc async for doc in cursor}
        except (PyMongoError, InvalidDocument) as exc:
            raise mongo_errors.translate(exc, "lookup") from exc

    async def _extend(self, additions: list[tuple[str, dict[str, Any]]]) -> None:
        """Add fields to claims, each while it lacks every one of its fields.

        One unordered bulk update; whether a claim took the fields shows when it is read
        again (``x.<field>`` names this session).
        """
        statements = []
        for claim, add in additions:
            query: dict[str, Any] = {"_id": claim}
            update: dict[str, Any] = {}
            for name, value in add.items():
                query[f"f.{name}"] = {"$exists": False}
                update[f"f.{name}"] = value
                update[f"x.{name}"] = self.owner
            statements.append({"q": query, "u": {"$set": update}, "multi": False, "upsert": False})
        try:
            await bulk.execute(self.collection, bulk.UPDATE, statements)
        except BulkWriteError:
            return  # the claims read next show what was added
        except (PyMongoError, InvalidDocument) as exc:
            raise mongo_errors.translate(exc, "write") from exc

    async def release(self, ids: list[str]) -> None:
        """Remove claims this session made now whose insert was refused for its data.

        Only claims no other writer added a field to (it may be inserting it). Best
        effort: a claim left in place expires with its TTL.
        """
        if not ids:
            return
        try:
            await self.collection.delete_many(
                {"_id": {"$in": ids}, "by": self.owner, "x": {"$exists": False}}
            )
        except PyMongoError:
            return


@dataclass(slots=True)
class _Round:
    """One :meth:`Claims.take`: its operations and what it has decided so far."""

    ops: list[Any]
    groups: Sequence[list[Reading]]
    ids: list[str]
    stored: list[dict[str, Any] | None] | None
    rebuild: Rebuild
    taken: Taken

    def keep(self, indexes: list[int] | None) -> None:
        """Keep operations whose claim this writer made, as they are.

        None: all of them, the round's whole result (the first claim insert succeeded;
        nothing collided, so nothing else is added after).
        """
        taken = self.taken
        if indexes is None:
            taken.ops, taken.groups, taken.won = self.ops, self.groups, list(self.ids)
            return
        if not isinstance(taken.groups, list):
            taken.groups = list(taken.groups)
        for i in indexes:
            taken.ops.append(self.ops[i])
            taken.groups.append(self.groups[i])
            taken.won.append(self.ids[i])

    def accept(self, i: int, judged: Judged) -> None:
        """Count what operation ``i``'s claim decided; keep what is left to insert."""
        taken = self.taken
        taken.duplicates += judged.duplicates
        taken.conflicts.extend(judged.conflicts)
        if judged.part is not None:
            if not isinstance(taken.groups, list):
                taken.groups = list(taken.groups)
            taken.ops.append({"_id": self.ops[i]["_id"], **self.rebuild(judged.part)})
            taken.groups.append(judged.kept)
            taken.won.append(None)


def claim_ids(readings: Iterable[Reading]) -> list[str]:
    """:func:`claim_id` of each reading's series and instant."""
    return _claim_ids(readings if type(readings) is list else list(readings), _claim_id_of)


def _claim_id_of(reading: Reading) -> str:
    return claim_id((reading.sensor_id, tags_key(reading.tags), ms_of(reading)))


def _fields(group: list[Reading], stored: dict[str, Any] | None) -> dict[str, Any]:
    """A claim's ``f``: the fields stored at the instant, and those its readings bring."""
    fields = dict(stored) if stored else {}
    for reading in group:
        for name, value in reading.values.items():
            fields.setdefault(name, value)
    return fields

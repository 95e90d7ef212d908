"""The Writer protocol shared by bucket and time-series mode, and error classification."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, overload

from bson.errors import InvalidDocument
from pymongo import ReadPreference
from pymongo.errors import BulkWriteError, PyMongoError

from ingest.errors import SchemaGoneError, WriteError
from ingest.store import mongo_errors

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from pymongo.asynchronous.collection import AsyncCollection

    from ingest.model import Reading


class BsonWriter(Protocol):
    """The BSON writer kernel (``_bson_c.Writer``) as compiled Python calls it.

    Each part answers WRITTEN (0) or NOT_SURE (1); only compiled modules hold one.
    """

    def start(self) -> int:
        """Begin a document."""

    def object_id(self, name: str, prefix: bytes, counter: int) -> int:
        """An ObjectId of a 9-byte prefix and a counter."""

    def date(self, name: str, ms: object) -> int:
        """A UTC datetime of ``ms`` milliseconds."""

    def value(self, name: str, value: object) -> int:
        """A bool, int, float, str or None."""

    def items(
        self,
        mapping: object,
        *,
        by_name: bool,
        skip: frozenset[str] | None,
        slot: int = -1,
        stride: int = 1,
    ) -> int:
        """Each item of a dict (recording: item k marked as ``slot + k * stride``)."""

    def mark(self, slot: int) -> int:
        """Recording: the element written last is a template's number or date slot."""

    def mark_text(self) -> int:
        """Recording: the string element written last is a template's text."""

    def open(self, name: str) -> int:
        """Begin a sub-document."""

    def open_array(self, name: str) -> int:
        """Begin an array."""

    def close(self) -> int:
        """End the sub-document or array begun last."""

    def finish(self) -> object:
        """The document as a ``RawBSONDocument``, or None."""


class PrimaryReads:
    """A writer's lookups of what it has just written: always from the primary.

    The settle lookup (bucket mode) and the instants' lookup (time-series mode) must see
    what the primary just acknowledged, whatever the collection's read preference says:
    a secondary may not have it yet.
    """

    _collection: AsyncCollection[dict[str, Any]]
    _primary_coll: AsyncCollection[dict[str, Any]] | None = None

    def _primary(self) -> AsyncCollection[dict[str, Any]]:
        """The collection, read from the primary (made once, when first asked)."""
        if self._primary_coll is None:
            self._primary_coll = self._collection.with_options(
                read_preference=ReadPreference.PRIMARY
            )
        return self._primary_coll


class Singles(Sequence[list["Reading"]]):
    """Readings that are one operation each, as groups of one, made only when asked."""

    __slots__ = ("readings",)

    def __init__(self, readings: list[Reading]) -> None:
        self.readings = readings

    def __len__(self) -> int:
        return len(self.readings)

    @overload
    def __getitem__(self, index: int) -> list[Reading]: ...
    @overload
    def __getitem__(self, index: slice) -> list[list[Reading]]: ...
    def __getitem__(self, index: int | slice) -> list[Reading] | list[list[Reading]]:
        if isinstance(index, slice):
            return [[reading] for reading in self.readings[index]]
        return [self.readings[index]]


@dataclass(slots=True)
class Plan:
    """The write operations for one batch, each with the readings it carries."""

    ops: list[Any]
    groups: Sequence[list[Reading]]
    # Readings dropped while planning because the batch holds the same reading twice.
    duplicates: int = 0
    conflicts: list[tuple[Reading, str]] = field(default_factory=list)
    # Readings that repeat a field of an earlier reading of their series and instant in
    # the batch: written (or refused) in a later round, once the earlier one is stored
    # (see ingest.store.writers.instants.merge_series).
    deferred: list[Reading] = field(default_factory=list)
    # Time-series mode: each sensor's times in the plan, in order (the lookup before the
    # insert: ingest.store.writers.timeseries).
    lookup: list[tuple[str, list[Any]]] = field(default_factory=list)

    def readings(self) -> int:
        """How many readings the operations carry."""
        groups = self.groups
        if isinstance(groups, Singles):
            return len(groups)
        return sum(map(len, groups))


@dataclass(slots=True)
class Outcome:
    """What a write did: readings to retry, and readings the server refused for good."""

    written: int = 0
    retry: list[Reading] = field(default_factory=list)
    refused: list[tuple[Reading, str]] = field(default_factory=list)
    # Readings not written because the very same reading is already stored (a redelivery
    # or a retried write), and readings refused because another reading of the same
    # sensor and time, with other values, is stored.
    duplicates: int = 0
    conflicts: list[tuple[Reading, str]] = field(default_factory=list)
    # Indexes of operations that failed with a duplicate key (see ``send(collide=True)``).
    collided: list[int] = field(default_factory=list)
    # Why ``retry`` is not empty, when the writer knows better than "retry these".
    error: WriteError | None = None

    def add(self, sent: Outcome, plan: Plan) -> None:
        """Count one round: what sending ``plan`` did, and what planning it found."""
        self.written += sent.written
        self.retry.extend(sent.retry)
        self.refused.extend(sent.refused)
        self.error = sent.error or self.error
        self.duplicates += plan.duplicates
        self.conflicts.extend(plan.conflicts)


class Writer(Protocol):
    """One storage layout. Upstream stages never know which one is active."""

    mode: str

    async def ensure_schema(self) -> None:
        """Create or check collections and indexes; idempotent."""

    def plan(self, readings: list[Reading]) -> Plan:
        """Build the operations for a batch without sending anything."""

    async def write(self, plan: Plan) -> Outcome:
        """Send a plan; raise :class:`WriteError` if nothing is known to be written."""

    def take_lookups(self) -> tuple[int, float]:
        """Instants looked up before writing since the last call, and the seconds spent."""


def split_bulk_error(exc: BulkWriteError, plan: Plan, collide: bool = False) -> Outcome:
    """Sort a partial failure into readings to retry and readings refused for good.

    Operations without a write error were applied (a write-concern error means applied
    but not replicated as asked; retrying those would apply them twice). Each failed
    operation is classified by :func:`ingest.store.mongo_errors.per_operation`. With
    ``collide``, operations refused for a duplicate key are listed in ``collided`` for
    the writer to settle instead of being refused.
    """
    failed: set[int] = set()
    outcome = Outcome()
    for error in exc.details.get("writeErrors", []):
        index = int(error["index"])
        failed.add(index)
        verdict = mongo_errors.per_operation(error, "write", collide)
        if verdict == "duplicate":
            outcome.collided.append(index)
        elif verdict == "refuse":
            detail = mongo_errors.describe(error)
            outcome.refused.extend((reading, detail) for reading in plan.groups[index])
        else:
            outcome.retry.extend(plan.groups[index])
            if verdict == "schema":
                outcome.error = SchemaGoneError(mongo_errors.describe(error))
    outcome.written = sum(len(g) for i, g in enumerate(plan.groups) if i not in failed)
    return outcome


async def send(request: Awaitable[object], plan: Plan, collide: bool = False) -> Outcome:
    """Await one unordered bulk request for ``plan`` and sort out what it did."""
    try:
        await request
    except BulkWriteError as exc:
        return split_bulk_error(exc, plan, collide)
    except (PyMongoError, InvalidDocument) as exc:
        raise as_write_error(exc) from exc
    return Outcome(written=plan.readings())


def as_write_error(exc: PyMongoError | InvalidDocument) -> WriteError:
    """Translate a driver exception for a whole write request (see mongo_errors)."""
    return mongo_errors.translate(exc, "write")

"""Unordered bulk writes of statements the writers build themselves.

The writers build each operation as the very statement the server receives: an update
command's ``{"q", "u", "multi", "upsert", "hint"}`` or an insert command's document.
Handing pymongo ``UpdateOne`` objects or documents to check costs about 2 µs an
operation in Python (an object per operation, validation, then the same statement built
again); with one operation per reading that was a tenth of the daemon's CPU.

:func:`execute` hands the statements straight to pymongo's own bulk machinery, the one
``bulk_write`` and ``insert_many`` use after their per-operation work: the same commands
on the wire, the same splitting into batches by the server's limits, retryable writes,
the collection's write concern, client-side timeouts (``timeoutMS``) and the same
``BulkWriteError`` for partial failures. That machinery is private to pymongo, so
:func:`fast_path_problem` checks its shape once; if it differs (another pymongo), the
writes go through the public ``bulk_write`` and ``insert_many`` instead, which send the
same bytes. ``tests/store/test_bulk.py`` holds both paths to that.
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any

from pymongo import UpdateOne

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from pymongo.asynchronous.collection import AsyncCollection

logger = logging.getLogger(__name__)

INSERT = "insert"
UPDATE = "update"

type Runner = Callable[[AsyncCollection[Any], str, list[dict[str, Any]]], Coroutine[Any, Any, None]]


def _fast() -> tuple[Runner | None, str | None]:
    """The runner over pymongo's bulk machinery, or None and what is missing."""
    try:
        from pymongo import _csot  # noqa: PLC0415 - private: looked up once, guarded
        from pymongo.asynchronous.bulk import _AsyncBulk  # noqa: PLC0415
        from pymongo.bulk_shared import _Run  # noqa: PLC0415
        from pymongo.message import _INSERT, _UPDATE  # noqa: PLC0415
        from pymongo.operations import _Op  # noqa: PLC0415
    except ImportError as exc:
        return None, str(exc)
    probe = _Run(_INSERT)
    if not (
        isinstance(getattr(probe, "ops", None), list)
        and isinstance(getattr(probe, "index_map", None), list)
        and getattr(probe, "idx_offset", None) == 0
        and callable(getattr(_AsyncBulk, "gen_unordered", None))
    ):
        return None, "_Run(op_type) with ops, index_map, idx_offset; gen_unordered"
    init = tuple(inspect.signature(_AsyncBulk.__init__).parameters)[:4]
    if init != ("self", "collection", "ordered", "bypass_document_validation"):
        return None, f"_AsyncBulk({', '.join(init[1:])})"
    run = tuple(inspect.signature(_AsyncBulk.execute).parameters)
    if run != ("self", "write_concern", "session", "operation"):
        return None, f"_AsyncBulk.execute({', '.join(run[1:])})"
    if not callable(getattr(_csot, "apply", None)) or not hasattr(_Op, "INSERT"):
        return None, "pymongo._csot.apply or _Op.INSERT"
    kinds = {INSERT: _INSERT, UPDATE: _UPDATE}

    @_csot.apply  # as bulk_write and insert_many: the client's timeoutMS
    async def run_bulk(
        collection: AsyncCollection[Any], kind: str, statements: list[dict[str, Any]]
    ) -> None:
        bulk = _AsyncBulk(collection, False, None)  # noqa: FBT003 - unordered
        # The one run of operations that gen_unordered would sort them into, made at
        # once: all of one kind, in order (index_map maps errors back to statements).
        run = _Run(kinds[kind])
        run.ops = statements
        run.index_map = list(range(len(statements)))
        bulk.ops = statements  # type: ignore[assignment]  # only its emptiness counts now
        bulk.gen_unordered = lambda: iter((run,))  # type: ignore[method-assign]
        # bulk_write and insert_many pass _Op.INSERT for every kind of operation.
        await bulk.execute(collection.write_concern, None, _Op.INSERT)

    return run_bulk, None


_RUN, PROBLEM = _fast()


def fast_path_problem() -> str | None:
    """Why the writes go through pymongo's public API (another pymongo), or None."""
    return PROBLEM


async def execute(
    collection: AsyncCollection[Any], kind: str, statements: list[dict[str, Any]]
) -> None:
    """Send ``statements`` unordered, as ``bulk_write``/``insert_many`` would.

    ``statements`` are all :data:`INSERT` documents or all :data:`UPDATE` statements;
    raises what ``bulk_write`` and ``insert_many`` raise.
    """
    if _RUN is not None:
        await _RUN(collection, kind, statements)
    else:
        await public(collection, kind, statements)


def public(
    collection: AsyncCollection[Any], kind: str, statements: list[dict[str, Any]]
) -> Coroutine[Any, Any, object]:
    """The public API's request for the same statements (tests compare the two)."""
    if kind == UPDATE:
        return collection.bulk_write(
            [UpdateOne(s["q"], s["u"], upsert=s["upsert"], hint=s.get("hint")) for s in statements],
            ordered=False,
        )
    return collection.insert_many(statements, ordered=False)

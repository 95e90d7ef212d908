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

An update command's reply lists every document it upserted (``upserted``: an index and
an ``_id`` each); the driver decodes that list into a dict and an ``ObjectId`` per entry
and then renumbers each, about 0.7 µs an upsert (``bson.decode_all`` of a reply of 1,000
upserts and that loop, timed together), though the writers never read it (a
large fleet's batch starts a bucket with nearly every statement). The fast path decodes
update replies without that one field (:func:`without_field`): the driver's checks, its
errors and ``BulkWriteError`` see every other field, so they are the same; only the
upsert counts of the bulk result (``nUpserted``, ``upserted``), which no writer reads,
are left at zero. Events of a command listener get that reply too.
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any

from pymongo import UpdateOne

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Mapping

    from bson.codec_options import CodecOptions
    from pymongo.asynchronous.collection import AsyncCollection
    from pymongo.asynchronous.mongo_client import AsyncMongoClient
    from pymongo.message import _BulkWriteContext, _OpMsg

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
        if kind == UPDATE and _LEAN is not None:
            bulk.write_command = _LEAN  # type: ignore[method-assign]
        # bulk_write and insert_many pass _Op.INSERT for every kind of operation.
        await bulk.execute(collection.write_concern, None, _Op.INSERT)

    return run_bulk, None


type WriteCommand = Callable[..., Coroutine[Any, Any, dict[str, Any]]]


def _lean_updates() -> tuple[WriteCommand | None, str | None]:
    """``_AsyncBulk.write_command`` for update batches: the reply without ``upserted``.

    The same call of the driver's command runner as its own ``run_bulk_write_command``,
    with one difference: the reply is decoded by :func:`_update_reply`.
    """
    try:
        from bson import _decode_all_selective  # noqa: PLC0415 - private: looked up once
        from pymongo.asynchronous.bulk import _AsyncBulk  # noqa: PLC0415
        from pymongo.asynchronous.command_runner import _run_command  # noqa: PLC0415
        from pymongo.message import _OpMsg  # noqa: PLC0415
    except ImportError as exc:
        return None, str(exc)
    wanted = ["client", "session", "listeners", "topology_id", "codec_options", "op_id"]
    wanted += ["command_name", "decrypt_reply", "unpack_res"]
    taken = inspect.signature(_run_command).parameters
    if not all(name in taken for name in wanted):
        return None, f"_run_command({', '.join(n for n in wanted if n not in taken)})"
    args = tuple(inspect.signature(_AsyncBulk.write_command).parameters)
    if args != ("self", "bwc", "cmd", "request_id", "msg", "docs", "client"):
        return None, f"_AsyncBulk.write_command({', '.join(args[1:])})"
    if not callable(getattr(_OpMsg, "raw_command_response", None)):
        return None, "_OpMsg.raw_command_response"

    def _update_reply(
        reply: _OpMsg,
        _cursor_id: int | None,
        codec_options: CodecOptions[Any],
        user_fields: Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """The reply decoded as the driver would, less its ``upserted`` list."""
        raw = without_field(bytes(reply.raw_command_response()), b"upserted")
        return _decode_all_selective(raw, codec_options, user_fields)

    async def write_command(
        bwc: _BulkWriteContext,
        cmd: dict[str, Any],
        request_id: int,
        msg: bytes,
        docs: list[Mapping[str, Any]],
        client: AsyncMongoClient[Any],
    ) -> dict[str, Any]:
        cmd[bwc.field] = docs  # as the driver's write_command: for its command events
        # the context is typed for both APIs; this one holds the asynchronous ones
        result, _reply, _seconds = await _run_command(
            bwc.conn,  # type: ignore[arg-type]
            cmd,
            bwc.db_name,
            request_id,
            msg,
            client=client,
            session=bwc.session,  # type: ignore[arg-type]
            listeners=bwc.listeners,
            topology_id=client._topology_id if client is not None else None,  # noqa: SLF001
            codec_options=bwc.codec,
            op_id=bwc.op_id,
            command_name=bwc.name,
            decrypt_reply=False,
            unpack_res=_update_reply,
        )
        return result[0]

    return write_command, None


# The size of a BSON value that has a fixed size, by its element type.
_FIXED = {
    0x01: 8,  # double
    0x06: 0,  # undefined
    0x07: 12,  # ObjectId
    0x08: 1,  # boolean
    0x09: 8,  # UTC datetime
    0x0A: 0,  # null
    0x10: 4,  # int32
    0x11: 8,  # timestamp
    0x12: 8,  # int64
    0x13: 16,  # decimal128
    0x7F: 0,  # max key
    0xFF: 0,  # min key
}
_STRINGS = {0x02, 0x0D, 0x0E}  # string, JavaScript code, symbol: int32 length, then bytes
_SIZED = {0x03, 0x04, 0x0F}  # document, array, code with scope: an int32 of the whole


def without_field(doc: bytes, name: bytes) -> bytes:
    """A BSON document's bytes less its top-level field ``name`` (the same bytes if absent).

    Also the same bytes if a value of an unexpected type comes before the field, or if
    the bytes are not a well-formed document: the caller then decodes everything, as it
    would have (and the driver's decoder reports what is wrong).
    """
    end = len(doc) - 1
    if end < 4 or int.from_bytes(doc[:4], "little") != len(doc) or doc[end]:
        return doc
    pos = 4
    while pos < end:
        kind = doc[pos]
        key_end = doc.find(b"\x00", pos + 1, end)
        if key_end < 0:
            return doc
        at = key_end + 1
        if kind in _FIXED:
            size = _FIXED[kind]
        elif kind in _SIZED:
            size = int.from_bytes(doc[at : at + 4], "little")
        elif kind in _STRINGS:
            size = 4 + int.from_bytes(doc[at : at + 4], "little")
        elif kind == 0x05:  # binary: int32 length, subtype, bytes
            size = 5 + int.from_bytes(doc[at : at + 4], "little")
        else:  # regular expressions, DBPointer: not in a write's reply
            return doc
        if at + size > end:
            return doc
        if doc[pos + 1 : key_end] == name:
            length = len(doc) - (at + size - pos)
            return length.to_bytes(4, "little") + doc[4:pos] + doc[at + size :]
        pos = at + size
    return doc


_LEAN, LEAN_PROBLEM = _lean_updates()
_RUN, PROBLEM = _fast()


def fast_path_problem() -> str | None:
    """Why the writes go through pymongo's public API (another pymongo), or None."""
    return PROBLEM


def lean_replies_problem() -> str | None:
    """Why the fast path decodes update replies whole, ``upserted`` too, or None."""
    return LEAN_PROBLEM


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

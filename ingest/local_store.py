"""The embedded store of ``ingest local``: the mongoeco emulator on SQLite, in-process.

It is NOT MongoDB and not for production. Two things here are ours to decide about it:

- the engine: mongoeco's SQLite engine, less one collection scan it makes on every insert
  (:func:`engine_class`), without which a time-series collection, one document per
  reading (and its claims, one per instant), gets slower with every reading stored;
- its end: closing it while a write of a daemon that has just stopped still runs in its
  threads can fail (``database is locked``); that is one warning line, never a traceback
  (:func:`close`). Every write that completed is in the file, and the daemons did not
  acknowledge the messages of writes that did not: the broker delivers them again.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

logger = logging.getLogger(__name__)


def engine_class() -> type[Any]:
    """The ``SQLiteEngine`` of mongoeco, without its insert-time scan of the whole collection.

    Before inserting a document, mongoeco looks its ``_id`` up by storage key (indexed).
    Numeric ids of different types can be equal (``1 == 1.0``) under different storage
    keys, so for an id that holds a number it also reads and decodes every document of
    the collection to compare ids logically. An insert asks for that scan whatever the id
    (``scan_payload_id``); an id without a number (an ObjectId, the claims' strings: every
    document the daemons insert) equals only an id of the same storage key, which the
    lookup already checked. This engine leaves the choice to mongoeco's own rule, the scan
    for ids that hold a number. With a mongoeco whose engine no longer has this method,
    nothing changes.
    """
    from mongoeco.engines.sqlite import SQLiteEngine  # noqa: PLC0415 - the [local] extra

    method = getattr(SQLiteEngine, "_validate_document_against_unique_indexes", None)
    if method is None or "scan_payload_id" not in inspect.signature(method).parameters:
        return SQLiteEngine

    class LocalEngine(SQLiteEngine):
        """SQLiteEngine that scans the collection on insert only for numeric ids."""

        def _validate_document_against_unique_indexes(self, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401 - mongoeco's
            kwargs["scan_payload_id"] = False  # numeric ids: mongoeco still scans
            super()._validate_document_against_unique_indexes(*args, **kwargs)

    return LocalEngine


def _first_cause(exc: BaseException) -> BaseException:
    """The innermost first exception of an exception group (mongoeco raises groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


async def close(store: Any) -> None:  # noqa: ANN401 - mongoeco's proxy server
    """Close the store; a failure is one warning line, not a traceback."""
    try:
        await store.close()
    except Exception as exc:  # noqa: BLE001 - whatever mongoeco raises, the data is safe
        cause = _first_cause(exc)
        logger.warning(
            "the embedded store did not close cleanly (%s: %s): every completed "
            "write is in its file; messages of unfinished writes were not "
            "acknowledged and the broker delivers them again",
            type(cause).__name__,
            cause,
        )

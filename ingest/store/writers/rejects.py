"""Rejected readings: one small document each in a capped collection."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from bson.errors import InvalidDocument
from pymongo.errors import BulkWriteError, PyMongoError

from ingest.store import mongo_errors

if TYPE_CHECKING:
    from pymongo.asynchronous.collection import AsyncCollection

    from ingest.model import Inbound, Rejection

logger = logging.getLogger(__name__)
PAYLOAD_EXCERPT_BYTES = 512
# A message of 10,000 bad readings must not write 10,000 copies of its payload.
MAX_REJECT_DOCS_PER_MESSAGE = 20


def reject_docs(message: Inbound, rejections: list[Rejection], mode: str) -> list[dict[str, Any]]:
    """Documents for the rejects collection: topic, reason, detail and a payload excerpt.

    ``mode`` tells which daemon refused it when both modes share a database.
    """
    at = datetime.fromtimestamp(message.received_at, UTC)
    excerpt = message.payload[:PAYLOAD_EXCERPT_BYTES].decode("utf-8", "backslashreplace")
    docs = []
    for rejection in rejections[:MAX_REJECT_DOCS_PER_MESSAGE]:
        doc: dict[str, Any] = {
            "at": at,
            "mode": mode,
            "topic": message.topic[:256],
            "reason": rejection.reason,
            "detail": rejection.detail,
            "payload": excerpt,
            "payload_bytes": len(message.payload),
        }
        if rejection.index is not None:
            doc["index"] = rejection.index
        docs.append(doc)
    if len(rejections) > MAX_REJECT_DOCS_PER_MESSAGE:
        docs[-1]["more_rejected"] = len(rejections) - MAX_REJECT_DOCS_PER_MESSAGE
    return docs


class RejectsWriter:
    """Inserts reject documents; refused documents are logged, transient errors raised."""

    def __init__(self, collection: AsyncCollection[dict[str, Any]]) -> None:
        self._collection = collection

    async def write(self, docs: list[dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
        """Insert ``docs``; return how many were stored and the ones to try again."""
        try:
            result = await self._collection.insert_many(docs, ordered=False)
        except BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            verdicts = [mongo_errors.per_operation(e, "rejects") for e in errors]
            retry = [
                docs[e["index"]] for e, v in zip(errors, verdicts, strict=True) if v != "refuse"
            ]
            refused = len(errors) - len(retry)
            if refused:
                first = next(
                    mongo_errors.describe(e)
                    for e, v in zip(errors, verdicts, strict=True)
                    if v == "refuse"
                )
                # An expected server answer, not a bug: no traceback.
                logger.error("rejects collection refused %d documents: %s", refused, first)  # noqa: TRY400
            return int(exc.details.get("nInserted", 0)), retry
        except (PyMongoError, InvalidDocument) as exc:
            raise mongo_errors.translate(exc, "rejects") from exc
        return len(result.inserted_ids), []

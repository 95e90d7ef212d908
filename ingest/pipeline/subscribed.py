"""The topic filters each client id's session may hold, remembered between runs.

A persistent session keeps its subscriptions after the daemon stops, and MQTT cannot
list them. So the daemon records the filters it subscribes in the ``subscribed_filters``
collection, one document per client id and broker: ``{_id: "<client id>@<host>:<port>",
client_id, broker, filters, updated_at}``. On the next start it unsubscribes the
recorded filters that are not wanted any more (ingest/mqtt/source.py), then records
today's. A few bytes per client id; nothing else reads it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from bson.errors import InvalidDocument
from pymongo import ReadPreference
from pymongo.errors import PyMongoError

from ingest.store.writers import as_write_error

if TYPE_CHECKING:
    from pymongo.asynchronous.collection import AsyncCollection

COLLECTION = "subscribed_filters"


class SubscribedFilters:
    """One session's record in ``subscribed_filters`` (see the module docstring)."""

    def __init__(
        self, collection: AsyncCollection[dict[str, Any]], client_id: str, broker: str
    ) -> None:
        # From the primary: the record the last run wrote, not a secondary's older copy.
        self._collection = collection.with_options(read_preference=ReadPreference.PRIMARY)
        self._client_id = client_id
        self._broker = broker
        self._key = f"{client_id}@{broker}"

    async def recall(self) -> list[str] | None:
        """The filters last recorded for this session (None: nothing recorded)."""
        try:
            doc = await self._collection.find_one({"_id": self._key})
        except PyMongoError as exc:
            raise as_write_error(exc) from exc
        if doc is None or not isinstance(doc.get("filters"), list):
            return None
        return [f for f in doc["filters"] if isinstance(f, str)]

    async def record(self, filters: list[str]) -> None:
        """Record the filters the session may hold from now on."""
        try:
            await self._collection.replace_one(
                {"_id": self._key},
                {
                    "client_id": self._client_id,
                    "broker": self._broker,
                    "filters": filters,
                    "updated_at": datetime.now(UTC),
                },
                upsert=True,
            )
        except (PyMongoError, InvalidDocument) as exc:
            raise as_write_error(exc) from exc

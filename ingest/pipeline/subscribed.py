"""The topic filters each client id's session may hold, remembered between runs.

A persistent session keeps its subscriptions after the daemon stops, and MQTT cannot
list them. So the daemon records the filters it subscribes in the ``subscribed_filters``
collection, one document per client id and broker: ``{_id: "<client id>@<host>:<port>",
client_id, broker, filters, retired, updated_at}``. On the next start it unsubscribes the
recorded filters that are not wanted any more (ingest/mqtt/source.py), then records
today's, and the ones it unsubscribed in ``retired`` (``[{filter, at}]``, kept
:data:`~ingest.mqtt.subscriptions.RETIRED_DAYS` days): what they had queued may be resent
to a later start. A few bytes per client id; nothing else reads it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from bson.errors import InvalidDocument
from pymongo import ReadPreference
from pymongo.errors import PyMongoError

from ingest.mqtt.subscriptions import RETIRED_DAYS, Recalled
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

    async def recall(self) -> Recalled | None:
        """What was last recorded for this session (None: nothing recorded).

        Retired filters older than :data:`RETIRED_DAYS` days are left out.
        """
        try:
            doc = await self._collection.find_one({"_id": self._key})
        except PyMongoError as exc:
            raise as_write_error(exc) from exc
        if doc is None or not isinstance(doc.get("filters"), list):
            return None
        since = (datetime.now(UTC) - timedelta(days=RETIRED_DAYS)).timestamp()
        retired: dict[str, float] = {}
        for entry in doc.get("retired") or ():
            at = entry.get("at") if isinstance(entry, dict) else None
            if isinstance(at, datetime) and isinstance(entry.get("filter"), str):
                seconds = (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()
                if seconds >= since:
                    retired[entry["filter"]] = seconds
        return Recalled([f for f in doc["filters"] if isinstance(f, str)], retired)

    async def record(self, filters: list[str], retired: dict[str, float]) -> None:
        """Record the filters the session may hold from now on, and those retired."""
        try:
            await self._collection.replace_one(
                {"_id": self._key},
                {
                    "client_id": self._client_id,
                    "broker": self._broker,
                    "filters": filters,
                    "retired": [
                        {"filter": f, "at": datetime.fromtimestamp(at, UTC)}
                        for f, at in retired.items()
                    ],
                    "updated_at": datetime.now(UTC),
                },
                upsert=True,
            )
        except (PyMongoError, InvalidDocument) as exc:
            raise as_write_error(exc) from exc

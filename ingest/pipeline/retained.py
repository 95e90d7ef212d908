"""The time a retained state was first seen, recorded in MongoDB for every daemon.

A retained message that the broker sends because the daemon subscribed (its RETAIN flag
set on delivery) is the topic's last state, published some time before. With
``--retained store`` its readings are stored; those without a time of their own need
one that does not depend on when or where the message arrived, since the same state
arrives again: at each member of a shared group (mosquitto sends retained messages to
every member that subscribes), and whenever a subscription is made anew (a session
expired, a broker that lost its sessions, a new worker). That time is the one at which
any daemon first saw this payload on this topic, kept in the ``retained_state``
collection: one document per topic, ``{_id: topic, digest, first_seen}``. The same
payload gets the recorded time, so its readings are the same readings (sensor and
instant) and are stored once; another payload is a new state, recorded with the time
it is first seen. The collection holds one small document per topic that ever had a
retained message the daemons received; nothing else reads it.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from bson.errors import InvalidDocument
from pymongo import ReadPreference, ReturnDocument
from pymongo.errors import DuplicateKeyError, PyMongoError

from ingest.errors import WriteError
from ingest.store.writers import as_write_error

if TYPE_CHECKING:
    from pymongo.asynchronous.collection import AsyncCollection

COLLECTION = "retained_state"
DIGEST_BYTES = 16
# Attempts of one lookup that lose a race to daemons recording other payloads of the
# same topic meanwhile: more than a few means the topic changes faster than we look.
RACES = 5
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def digest(payload: bytes) -> bytes:
    """What identifies a payload in the record (the same in every process)."""
    return hashlib.blake2b(payload, digest_size=DIGEST_BYTES).digest()


class FirstSeen:
    """The ``retained_state`` collection: per topic, the payload's first-seen time."""

    def __init__(self, collection: AsyncCollection[dict[str, Any]]) -> None:
        # From the primary, whatever the URI says: a secondary may not have the record
        # another daemon just wrote, and its state would look new.
        self.collection = collection.with_options(read_preference=ReadPreference.PRIMARY)

    async def first_seen(self, topic: str, payload: bytes, now: float) -> tuple[int, bool]:
        """When this payload was first seen on this topic (epoch ms), and whether now.

        ``now`` is this delivery's arrival (epoch seconds).

        Two daemons recording the same new payload at once agree: the first upsert
        wins, the other one's filter no longer matches, its insert collides with the
        ``_id`` and it reads the winner's time. Raises :class:`WriteError` (retriable
        or not, as a write's) on a MongoDB failure; nothing is half done then.
        """
        key = digest(payload)
        try:
            for _ in range(RACES):
                doc = await self.collection.find_one({"_id": topic})
                if doc is not None and doc.get("digest") == key:
                    return _ms(doc["first_seen"]), False
                try:
                    # Recorded only if the topic holds another payload (or nothing).
                    doc = await self.collection.find_one_and_update(
                        {"_id": topic, "digest": {"$ne": key}},
                        {"$set": {"digest": key, "first_seen": _EPOCH + int(now * 1000) * _MS}},
                        upsert=True,
                        return_document=ReturnDocument.AFTER,
                    )
                except DuplicateKeyError:
                    continue  # another daemon recorded a payload of this topic meanwhile
                if doc is not None and doc.get("digest") == key:
                    return _ms(doc["first_seen"]), True
        except (PyMongoError, InvalidDocument) as exc:
            raise as_write_error(exc) from exc
        raise WriteError(
            f"retained state of {topic[:200]!r} changed {RACES} times while being recorded"
        )


def _ms(when: datetime) -> int:
    """Epoch milliseconds of a stored date (aware or naive UTC)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - _EPOCH) // _MS

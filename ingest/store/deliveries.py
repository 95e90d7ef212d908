"""The delivery ledger: the times a QoS 1/2 message's timeless readings were given.

A reading without a time of its own takes its arrival time. When the daemon dies after
writing such readings and before the broker has their PUBACKs, the broker resends the
message (DUP) to the next connection of the session; decoded again, its readings would
take new arrival times and be stored a second time. So before a batch's readings are
written, the times each of its QoS 1/2 messages gave its timeless readings are recorded
here, per MQTT session (client id); a DUP that reaches the pipeline (one the running
process cannot recognise itself: the first after a restart) is decoded with the times
of the latest entry with its packet id and its topic and payload checksum, and the
writers then find its readings stored (duplicates).

One document per batch that holds such messages::

    {_id, client, seq, at, entries}

``client`` is the session's client id; ``seq`` the number of entries the client has
recorded up to and including this document's (a running count, continued across
restarts); ``at`` when it was written (the TTL index removes documents older than any
session the broker keeps, :data:`EXPIRE_SECONDS`); ``entries`` the entries packed
(:func:`pack`): per message its packet id, a CRC-32 of topic and payload, its arrival
time and the milliseconds given to its timeless readings, in decode order. Entries
older than the client's last ``keep`` are deleted as new ones are recorded
(:meth:`Deliveries.write`).

Recorded before the readings: readings stored without their entry would be stored
again after a crash; an entry whose readings never got written is harmless (the
redelivery takes the recorded times and is written then).
"""

from __future__ import annotations

import contextlib
import struct
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from bson.binary import Binary
from bson.errors import InvalidDocument
from bson.objectid import ObjectId
from pymongo import ASCENDING, DESCENDING, ReadPreference
from pymongo.errors import DuplicateKeyError, PyMongoError

from ingest.store import mongo_errors

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

    from pymongo.asynchronous.collection import AsyncCollection

    from ingest.model import Inbound

COLLECTION = "deliveries"
INDEX = "client_1_seq_1"
TTL_INDEX = "at_ttl"
# Longer than the session expiry the daemon asks for (7 days, ingest/mqtt/source.py):
# after it the broker has no message of the session left to resend.
EXPIRE_SECONDS = 8 * 86400
# Entries per document at most (a batch of more is recorded in several): far below
# MongoDB's 16 MiB, whatever the messages hold.
ENTRIES_PER_DOC = 10_000
TIMES_PER_DOC = 500_000
# One entry's head: packet id, CRC-32 of topic and payload, arrival (epoch s), times.
_HEAD = struct.Struct("<HIdI")
_TIME = struct.Struct("<q")


@dataclass(frozen=True, slots=True)
class Recorded:
    """What a message's first delivery gave: its arrival time and its readings' times."""

    received_at: float
    times: tuple[int, ...]


type Entry = tuple["Inbound", list[int]]  # a message and the ms given to its readings
type Key = tuple[int, int]  # packet id, checksum


def checksum(topic: str, payload: bytes) -> int:
    """What tells a message apart from another of the same packet id (same in every process)."""
    return zlib.crc32(payload, zlib.crc32(topic.encode()))


def pack(entries: Iterable[Entry]) -> bytes:
    """The entries as stored: per message a head and its times (little-endian)."""
    out = bytearray()
    for message, times in entries:
        out += _HEAD.pack(message.mid, checksum(message.topic, message.payload),
                          message.received_at, len(times))
        out += struct.pack(f"<{len(times)}q", *times)
    return bytes(out)


def unpack(data: bytes) -> Iterator[tuple[Key, Recorded]]:
    """The entries of :func:`pack`, in order."""
    at, end = 0, len(data)
    while at < end:
        mid, crc, received_at, count = _HEAD.unpack_from(data, at)
        at += _HEAD.size
        times = struct.unpack_from(f"<{count}q", data, at)
        at += count * _TIME.size
        yield (mid, crc), Recorded(received_at, times)


def latest(docs: Iterable[dict[str, Any]], keep: int) -> dict[Key, Recorded]:
    """The latest entry per (packet id, checksum) among a client's last ``keep``.

    ``docs``: the client's documents in ``seq`` order. A redelivered message's first
    delivery is the latest entry with its packet id: the broker gives the id to another
    message only once it has the PUBACK, and a message not acknowledged is resent.
    """
    docs = list(docs)
    if not docs:
        return {}
    first = docs[-1]["seq"] - keep  # entries numbered at or below this are older
    found: dict[Key, Recorded] = {}
    for doc in docs:
        seq = doc["seq"] - doc["n"]
        for key, recorded in unpack(doc["entries"]):
            seq += 1
            if seq > first:
                found[key] = recorded
    return found


def chunks(entries: Sequence[Entry]) -> Iterator[Sequence[Entry]]:
    """The entries in pieces that each fit one document."""
    start, times = 0, 0
    for at, (_message, given) in enumerate(entries):
        if at > start and (at - start >= ENTRIES_PER_DOC or times + len(given) > TIMES_PER_DOC):
            yield entries[start:at]
            start, times = at, 0
        times += len(given)
    if start < len(entries):
        yield entries[start:]


class Deliveries:
    """One client's ledger in the ``deliveries`` collection."""

    def __init__(self, collection: AsyncCollection[dict[str, Any]], client: str,
                 keep: int) -> None:
        # From the primary: a secondary may not have the entries just written.
        self.collection = collection.with_options(read_preference=ReadPreference.PRIMARY)
        self.client = client
        self.keep = keep
        self._count: int | None = None  # entries the client has recorded (None: not read yet)
        self._since_trim = 0

    async def documents(self, entries: Sequence[Entry]) -> list[dict[str, Any]]:
        """The documents recording ``entries`` (numbered now, in the order asked).

        Raises :class:`~ingest.errors.WriteError` if the client's count cannot be read
        (the first time only); nothing is numbered then.
        """
        if self._count is None:
            try:
                last = await self.collection.find_one(
                    {"client": self.client}, {"seq": 1}, sort=[("seq", DESCENDING)])
            except (PyMongoError, InvalidDocument) as exc:
                raise mongo_errors.translate(exc, "lookup") from exc
            if self._count is None:  # not read meanwhile by another writer
                self._count = 0 if last is None else int(last["seq"])
        docs = []
        at = datetime.now(UTC)
        for piece in chunks(entries):
            self._count += len(piece)
            docs.append({"_id": ObjectId(), "client": self.client, "seq": self._count,
                         "n": len(piece), "at": at, "entries": Binary(pack(piece))})
        return docs

    async def write(self, docs: list[dict[str, Any]]) -> None:
        """Insert the documents (again after an unknown outcome); trim now and then.

        Raises :class:`~ingest.errors.WriteError` (retriable or not, as a write's).
        """
        try:
            for doc in docs:
                # A duplicate _id: written by an attempt whose answer was lost.
                with contextlib.suppress(DuplicateKeyError):
                    await self.collection.insert_one(doc)
            self._since_trim += sum(doc["n"] for doc in docs)
            if self._since_trim >= self.keep and self._count is not None:
                await self.collection.delete_many(
                    {"client": self.client, "seq": {"$lte": self._count - self.keep}})
                self._since_trim = 0
        except (PyMongoError, InvalidDocument) as exc:
            raise mongo_errors.translate(exc, "write") from exc

    async def tail(self) -> dict[Key, Recorded]:
        """The client's recorded entries, the latest per key (one query).

        Raises :class:`~ingest.errors.WriteError` on a MongoDB failure.
        """
        try:
            docs = await self.collection.find(
                {"client": self.client}, {"seq": 1, "n": 1, "entries": 1},
                sort=[("seq", ASCENDING)]).to_list()
        except (PyMongoError, InvalidDocument) as exc:
            raise mongo_errors.translate(exc, "lookup") from exc
        return latest(docs, self.keep)

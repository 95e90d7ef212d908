"""The delivery ledger: the times a QoS 1/2 message's timeless readings were given.

A reading without a time of its own takes its arrival time. When the daemon dies after
writing such readings and before the broker has their PUBACKs, the broker resends the
message (DUP) to the next connection of the session; decoded again, its readings would
take new arrival times and be stored a second time. So before a batch's readings are
written, the times each of its QoS 1/2 messages gave its timeless readings are recorded
here, per MQTT session (client id); a DUP that reaches the pipeline (one the running
process cannot recognise itself: the first after a restart) is decoded with the times
of the latest entry with its packet id if that entry has its topic and payload
checksum, and the writers then find its readings stored (duplicates).

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
import sys
import zlib
from array import array
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from bson.binary import Binary
from bson.errors import InvalidDocument
from bson.objectid import ObjectId
from pymongo import ASCENDING, DESCENDING, ReadPreference
from pymongo.errors import DuplicateKeyError, PyMongoError

from ingest import caches
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
# The packed columns' item types: packet id, CRC-32, arrival (epoch s), counts and times.
_MID, _CRC, _ARRIVED, _TIME = "H", "I", "d", "q"
_SIZES = {code: array(code).itemsize for code in (_MID, _CRC, _ARRIVED, _TIME)}
assert _SIZES == {_MID: 2, _CRC: 4, _ARRIVED: 8, _TIME: 8}  # every platform we run on
_BIG_ENDIAN = sys.byteorder == "big"


@dataclass(frozen=True, slots=True)
class Recorded:
    """What a message's first delivery gave: its arrival time and its readings' times."""

    received_at: float
    times: tuple[int, ...]


type Latest = dict[int, tuple[int, Recorded]]  # packet id -> its latest entry's checksum, times


# CRC-32 of topics seen (a topic repeats with every message of its sensor), bounded by
# --max-cached-series (ingest.caches.limit): cleared when full.
_TOPIC_CRCS: dict[str, int] = {}


def topics_cached() -> int:
    """Topics whose checksum is held."""
    return len(_TOPIC_CRCS)


def checksum(topic: str, payload: bytes) -> int:
    """What tells a message apart from another of the same packet id (same in every process)."""
    return zlib.crc32(payload, zlib.crc32(topic.encode()))


def _topic_crc(topic: str) -> int:
    """The CRC-32 of ``topic``, remembered (:func:`checksum` continues it over the payload)."""
    if len(_TOPIC_CRCS) >= caches.limit:
        _TOPIC_CRCS.clear()
    crc = _TOPIC_CRCS[topic] = zlib.crc32(topic.encode())
    return crc


def pack(messages: Sequence[Inbound], given: Sequence[int]) -> bytes:
    """The entries as stored, little-endian.

    Columns of packet ids, checksums and arrival times, then ``given`` (per message the
    number of its times, then the times). Built column by column, one comprehension
    each: this runs for every message whose readings were timed at arrival, and packing
    entry by entry costs more.
    """
    crc32, known = zlib.crc32, _TOPIC_CRCS.get
    columns = (
        array(_MID, [message.mid for message in messages]),
        array(
            _CRC,
            [
                crc32(message.payload, known(message.topic) or _topic_crc(message.topic))
                for message in messages
            ],
        ),
        array(_ARRIVED, [message.received_at for message in messages]),
        array(_TIME, given),
    )
    if _BIG_ENDIAN:
        for column in columns:
            column.byteswap()
    return b"".join([column.tobytes() for column in columns])


def unpack(data: bytes, count: int) -> Iterator[tuple[int, int, Recorded]]:
    """The ``count`` entries of :func:`pack`, in order: packet id, checksum, what was given."""
    columns = []
    at = 0
    for code in (_MID, _CRC, _ARRIVED, _TIME):
        column = array(code)
        end = len(data) if code == _TIME else at + count * _SIZES[code]
        column.frombytes(data[at:end])
        if _BIG_ENDIAN:
            column.byteswap()
        columns.append(column)
        at = end
    mids, crcs, arrived, given = columns
    at = 0
    for i in range(count):
        times = int(given[at])
        yield (
            int(mids[i]),
            int(crcs[i]),
            Recorded(float(arrived[i]), tuple(int(t) for t in given[at + 1 : at + 1 + times])),
        )
        at += 1 + times


def pieces(
    messages: Sequence[Inbound], given: Sequence[int]
) -> Iterator[tuple[Sequence[Inbound], Sequence[int]]]:
    """A batch's entries in pieces that each fit one document."""
    if len(messages) <= ENTRIES_PER_DOC and len(given) <= TIMES_PER_DOC:
        yield messages, given  # the usual batch: one document
        return
    start = at = start_at = 0
    for i in range(len(messages)):
        width = 1 + given[at]
        if i > start and (i - start >= ENTRIES_PER_DOC or at + width - start_at > TIMES_PER_DOC):
            yield messages[start:i], given[start_at:at]
            start, start_at = i, at
        at += width
    yield messages[start:], given[start_at:]


def latest(docs: Iterable[dict[str, Any]], keep: int) -> Latest:
    """The latest entry per packet id among a client's last ``keep``.

    ``docs``: the client's documents in ``seq`` order.
    """
    docs = list(docs)
    if not docs:
        return {}
    first = docs[-1]["seq"] - keep  # entries numbered at or below this are older
    found: Latest = {}
    for doc in docs:
        seq = doc["seq"] - doc["n"]
        for mid, crc, recorded in unpack(doc["entries"], doc["n"]):
            seq += 1
            if seq > first:
                found[mid] = (crc, recorded)
    return found


def first_delivery(found: Latest, message: Inbound) -> Recorded | None:
    """What the first delivery of a resent ``message`` was given, if it was recorded.

    It is the latest entry with the message's packet id, if that entry has the message's
    checksum: the broker gives an id to another message only once it has the PUBACK
    (so not while this one waits for its own), and keeps at most Receive Maximum (at
    most 65,535) unacknowledged, so two it resends never share an id. An earlier entry
    with the id is an earlier message that was acknowledged (the same words, perhaps:
    devices repeat states), and never matches; the latest one with another checksum
    means this message's first delivery was not recorded (its readings not written).
    """
    entry = found.get(message.mid)
    if entry is None or entry[0] != checksum(message.topic, message.payload):
        return None
    return entry[1]


class Deliveries:
    """One client's ledger in the ``deliveries`` collection."""

    def __init__(self, collection: AsyncCollection[dict[str, Any]], client: str, keep: int) -> None:
        # From the primary: a secondary may not have the entries just written.
        self.collection = collection.with_options(read_preference=ReadPreference.PRIMARY)
        self.client = client
        self.keep = keep
        self._count: int | None = None  # entries the client has recorded (None: not read yet)
        self._since_trim = 0

    async def documents(
        self, messages: Sequence[Inbound], given: Sequence[int]
    ) -> list[dict[str, Any]]:
        """The documents recording ``messages`` and their ``given`` (:func:`pack`).

        Numbered now, in the order asked. Raises :class:`~ingest.errors.WriteError` if
        the client's count cannot be read (the first time only); nothing is numbered then.
        """
        if self._count is None:
            try:
                last = await self.collection.find_one(
                    {"client": self.client}, {"seq": 1}, sort=[("seq", DESCENDING)]
                )
            except (PyMongoError, InvalidDocument) as exc:
                raise mongo_errors.translate(exc, "lookup") from exc
            if self._count is None:  # not read meanwhile by another writer
                self._count = 0 if last is None else int(last["seq"])
        docs = []
        at = datetime.now(UTC)
        for some, times in pieces(messages, given):
            self._count += len(some)
            docs.append(
                {
                    "_id": ObjectId(),
                    "client": self.client,
                    "seq": self._count,
                    "n": len(some),
                    "at": at,
                    "entries": Binary(pack(some, times)),
                }
            )
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
                    {"client": self.client, "seq": {"$lte": self._count - self.keep}}
                )
                self._since_trim = 0
        except (PyMongoError, InvalidDocument) as exc:
            raise mongo_errors.translate(exc, "write") from exc

    async def tail(self) -> Latest:
        """The client's recorded entries, the latest per packet id (one query).

        Raises :class:`~ingest.errors.WriteError` on a MongoDB failure.
        """
        try:
            docs = await self.collection.find(
                {"client": self.client}, {"seq": 1, "n": 1, "entries": 1}, sort=[("seq", ASCENDING)]
            ).to_list()
        except (PyMongoError, InvalidDocument) as exc:
            raise mongo_errors.translate(exc, "lookup") from exc
        return latest(docs, self.keep)

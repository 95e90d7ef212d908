"""--retained: what becomes of a message the broker sent with RETAIN set (old state).

:class:`RetainedPolicy` is the policy the pipeline asks about each such message. A
retained message that the broker sends because the daemon subscribed (its RETAIN flag
set on delivery) is the topic's last state, published some time before. With
``--retained ignore`` it is acknowledged in its turn and counted, never stored; a Homie
attribute (the device's description) is taken as usual whatever --retained says.

With ``--retained store`` its readings are stored; those without a time of their own need
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
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from bson.errors import InvalidDocument
from pymongo import ReadPreference, ReturnDocument
from pymongo.errors import DuplicateKeyError, PyMongoError

from ingest.devices.formats.stateful import DATA
from ingest.errors import RefusedWriteError, WriteError
from ingest.pipeline.retries import until_answered
from ingest.store.writers import as_write_error

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from pymongo.asynchronous.collection import AsyncCollection
    from pymongo.asynchronous.database import AsyncDatabase

    from ingest.config import Settings
    from ingest.metrics import Health, Metrics
    from ingest.model import Inbound
    from ingest.pipeline.retries import Failed

logger = logging.getLogger(__name__)

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


def record_of(settings: Settings, database: AsyncDatabase[dict[str, Any]]) -> FirstSeen | None:
    """Where the daemons record first-seen times: with --retained store, unless a dry run."""
    if settings.retained != "store" or settings.dry_run:
        return None
    return FirstSeen(database[COLLECTION])


@dataclass(frozen=True, slots=True)
class Steps:
    """What the pipeline does for the policy."""

    # Bring the format's state up to date; False: leave the message (closing, or its
    # connection ended meanwhile: the broker sends it again).
    ready: Callable[[Inbound], Awaitable[bool]]
    take: Callable[[Inbound, int], object]  # decode at this time (epoch ms) into the batch
    skip: Callable[[Inbound], None]  # batch it without readings (acknowledged in turn)
    failed: Failed  # a MongoDB failure: the pipeline's wait (backoff, /readyz, the metric)
    closed: Callable[[], bool]  # the pipeline takes nothing more


class RetainedPolicy:
    """--retained: the pipeline's answer to a message delivered with RETAIN set."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        health: Health,
        record: FirstSeen | None,
        steps: Steps,
    ) -> None:
        self._ignore = settings.retained == "ignore"
        self._mapping = settings.mapping
        self._stateful = self._mapping is not None and bool(self._mapping.stateful)
        self._metrics = metrics
        self._health = health
        # Where first-seen times are recorded (None: dry run, or --retained ignore).
        self._record = record
        self._steps = steps
        self._told = False  # the one log line about retained messages is out

    async def submit(self, message: Inbound) -> bool | None:
        """Take a retained ``message`` as --retained says; whether it was taken.

        None: not a state --retained decides about (a Homie attribute), to be taken as
        any message. False: left unacknowledged (closing, or its connection ended while
        its first-seen time was looked up); the broker sends it again.
        """
        if not self._follows(message.topic):
            self._metrics.retained_messages.labels("attribute").inc()
            return None
        if self._ignore:
            self._metrics.retained_messages.labels("skipped").inc()
            self._tell(
                message,
                "skipping them, counted in "
                "ingest_retained_messages_total"
                '{outcome="skipped"} (--retained ignore; --retained store '
                "stores them)",
            )
            self._steps.skip(message)
            return True
        # Decoded at the time this state was first seen, so that a state stored by
        # another delivery already is found by the writer and counted as duplicates, as
        # a redelivery's readings are.
        found = await self._first_seen(message)
        if found is None or not await self._steps.ready(message):
            return False
        ms, new = found
        self._metrics.retained_messages.labels("new" if new else "known").inc()
        self._tell(
            message, "storing them at the time any daemon first saw each state (--retained store)"
        )
        self._steps.take(message, ms)
        return True

    def _follows(self, topic: str) -> bool:
        """Whether a retained message on ``topic`` follows --retained.

        Not a Homie attribute (or command) topic: an attribute is the device's
        description, taken as its state whether --retained ignores old readings or not,
        and never a reading to record a first-seen time for.
        """
        if not self._stateful or self._mapping is None:
            return True
        step = self._mapping.stateful_for(topic)
        return step is None or step.role(topic) == DATA

    def _tell(self, message: Inbound, what: str) -> None:
        """Say once what becomes of retained messages (not once per message)."""
        if not self._told:
            self._told = True
            logger.info(
                "retained messages arrive on subscribing (old state; the first on %r); %s",
                message.topic[:200],
                what,
            )

    async def _first_seen(self, message: Inbound) -> tuple[int, bool] | None:
        """When the retained state was first seen (epoch ms) and whether that is now.

        A MongoDB failure is retried like a write; None if the pipeline closes first
        (the message is left unacknowledged and the broker sends it again). A refusal
        for the data (not expected: the document is a topic, a hash and a date) falls
        back to this arrival's time, logged.
        """
        arrived = int(message.received_at * 1000)
        record = self._record
        if record is None:  # dry run: nothing is recorded
            return arrived, True
        try:
            return await until_answered(
                lambda: record.first_seen(message.topic, message.payload, message.received_at),
                self._steps.failed,
                self._health,
                self._steps.closed,
            )
        except RefusedWriteError as exc:
            logger.error(  # noqa: TRY400
                "cannot record the retained state of %r (storing it at its arrival time): %s",
                message.topic[:200],
                exc,
            )
            return arrived, True

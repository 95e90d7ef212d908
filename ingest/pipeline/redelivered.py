"""The pipeline's side of the delivery ledger (ingest/store/deliveries.py).

Readings without a time of their own take their arrival time, so a message the broker
resends after a crash (DUP, its PUBACK lost) would give its readings new times and have
them stored twice. The times each QoS 1/2 message gave are recorded before its batch's
readings are written (:meth:`Ledger.record`), and a DUP that the running process could
not recognise itself (``ingest/mqtt/source.py`` adopts or acknowledges again those of
its own connections) is decoded with the recorded times (:meth:`Ledger.recorded`).

The broker resends a session's unacknowledged messages on its next connection, in
order, before new ones: the first such DUP of a connection reads the client's entries
once (one query), and every DUP of that connection is looked up in memory.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ingest.errors import RefusedWriteError
from ingest.pipeline.retries import Failed, until_answered
from ingest.store.deliveries import first_delivery

if TYPE_CHECKING:
    from collections.abc import Callable

    from ingest.metrics import Health, Metrics
    from ingest.model import Inbound
    from ingest.pipeline._batcher_py import Batch
    from ingest.store.deliveries import Deliveries, Latest, Recorded

logger = logging.getLogger(__name__)


class Ledger:
    """Record what times messages gave; find them again for their redeliveries."""

    def __init__(
        self,
        deliveries: Deliveries,
        metrics: Metrics,
        health: Health,
        retry: Failed,
        closed: Callable[[], bool],
    ) -> None:
        self._deliveries = deliveries
        self._metrics = metrics
        self._health = health
        self._retry = retry  # the pipeline's wait after a failed write (backoff, health)
        self._closed = closed
        # The times the arrivals gave the message being decoded (see decode.Arrivals);
        # the pipeline moves them to the message's batch (Batch.given).
        self.given: list[int] = []
        # The client's entries as read for connection ``generation``'s DUPs.
        self._read: tuple[int, Latest] | None = None

    async def record(self, batch: Batch) -> None:
        """Record a batch's entries before its readings are written.

        A failure is retried like a write, until recorded: the batch's readings wait
        (and its messages stay unacknowledged). Refused for its data (not expected:
        packed numbers), it is logged and the readings are written without it.
        """
        docs: list[dict[str, Any]] | None = None

        async def write() -> None:
            nonlocal docs
            if docs is None:
                docs = await self._deliveries.documents(batch.deliveries, batch.given)
            await self._deliveries.write(docs)

        try:
            await until_answered(write, self._retry, self._health)
        except RefusedWriteError as exc:
            self._metrics.write_error("rejected")
            logger.error(  # noqa: TRY400
                "cannot record the arrival times of %d messages (a crash "
                "before their PUBACKs would store their redeliveries' readings "
                "twice): %s",
                len(batch.deliveries),
                exc,
            )

    async def recorded(self, message: Inbound) -> Recorded | None:
        """The times the first delivery of this DUP gave, if they were recorded.

        None: not recorded (its first delivery was never written, or came before the
        client's last entries), or the pipeline closes meanwhile (the caller checks).
        """
        read = self._read
        if read is None or read[0] != message.generation:
            entries = await self._entries()
            if entries is None:
                return None
            read = self._read = (message.generation, entries)
        found = first_delivery(read[1], message)
        self._metrics.redeliveries_retimed.labels(
            "unrecorded" if found is None else "recorded"
        ).inc()
        return found

    async def _entries(self) -> Latest | None:
        """The client's entries, retried like a write; None if the pipeline closes first."""
        entries = await until_answered(
            self._deliveries.tail, self._retry, self._health, self._closed
        )
        if entries is not None:
            logger.info(
                "a message resent after a restart (DUP): %d arrival times recorded "
                "for client %s, for its readings without a time of their own",
                len(entries),
                self._deliveries.client,
            )
        return entries

"""Size-or-linger batching. Pure and synchronous, so it is tested with a fake clock."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from ingest.model import Inbound, Reading


_NOTHING: list[int] = []  # no times given (never appended to)


@dataclass(slots=True)
class Batch:
    """Messages to acknowledge together, once their readings and rejects are written."""

    number: int
    opened_at: float
    messages: list[Inbound] = field(default_factory=list)
    readings: list[Reading] = field(default_factory=list)
    rejects: list[dict[str, Any]] = field(default_factory=list)
    # ends[i] is the index in ``readings`` just past message i's readings.
    ends: list[int] = field(default_factory=list)
    # Estimated memory the batch holds (see pipeline.held_bytes), released once acked.
    held_bytes: int = 0
    # QoS 1/2 messages whose readings were timed at arrival, and per message the number
    # of times given then the times (flat: no object per message), recorded in the
    # delivery ledger before the readings are written (ingest/store/deliveries.py).
    deliveries: list[Inbound] = field(default_factory=list)
    given: list[int] = field(default_factory=list)

    def origin(self) -> dict[int, Inbound]:
        """Map ``id(reading)`` to the message it came from (for error reports)."""
        owners: dict[int, Inbound] = {}
        start = 0
        for message, end in zip(self.messages, self.ends, strict=True):
            for reading in self.readings[start:end]:
                owners[id(reading)] = message
            start = end
        return owners


def merged(batches: list[Batch]) -> Batch:
    """One batch holding several, in order (for a single write of a backlog)."""
    if len(batches) == 1:
        return batches[0]
    out = Batch(batches[0].number, batches[0].opened_at)
    for batch in batches:
        offset = len(out.readings)
        out.messages.extend(batch.messages)
        out.readings.extend(batch.readings)
        out.ends.extend(end + offset for end in batch.ends)
        out.rejects.extend(batch.rejects)
        out.held_bytes += batch.held_bytes
        out.deliveries.extend(batch.deliveries)
        out.given.extend(batch.given)
    return out


class Batcher:
    """Close a batch at ``max_items`` readings or messages, or ``linger`` s after it opened."""

    def __init__(
        self, max_items: int, linger: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._max = max_items
        self._linger = linger
        self._clock = clock
        # The open batch, if any (read by the pipeline: an attribute, not a call).
        self.current: Batch | None = None
        self._numbers = 0

    def add(
        self,
        message: Inbound,
        readings: list[Reading],
        rejects: list[dict[str, Any]],
        held_bytes: int = 0,
        given: list[int] = _NOTHING,
    ) -> Batch | None:
        """Add one decoded message (holding ``held_bytes``); return the batch if it is full.

        ``given``: the times its readings were given at arrival, moved (the list is
        emptied) into the batch's ``given`` for the delivery ledger, if it can be resent
        (QoS 1).
        """
        batch = self.current
        if batch is None:
            self._numbers += 1
            batch = self.current = Batch(self._numbers, self._clock())
        batch.messages.append(message)
        batch.readings.extend(readings)
        batch.ends.append(len(batch.readings))
        if rejects:
            batch.rejects.extend(rejects)
        if given:
            if message.qos:  # (QoS 0 is never resent)
                batch.deliveries.append(message)
                batch.given.append(len(given))
                batch.given += given
            given.clear()
        batch.held_bytes += held_bytes
        if len(batch.readings) >= self._max or len(batch.messages) >= self._max:
            self.current = None
            return batch
        return None

    def deadline(self) -> float | None:
        """When the open batch must be flushed, or None if no batch is open."""
        return None if self.current is None else self.current.opened_at + self._linger

    def due(self) -> Batch | None:
        """Close and return the open batch if its linger has passed."""
        deadline = self.deadline()
        if deadline is not None and self._clock() >= deadline:
            return self.take()
        return None

    def take(self) -> Batch | None:
        """Close and return the open batch now (flush on close)."""
        batch, self.current = self.current, None
        return batch

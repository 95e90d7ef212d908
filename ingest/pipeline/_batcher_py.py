# cython: annotation_typing=False
"""Size-or-linger batching, and the usual message's way into the open batch, written once.

Batching is pure and synchronous, so it is tested with a fake clock. Every message taken
passes through :meth:`Intake.take_now` or :meth:`Intake.put`:
this module runs as it is, and Cython compiles it as ``ingest.pipeline._batcher_c`` with
the C types of ``_batcher_c.pxd`` (the batch, the batcher and the intake extension types,
their counts C fields; setup.py); ingest/pipeline/batcher.py picks one of the two.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ingest.devices.decode import value_count
from ingest.model import Inbound, Reading

try:
    import cython
except ImportError:  # Cython builds the accelerators; it is not needed to run
    from ingest import _cython_shim as cython

if TYPE_CHECKING:
    from collections.abc import Callable

    # (For mypy alone: Cython compiles no ``type`` statement.)
    from typing import TypeAlias

    from ingest.devices.decode import Arrivals, Limits
    from ingest.model import Decoded, Rejection

    # decode(topic, payload, received_at, limits, sensor, arrivals)
    Decode: TypeAlias = Callable[  # noqa: UP040
        [str, bytes, float, Limits, str | None, Arrivals | None], Decoded
    ]

_NOTHING: list[int] = []  # no times given (never appended to)
# Python memory of what a message leaves in a batch besides its payload (measured with
# tracemalloc on decoded messages, rounded up): the message itself, each reading (a
# tuple, its datetime and values dict), each value, each reject document.
MESSAGE_BYTES = 256
READING_BYTES = 512
VALUE_BYTES = 48
REJECT_DOC_BYTES = 768
# The reject documents of a message with none (shared: nothing appends to it).
NO_DOCS: list[dict[str, Any]] = []
# Fields by position (ingest.model's order, checked below): compiled, read in C.
_TOPIC, _PAYLOAD, _RECEIVED_AT, _DUP, _RETAINED = 0, 1, 5, 6, 7
_VALUES = 3
if [Inbound._fields[i] for i in (_TOPIC, _PAYLOAD, _RECEIVED_AT, _DUP, _RETAINED)] != [
    "topic",
    "payload",
    "received_at",
    "dup",
    "retained",
] or Reading._fields[_VALUES] != "values":
    raise ImportError(f"ingest.model has other fields: {Inbound._fields}, {Reading._fields}")
if not cython.compiled:  # compiled: ingest/_capi.pxd's checked_tuple

    def _fields(row: tuple[Any, ...]) -> tuple[Any, ...]:
        """A NamedTuple typed as the tuple it is; as Python, itself (never called)."""
        return row


def held_bytes(message: Inbound, readings: list[Reading], docs: list[dict[str, Any]]) -> int:
    """Estimated memory one taken message holds until it is acknowledged."""
    size = MESSAGE_BYTES + len(message.payload) + len(message.topic)
    if readings:
        size += READING_BYTES * len(readings) + VALUE_BYTES * value_count(readings)
    for doc in docs:
        size += REJECT_DOC_BYTES + len(doc["payload"]) + len(doc["detail"])
    return size


class Batch:
    """Messages to acknowledge together, once their readings and rejects are written."""

    def __init__(self, number: int, opened_at: float) -> None:
        self.number = number
        self.opened_at = opened_at
        self.messages: list[Inbound] = []
        self.readings: list[Reading] = []
        self.rejects: list[dict[str, Any]] = []
        # ends[i] is the index in ``readings`` just past message i's readings.
        self.ends: list[int] = []
        # Estimated memory the batch holds (see held_bytes), released once acked.
        self.held_bytes = 0
        # QoS 1/2 messages whose readings were timed at arrival, and per message the
        # number of times given then the times (flat: no object per message), recorded
        # in the delivery ledger before the readings are written
        # (ingest/store/deliveries.py).
        self.deliveries: list[Inbound] = []
        self.given: list[int] = []

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


class Intake:
    """What the pipeline holds and has taken, and the way of a message into the open batch.

    The counts are plain ints handed to the metrics at scrape time (a Prometheus counter
    takes a lock on every ``inc``); ``buffered`` and ``held_bytes`` are the readings and
    estimated bytes taken and not yet written, which bound what the pipeline takes.
    :meth:`take_now` is tried for every message: a message of the default format (no
    mapping rules, no ``--sensor-id-from-topic``) it decodes itself, compiled one C call
    per message; the others it hands to the pipeline's ``take`` step. Every decoded
    message ends in :meth:`put`.
    """

    def __init__(
        self,
        batcher: Batcher,
        limits: Limits,
        max_buffered: int,
        max_held_bytes: int,
        usual: bool,
        stateful: bool,
        steps: IntakeSteps,
    ) -> None:
        self.batcher = batcher
        self.max_buffered = max_buffered
        self.max_held_bytes = max_held_bytes
        self.usual = usual
        self.stateful = stateful
        self.closed = False
        self.buffered = self.held_bytes = 0
        self.received = self.received_bytes = self.accepted = 0
        self._limits = limits
        self._decode = steps.decode
        self._arrivals = steps.arrivals
        self._given = steps.given
        self._take = steps.take
        self._reject = steps.reject
        self._reject_docs = steps.reject_docs
        self._dispatch = steps.dispatch
        self._opened = steps.opened

    def full(self) -> bool:
        """Whether the pipeline holds as much as it may (readings or bytes)."""
        return self.buffered >= self.max_buffered or self.held_bytes >= self.max_held_bytes

    def take_now(self, message: Inbound) -> bool | None:
        """Take a message into the open batch now, if nothing must wait: True.

        None when the pipeline must take it instead, with a coroutine (it is full, the
        format may need I/O first, or the message is retained or a redelivery); False
        once closed. The source calls this for every message.
        """
        if self.closed:
            return False
        row = _fields(message) if cython.compiled else message
        if (
            self.buffered >= self.max_buffered
            or self.held_bytes >= self.max_held_bytes
            or self.stateful
            or row[_RETAINED]
            or row[_DUP]
        ):
            return None
        if not self.usual:
            self._take(message)
            return True
        payload = row[_PAYLOAD]
        self.received += 1
        self.received_bytes += len(payload)
        decoded = self._decode(
            row[_TOPIC], payload, row[_RECEIVED_AT], self._limits, None, self._arrivals
        )
        parts = _fields(decoded) if cython.compiled else decoded
        self.put(message, parts[0], parts[1])
        return True

    def put(
        self, message: Inbound, readings: list[Reading], rejections: list[Rejection]
    ) -> Batch | None:
        """Put a decoded message into the open batch: its counts, rejects and held bytes.

        With the times given to its readings timed at arrival, if a delivery ledger is
        kept. A batch this fills is dispatched (and returned); a batch this opens wakes
        the linger timer.
        """
        count = len(readings)
        self.accepted += count
        self.buffered += count
        docs = NO_DOCS
        if rejections:
            for rejection in rejections:
                self._reject(rejection.reason)
            docs = self._reject_docs(message, rejections)
            size = held_bytes(message, readings, docs)
        elif count == 1:  # held_bytes of the usual message, inline
            row = _fields(message) if cython.compiled else message
            first = _fields(readings[0]) if cython.compiled else readings[0]
            values: dict[str, Any] = first[_VALUES]
            size = MESSAGE_BYTES + READING_BYTES + len(row[_PAYLOAD]) + len(row[_TOPIC])
            size += VALUE_BYTES * len(values)
        else:
            size = held_bytes(message, readings, docs)
        self.held_bytes += size
        batcher = self.batcher
        had_open = batcher.current is not None
        full = batcher.add(message, readings, docs, size, self._given)
        if full is not None:
            self._dispatch(full)
        elif not had_open:
            self._opened()
        return full


class IntakeSteps:
    """What :class:`Intake` calls: the decoder and the pipeline's steps."""

    def __init__(
        self,
        decode: Decode,
        arrivals: Arrivals,
        given: list[int],
        take: Callable[[Inbound], Batch | None],
        reject: Callable[[str], None],
        reject_docs: Callable[[Inbound, list[Rejection]], list[dict[str, Any]]],
        dispatch: Callable[[Batch], None],
        opened: Callable[[], None],
    ) -> None:
        self.decode = decode
        self.arrivals = arrivals
        self.given = given
        self.take = take  # the pipeline's own way in, for a format other than the default
        self.reject = reject
        self.reject_docs = reject_docs
        self.dispatch = dispatch
        self.opened = opened

# cython: annotation_typing=False
"""The acknowledgement ledger: which QoS 1 messages get their PUBACK, when, and on which connection.

Plain bookkeeping over what the source reports (a message's arrival with its packet id,
DUP flag and connection; its write; the connection coming and going) and one injected
callback that sends PUBACKs: no client library inside, so it runs without a broker
(tests/mqtt/test_acks.py drives it with a model broker). The rules, from MQTT
3.1.1 and MQTT 5 §4.6 and what brokers do:

- A message is acknowledged only after its readings are written, on the connection that
  may acknowledge it: the one it arrived on, or the later one whose DUP redelivery
  adopted it (:meth:`AckLedger.arrived`), so a reconnect writes nothing twice.
- PUBACKs go out in the order their PUBLISHes arrived on the connection: a written
  message waits for every message that arrived before it (:attr:`AckLedger._line`),
  whatever order the writes finish in.
- A broker reuses a packet id only after its PUBACK, except mosquitto draining a backlog
  of more than 65,535 messages (it numbers a message when it queues it): it then sends
  new messages under ids still unacknowledged and deletes, on a PUBACK, the oldest
  unacknowledged message with that id. So the messages of one id are acknowledged in
  the order they arrived (:class:`_Reused`).
- After a reconnect the broker resends its unacknowledged messages first, in order, with
  DUP set. A PUBACK cannot be confirmed: one queued just before the connection died may
  never have reached the broker. So a written and acknowledged message is remembered
  (topic, payload size and hash) until the broker has certainly received its PUBACK, and
  a DUP that matches is acknowledged again instead of being written again. "Certainly
  received" is proved by one of: the broker reusing the packet id for a new message;
  Receive Maximum more messages arriving on the same connection after the PUBACK
  (PUBACKs go out in order and the broker keeps at most Receive Maximum messages
  unacknowledged, so it cannot have sent them without reading it); a new message (not
  DUP) on a later connection of the session; or a new session. (A broker that reuses
  ids still unacknowledged, and then exceeds Receive Maximum, breaks the first two: a
  PUBACK forgotten too early only makes its redelivery written again.)

Every QoS 1 message passes through the ledger twice (its arrival, its write): this
module runs as it is, and Cython compiles it as ``ingest.mqtt._acks_c`` with the C types
of ``_acks_c.pxd`` (the ledger an extension type, its state C fields, its helpers C
calls; setup.py); ingest/mqtt/acks.py picks one of the two.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

try:
    import cython
except ImportError:  # Cython builds the accelerators; it is not needed to run
    from ingest import _cython_shim as cython

from ingest.model import Inbound

if TYPE_CHECKING:
    from collections.abc import Callable, MutableSequence
    from typing import TypeAlias

    # (For mypy alone: Cython compiles no ``type`` statement.)
    # Sends the PUBACKs of these messages, in this order, on the current connection.
    Send: TypeAlias = Callable[[list[Inbound]], None]  # noqa: UP040
    # See _Remembered.record.
    _Acked: TypeAlias = tuple[int, int, str, int, int]  # noqa: UP040

# Compiled, this is cimported (_acks_c.pxd): the C-level helpers (ingest/_capi.pxd).
_capi: Any = None
# A message's fields by position (compiled, read in C: an attribute is found by name).
_TOPIC, _PAYLOAD, _MID, _QOS, _GENERATION, _DUP = (
    Inbound._fields.index(name) for name in ("topic", "payload", "mid", "qos", "generation", "dup")
)

MIDS = 65536  # packet ids are 1 to 65,535
# The entries of _Remembered's ring (a power of two): twice as many as ids can be
# remembered at once, so it is full only after as many stale entries (rewritten then).
RING = 2 * MIDS


@dataclass(slots=True)
class _Unacked:
    """A QoS 1 message whose acknowledgement is not simply its own connection's business.

    Either it is written and waits for its turn or for the connection that may
    acknowledge it (``written``), or a DUP redelivery on a later connection adopted it
    (``owner``). Every other unacknowledged message is held in ``AckLedger._unacked`` as
    itself (its owner is the connection it came on): one object less per message.
    """

    message: Inbound
    owner: int
    written: bool = False


class _Reused(list["Inbound | _Unacked"]):
    """The unacknowledged messages under one packet id, oldest first (as the broker has them).

    Only an id with more than one message has a list: the usual entry of
    ``AckLedger._unacked`` is the message itself or its :class:`_Unacked` record.
    """

    __slots__ = ()


@dataclass(slots=True)
class _Reack:
    """A DUP of a message already written and acknowledged: its PUBACK is sent again."""

    message: Inbound


def _zeros(count: int, kind: str = "q") -> MutableSequence[int]:
    """``count`` zeros: compiled, an array of C integers (64-bit signed, or ``kind``).

    As Python, a list: storing an int in it costs less than converting it for an array.
    """
    return array(kind, bytes(array(kind).itemsize * count)) if cython.compiled else [0] * count


class _Remembered:
    """The messages whose PUBACK is queued or sent but perhaps not received by the broker.

    By packet id: the connection its PUBACK was queued on, the QoS 1 messages received
    on that connection by then, and its topic, payload size and payload hash (to
    recognise its DUP); and the ids in the order acknowledged. Held in arrays indexed by
    packet id and a ring of ids, so remembering a PUBACK allocates nothing: one is
    remembered per acknowledged message, and a dict of tuples (an object, a hash int and
    a dict entry each, up to Receive Maximum twice over) cost more than the rest of the
    ledger. A record's ticket is its position in the ring plus one; an id acknowledged
    again or forgotten leaves its old entry there, stale (its ticket is no longer the
    id's), skipped when it reaches the front.
    """

    def __init__(self) -> None:
        self._mask = RING - 1
        self._on = _zeros(MIDS)
        self._seq = _zeros(MIDS)
        self._size = _zeros(MIDS)
        self._hash = _zeros(MIDS)
        self.clear()

    def clear(self) -> None:
        """Forget every PUBACK."""
        self._ticket = _zeros(MIDS)  # the ring position + 1 of the id's record; 0: none
        self._topic: list[str | None] = [None] * MIDS
        self._ring = _zeros(self._mask + 1, "H")  # packet ids, oldest at _head
        self._head = 0  # positions grow without bound; the slot is position & _mask
        self._tail = 0
        self.count = 0  # the records held

    def put(self, messages: list[Inbound], on: int, seq: int) -> None:
        """Remember the PUBACKs just queued on connection ``on`` (the newest, in order).

        ``seq``: the QoS 1 messages received on ``on`` by then.
        """
        ticket, ring, topics = self._ticket, self._ring, self._topic
        ons, seqs, sizes, hashes = self._on, self._seq, self._size, self._hash
        count, tail, mask = self.count, self._tail, self._mask
        for message in messages:
            if cython.compiled:
                fields = _capi.checked_tuple(message)
                mid, payload, topic = fields[_MID], fields[_PAYLOAD], fields[_TOPIC]
            else:
                mid, payload, topic = message.mid, message.payload, message.topic
            at = mid
            if not 0 < at < MIDS:
                at = _slot(at)  # raises
            if ticket[at]:
                count -= 1  # its earlier record's entry is stale now
            if tail - self._head > mask:
                self._tail, self.count = tail, count
                self._compact()
                ring, tail = self._ring, self._tail
            ring[tail & mask] = at
            tail += 1
            ticket[at] = tail
            ons[at] = on
            seqs[at] = seq
            sizes[at] = len(payload)
            hashes[at] = hash(payload)
            topics[at] = topic
            count += 1
        self._tail, self.count = tail, count

    def drop(self, mid: int) -> None:
        """Forget the PUBACK of ``mid``, if remembered (its entry in the ring goes stale)."""
        at = _slot(mid)
        if self._ticket[at]:
            self._forget(at)

    def matches(self, mid: int, topic: str, payload: bytes) -> bool:
        """Whether the PUBACK of ``mid`` is remembered for this topic and payload."""
        at = _slot(mid)
        return (
            self._ticket[at] != 0
            and self._size[at] == len(payload)
            and self._hash[at] == hash(payload)
            and self._topic[at] == topic
        )

    def forget_certain(self, fresh_on: int, received_on: int, proven: int) -> None:
        """Forget, oldest first, the PUBACKs the broker has certainly received.

        Its DUP would have come before a new message on a later connection (``fresh_on``
        is the last connection a new message came on); or the broker sent Receive Maximum
        more on its connection after it (``proven``: the messages received on connection
        ``received_on`` less Receive Maximum).
        """
        while self._head < self._tail:
            at = self._ring[self._head & self._mask]
            if self._ticket[at] == self._head + 1:
                on = self._on[at]
                if not (on < fresh_on or (on == received_on and self._seq[at] <= proven)):
                    return
                self._forget(at)
            self._head += 1

    def bound(self, limit: int) -> None:
        """Forget the oldest PUBACKs past ``limit`` records (a hard bound)."""
        while self.count > limit:
            at = self._ring[self._head & self._mask]
            if self._ticket[at] == self._head + 1:
                self._forget(at)
            self._head += 1

    def _forget(self, at: int) -> None:
        """Forget the record of packet id ``at`` (remembered)."""
        self._ticket[at] = 0
        self._topic[at] = None
        self.count -= 1

    def mids(self) -> list[int]:
        """The packet ids remembered, oldest first."""
        out: list[int] = []
        for position in range(self._head, self._tail):
            at = self._ring[position & self._mask]
            if self._ticket[at] == position + 1:
                out.append(at)
        return out

    def record(self, mid: int) -> _Acked | None:
        """(connection, messages received by then, topic, size, hash) of ``mid``'s PUBACK."""
        at = _slot(mid)
        topic = self._topic[at]
        if not self._ticket[at] or topic is None:
            return None
        return (self._on[at], self._seq[at], topic, self._size[at], self._hash[at])

    def _compact(self) -> None:
        """Rewrite the full ring with its records alone, oldest first, from position 0."""
        mids = self.mids()
        self._ring = _zeros(self._mask + 1, "H")
        for position, at in enumerate(mids):
            self._ring[position] = at
            self._ticket[at] = position + 1
        self._head, self._tail = 0, len(mids)


def _slot(mid: int) -> int:
    """A packet id as an index of _Remembered's arrays (a ValueError if it is none)."""
    at: int = mid
    if not 0 < at < MIDS:
        raise ValueError(f"packet id {mid} is not 1 to {MIDS - 1}")
    return at


class AckLedger:
    """The QoS 1 messages received and not acknowledged, and the PUBACKs they are owed."""

    def __init__(self, window: int, send: Send) -> None:
        self._window = window  # Receive Maximum: the broker's unacknowledged messages
        self._send = send
        self._generation = 0  # the connection that acknowledges (the last connected)
        self._open = False  # whether that connection is up
        # QoS 1 messages received and not yet acknowledged, by packet id: the message
        # itself, or an _Unacked record once its state is more than that; a _Reused list
        # of them, oldest first, while the broker has several under one id.
        self._unacked: dict[int, Inbound | _Unacked | _Reused] = {}
        # The PUBACKs owed on connection _line_of, in the order their PUBLISHes arrived:
        # each message (an adopted one at its DUP's arrival) and each _Reack. Entries
        # forgotten meanwhile are dropped when they reach the front.
        self._line: deque[Inbound | _Reack] = deque()
        self._line_of = 0
        # Packet ids under which a message was forgotten on _line's connection: the broker
        # still holds it, so a PUBACK under its id would delete it (see forget).
        self._forgotten: set[int] = set()
        # Acknowledged messages whose PUBACK may not have reached the broker, by packet id,
        # in the order acknowledged.
        self._acked = _Remembered()
        self._received = 0  # QoS 1 messages received on connection _received_on
        self._received_on = 0
        self._fresh_on = 0  # the last connection a new (not DUP) QoS 1 message came on
        # Counts since the last take_counts(): new messages under an unacknowledged id,
        # DUPs adopted, DUPs acknowledged again, and first PUBACKs sent outside written().
        self.reused = self.adopted = self.reacked = self.acked_late = 0

    def take_counts(self) -> tuple[int, int, int, int]:
        """(reused, adopted, reacked, acked_late) since the last call, now zero."""
        counts = self.reused, self.adopted, self.reacked, self.acked_late
        self.reused = self.adopted = self.reacked = self.acked_late = 0
        return counts

    # -- the connection ------------------------------------------------------------

    def connected(self, generation: int) -> None:
        """Connection ``generation`` is up: it acknowledges from now on."""
        self._generation, self._open = generation, True
        self._line_for(generation)
        # Redeliveries adopted before this point (they arrive right after CONNACK) whose
        # write had already finished, and DUPs to acknowledge again: sent now.
        self.acked_late += self._flush()

    def disconnected(self) -> None:
        """The connection is gone: PUBACKs wait for the next one."""
        self._open = False

    def new_session(self, generation: int) -> None:
        """Connection ``generation`` began a new session: nothing will be resent.

        The earlier connections' messages can never be acknowledged (their readings are
        still written, at least once), and no PUBACK is in doubt.
        """
        self._drop_before(generation)
        self._acked.clear()

    def _line_for(self, generation: int) -> None:
        if self._line_of != generation:
            self._line_of = generation
            self._line = deque()
            self._forgotten = set()

    # -- arrivals ------------------------------------------------------------------

    def arrived(self, message: Inbound) -> bool:
        """Account for a QoS 1 message; True if it is new to the pipeline.

        False for a DUP adopted by its original in the pipeline or acknowledged again.
        """
        if cython.compiled:  # by position, in C (see _Remembered.put)
            fields = _capi.checked_tuple(message)
            generation, mid, dup = fields[_GENERATION], fields[_MID], fields[_DUP]
        else:
            generation, mid, dup = message.generation, message.mid, message.dup
        if self._line_of != generation:
            self._line_for(generation)
        if self._received_on != generation:
            self._received_on, self._received = generation, 0
        self._received += 1
        if not dup:
            # The id is reused: its PUBACK arrived, or (a broker that reuses ids still
            # unacknowledged) it may not have, and a redelivery is written again.
            self._acked.drop(mid)
            if self._fresh_on != generation:
                self._resent(generation)
        elif self._redelivered(message) or self._reacked(message):
            return False
        if self._unacked.setdefault(mid, message) is not message:
            self._queue(message)
        self._line.append(message)
        return True

    def _resent(self, generation: int) -> None:
        """The first new message of a connection: the broker has resent what it holds.

        It resends its unacknowledged messages first, in order; one from an earlier
        connection not resent by now (expired at the broker) never will be, and must
        not hold back the messages behind it with its packet id.
        """
        self._fresh_on = generation
        self._drop_before(generation)

    def _drop_before(self, generation: int) -> None:
        """Forget the unacknowledged messages of connections before ``generation``.

        Their readings are written (at least once) but never acknowledged: the broker
        does not hold them any more (a new session, or not resent on a resumed one).
        """
        unacked, dropped = self._unacked, False
        for mid, entry in list(unacked.items()):
            if not isinstance(entry, _Reused):
                if _owner(entry) < generation:
                    del unacked[mid]
                continue
            kept = [e for e in entry if _owner(e) >= generation]
            if len(kept) < len(entry):
                entry[:] = kept
                self._settle(mid, entry)
                dropped = True
        if dropped:  # what they held back under their ids may go now
            self.acked_late += self._flush()

    def _queue(self, message: Inbound) -> None:
        """Put a message behind the unacknowledged ones with its packet id.

        A new message goes last. A redelivery processed as new (its original was not
        taken) goes where the broker has it: behind the ones this connection had resent
        already, ahead of those of earlier connections not resent yet.
        """
        mid, generation = message.mid, message.generation
        entry = self._unacked[mid]
        if not isinstance(entry, _Reused):  # the usual case: one message held
            pair = (message, entry) if _owner(entry) < generation else (entry, message)
            self._unacked[mid] = _Reused(pair)
        else:
            at = len(entry)  # usually: all of them came on this connection
            for i, e in enumerate(entry):
                if _owner(e) < generation:
                    at = i
                    break
            entry.insert(at, message)
        if not message.dup:
            self.reused += 1

    def _redelivered(self, message: Inbound) -> bool:
        """Adopt a DUP redelivery of a message already in the pipeline; True if adopted.

        Of the messages with its packet id, the oldest that this connection has not
        adopted yet and that matches (topic and payload); those of earlier connections
        ahead of it were not resent (the broker resends in order), so no longer hold it
        back. Every message of an earlier connection still held was taken by the
        pipeline: the source forgets the others when their connection ends.
        """
        mid, generation = message.mid, message.generation
        held = self._unacked.get(mid)
        entries = held if isinstance(held, _Reused) else () if held is None else (held,)
        at = next(
            (
                i
                for i, entry in enumerate(entries)
                if _owner(entry) != generation and _resends(_message_of(entry), message)
            ),
            -1,
        )
        if at < 0:
            return False  # not in the pipeline: process the redelivery as a new message
        record = self._record(mid, at, entries[at])
        record.owner = generation
        if isinstance(held, _Reused) and at:
            held[:at] = [e for e in held[:at] if _owner(e) >= generation]
            self._settle(mid, held)
        self.adopted += 1
        self._line.append(record.message)  # its PUBACK's turn: this arrival's
        self.acked_late += self._flush()
        return True

    def _reacked(self, message: Inbound) -> bool:
        """Acknowledge again, in its turn, a DUP of a message written and acknowledged."""
        if not self._acked.matches(message.mid, message.topic, message.payload):
            return False
        if message.mid in self._forgotten:
            return True  # not acknowledged (see forget), nor taken: resent next time
        self.reacked += 1
        self._line.append(_Reack(message))
        self._flush()
        return True

    # -- writes --------------------------------------------------------------------

    def written(self, messages: list[Inbound]) -> int:
        """Acknowledge written messages; return how many PUBACKs this sent (QoS 0: done).

        A message is acknowledged on the connection that owns it, once every message that
        arrived before it there is acknowledged (or forgotten) and, under its packet id,
        every older one: until then it waits, and goes out with the write that frees it
        (counted in that call's return). The PUBACKs of one call go out in one write.
        """
        unacked, line = self._unacked, self._line
        usual = self._open and self._line_of == self._generation
        done, now, waiting = 0, [], False
        for message in messages:
            if cython.compiled:  # by position, in C (see _Remembered.put)
                fields = _capi.checked_tuple(message)
                qos, mid = fields[_QOS], fields[_MID]
            else:
                qos, mid = message.qos, message.mid
            if not qos:
                done += 1  # nothing to acknowledge: done with
            elif usual and line and line[0] is message:
                # The usual cases, inlined: next in line, and nothing else under its id,
                # or the oldest of the messages under it (mosquitto's reuse, see _queue).
                # Held as itself, it is owned by the connection it came on: this one.
                held = unacked.get(mid)
                if held is message:
                    del unacked[mid]
                elif type(held) is _Reused and held[0] is message:
                    del held[0]
                    self._settle(mid, held)
                else:
                    waiting = self._mark_written(message) or waiting
                    continue
                line.popleft()
                now.append(message)
            else:
                waiting = self._mark_written(message) or waiting
        fast = len(now)
        if waiting or (now and line):  # (the front may be one written earlier, waiting)
            fast += self._due(now)
        if now:
            self._send(now)
            self._remember(now)
        return done + fast

    def _mark_written(self, message: Inbound) -> bool:
        """Record a QoS 1 message written; False if it is no longer held.

        Forgotten: the session was lost, or the broker did not resend it.
        """
        mid = message.mid
        held = self._unacked.get(mid)
        entries = held if isinstance(held, _Reused) else () if held is None else (held,)
        for at, entry in enumerate(entries):
            if _message_of(entry) is message:
                self._record(mid, at, entry).written = True
                return True
        return False

    def forget(self, message: Inbound) -> None:
        """Forget an unacknowledged message the pipeline did not take.

        With the ones behind it under its packet id: acknowledging one of them would
        make the broker delete this one (the oldest), and they came later, so were not
        taken either (or, from an earlier connection, are written again when resent).
        """
        mid = message.mid
        held = self._unacked.get(mid)
        if isinstance(held, _Reused):
            for at, entry in enumerate(held):
                if _message_of(entry) is message:
                    del held[at:]
                    self._settle(mid, held)
                    break
        elif held is not None and _message_of(held) is message:
            del self._unacked[mid]
        else:
            return
        # Nor is a DUP under its id acknowledged again on this connection: the one taken
        # for a message acknowledged before may be a newer one with the same topic and
        # payload, under an id the broker reused, and the PUBACK would delete this one.
        # (The pipeline takes nothing more once it refuses: no first PUBACK follows.)
        # Unacknowledged, such a DUP is resent on the next connection.
        self._forgotten.add(mid)
        self.acked_late += self._flush()  # what waited behind it in line

    # -- sending -------------------------------------------------------------------

    def _flush(self) -> int:
        """Send the PUBACKs at the front of the line that are due; how many were first ones."""
        due: list[Inbound] = []
        first = self._due(due)
        if due:
            self._send(due)
            self._remember(due)
        return first

    def _due(self, due: list[Inbound]) -> int:
        """Move the messages at the front of the line whose PUBACK is due into ``due``.

        None until the line's connection is up; the front waits while it is not written
        or an older message under its packet id is unacknowledged. Returns how many are
        first PUBACKs (not DUPs acknowledged again).
        """
        if not self._open or self._line_of != self._generation:
            return 0
        line, generation, first = self._line, self._generation, 0
        while line:
            head = line[0]
            if isinstance(head, _Reack):
                if head.message.mid not in self._forgotten:  # (see forget)
                    due.append(head.message)
                line.popleft()
                continue
            message = head
            mid = message.mid
            held = self._unacked.get(mid)
            if isinstance(held, _Reused):
                at = next((i for i, e in enumerate(held) if _message_of(e) is message), -1)
                if at > 0 or (at == 0 and not _done(held[0], generation)):
                    break
                if at == 0:
                    held.pop(0)
                    self._settle(mid, held)
                    due.append(message)
                    first += 1
            elif held is not None and _message_of(held) is message:
                if not _done(held, generation):
                    break
                del self._unacked[mid]
                due.append(message)
                first += 1
            line.popleft()  # acknowledged now, or forgotten meanwhile
        return first

    def _remember(self, messages: list[Inbound]) -> None:
        """Keep what identifies the QoS 1 messages whose PUBACKs were just queued."""
        generation = self._generation
        seq = self._received if self._received_on == generation else 0
        self._acked.put(messages, generation, seq)
        self._forget_acked()
        self._acked.bound(2 * self._window)  # a hard bound; the proofs normally come first

    def _forget_acked(self) -> None:
        """Forget the PUBACKs the broker has certainly received (oldest first).

        Done per batch of PUBACKs rather than per message received: remembering one a
        little longer costs a few bytes, not correctness.
        """
        self._acked.forget_certain(self._fresh_on, self._received_on, self._received - self._window)

    # -- the records ---------------------------------------------------------------

    def _record(self, mid: int, at: int, entry: Inbound | _Unacked) -> _Unacked:
        """The unacknowledged ``entry`` (``at`` in its id's list) as a record, to change."""
        if isinstance(entry, _Unacked):
            return entry
        record = _Unacked(entry, entry.generation)
        held = self._unacked[mid]
        if isinstance(held, _Reused):
            held[at] = record
        else:
            self._unacked[mid] = record
        return record

    def _settle(self, mid: int, held: _Reused) -> None:
        """Store a packet id's shortened list as the usual entry once one is left."""
        if len(held) > 1:
            return
        if held:
            self._unacked[mid] = held[0]
        else:
            del self._unacked[mid]

    def remembered(self) -> list[int]:
        """The packet ids whose PUBACKs may not have reached the broker, oldest first."""
        return self._acked.mids()

    def remembered_record(self, mid: int) -> _Acked | None:
        """What identifies the remembered PUBACK of ``mid`` (see _Remembered), or None."""
        return self._acked.record(mid)

    def unacknowledged(self) -> list[int]:
        """The packet ids with messages received and not acknowledged."""
        return sorted(self._unacked)


def _owner(entry: Inbound | _Unacked) -> int:
    """The connection that may acknowledge an unacknowledged message."""
    return entry.owner if isinstance(entry, _Unacked) else entry.generation


def _done(entry: Inbound | _Unacked, generation: int) -> bool:
    """Whether an unacknowledged message is written and connection ``generation`` owns it."""
    return isinstance(entry, _Unacked) and entry.written and entry.owner == generation


def _message_of(entry: Inbound | _Unacked) -> Inbound:
    """The unacknowledged message an entry of ``AckLedger._unacked`` stands for."""
    return entry.message if isinstance(entry, _Unacked) else entry


def _resends(original: Inbound, message: Inbound) -> bool:
    """Whether a DUP ``message`` is a redelivery of ``original`` (same topic and payload)."""
    return original.topic == message.topic and original.payload == message.payload

"""The acknowledgement ledger (ingest/mqtt/acks.py) on its own: no broker, no client library.

A state machine plays a broker that follows MQTT §4.6 (and mosquitto's packet-id reuse
while a backlog wraps the ids), the source's inbox and the pipeline's writes finishing in
any order, against one :class:`AckLedger`; it checks, after every step, what the broker
and the readings depend on.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ingest.config import MAX_RECEIVE_MAXIMUM
from ingest.model import Inbound
from ingest.mqtt._acks_py import RING
from ingest.mqtt.acks import AckLedger

TOPIC = "t/s1/readings"


def test_remembered_pubacks_are_forgotten_once_the_broker_has_certainly_read_them() -> None:
    """The memory behind re-acknowledging DUPs stays within Receive Maximum entries on a
    connection, and each proof of receipt forgets what it proves."""
    window = 5
    sent: list[int] = []
    ledger = AckLedger(window, lambda messages: sent.extend(m.mid for m in messages))
    ledger.connected(1)

    def arrive(mid: int, payload: bytes, generation: int = 1, dup: bool = False) -> bool:
        message = Inbound(TOPIC, payload, mid, 1, generation, 0.0, dup)
        new = ledger.arrived(message)
        if new:
            assert ledger.written([message]) == 1
        return new

    for mid in range(1, 101):
        assert arrive(mid, b"p%d" % mid)
    # Receive Maximum later messages prove the earlier PUBACKs were read.
    assert ledger.remembered() == [96, 97, 98, 99, 100]
    sent.clear()
    assert not arrive(98, b"p98", dup=True)  # written and acked: acknowledged again
    assert sent == [98]
    assert ledger.take_counts() == (0, 0, 1, 0)  # (reused, adopted, reacked, acked late)
    assert arrive(97, b"other", dup=True)  # same id, other payload: a new message
    assert arrive(99, b"p99-new")  # a new message reusing the id: its PUBACK was read
    record = ledger.remembered_record(99)
    assert record is not None
    assert record[1] == ledger._received  # forgotten, then acked anew
    # A new connection of the session: its first new message proves the old PUBACKs.
    ledger.connected(2)
    before = set(ledger.remembered())
    assert arrive(1000, b"fresh", generation=2)
    assert not before & set(ledger.remembered())
    assert len(ledger.remembered()) <= 2 * window


def test_remembered_pubacks_survive_a_full_ring_of_stale_entries() -> None:
    """The PUBACKs remembered are kept in the order sent, in a ring of packet ids where
    an id acknowledged again leaves its older entry behind, stale. A connection on which
    only DUPs arrive proves nothing, so the oldest PUBACK stays remembered while the DUPs
    acknowledged again fill the ring: it is rewritten with the records alone, and every
    PUBACK is still recognised, in its order."""
    sent: list[int] = []
    ledger = AckLedger(MAX_RECEIVE_MAXIMUM, lambda messages: sent.extend(m.mid for m in messages))
    ledger.connected(1)
    first = Inbound(TOPIC, b"first", 1, 1, 1, 0.0)
    second = Inbound(TOPIC, b"second", 2, 1, 1, 0.0)
    for message in (first, second):
        assert ledger.arrived(message)
        assert ledger.written([message]) == 1
    ledger.connected(2)
    dup = second._replace(generation=2, dup=True)
    repeats = RING + 10  # more entries than the ring holds: it fills once
    for _ in range(repeats):
        assert not ledger.arrived(dup)  # acknowledged again, not written
    assert ledger.remembered() == [1, 2]
    assert ledger.take_counts() == (0, 0, repeats, 0)
    # (connection, QoS 1 messages received on it by then, topic, payload size and hash)
    assert ledger.remembered_record(1) == (1, 1, TOPIC, len(b"first"), hash(b"first"))
    assert not ledger.arrived(first._replace(generation=2, dup=True))
    assert ledger.remembered() == [2, 1]
    assert sent == [1, 2] + [2] * repeats + [1]


def test_a_write_finishing_first_waits_for_the_messages_that_arrived_before_it() -> None:
    """Writes finish out of order (two batches written at once): the later message's
    PUBACK waits, and both go out in arrival order, in one write, when the first is
    written."""
    sent: list[list[int]] = []
    ledger = AckLedger(10, lambda messages: sent.append([m.mid for m in messages]))
    ledger.connected(1)
    first, second = (Inbound(TOPIC, b"%d" % mid, mid, 1, 1, 0.0) for mid in (1, 2))
    assert ledger.arrived(first)
    assert ledger.arrived(second)
    assert ledger.written([second]) == 0
    assert sent == []
    assert ledger.written([first]) == 2
    assert sent == [[1, 2]]


def test_a_dup_like_an_acknowledged_message_waits_while_its_id_holds_a_refused_one() -> None:
    """mosquitto numbers m3 and then a repeat of m1 (same topic and payload) with id 1
    while m1 is in flight; m1 is written and acknowledged. On the next connection it
    resends both with DUP, oldest first. The pipeline, stopping, refuses m3: the repeat,
    which looks like m1 acknowledged again, must not be acknowledged, since the broker
    applies a PUBACK to its oldest message under the id, m3, never written (a case the
    state machine found)."""
    sent: list[tuple[int, bytes]] = []
    ledger = AckLedger(10, lambda messages: sent.extend((m.mid, m.payload) for m in messages))
    ledger.connected(1)
    first, reused, repeat = (Inbound(TOPIC, p, 1, 1, 1, 0.0) for p in (b"m1", b"m3", b"m1"))
    assert all([ledger.arrived(first), ledger.arrived(reused), ledger.arrived(repeat)])
    assert ledger.written([first]) == 1
    assert sent == [(1, b"m1")]
    ledger.disconnected()
    ledger.forget(reused)  # never taken: the connection ended
    ledger.connected(2)
    resent, resent_repeat = (Inbound(TOPIC, p, 1, 1, 2, 0.0, dup=True) for p in (b"m3", b"m1"))
    assert ledger.arrived(resent)  # new to the pipeline
    ledger.forget(resent)  # refused: stopping
    assert not ledger.arrived(resent_repeat)  # not taken: its readings are written...
    assert sent == [(1, b"m1")]  # ...and not acknowledged: PUBACK 1 would delete m3
    assert ledger.take_counts()[2] == 0  # (reused, adopted, reacked, acked late)


# -- the state machine ------------------------------------------------------------------

PACKET_IDS = 2  # few ids, so that reuse (after its PUBACK, or mosquitto's) is common


@dataclass
class Sent:
    """A message at the model broker: sent, not yet deleted by a PUBACK."""

    serial: int
    mid: int
    payload: bytes


@dataclass
class Delivery:
    """One PUBLISH as the ledger saw it: an arrival on one connection."""

    serial: int
    connection: int
    position: int  # its place among the connection's arrivals
    message: Inbound


class LedgerMachine(RuleBasedStateMachine):
    """A model broker and pipeline around one ledger (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.window = 3  # Receive Maximum
        self.ledger = AckLedger(self.window, self._pubacks)
        self.connection = 1
        self.up = True  # the connection's CONNACK is through (the ledger may send)
        self.ledger.connected(1)
        self.serial = 0
        self.broker: list[Sent] = []  # unacknowledged, in the order first sent
        self.wire: list[int] = []  # PUBACKs (packet ids) the broker has not read yet
        self.arrivals: dict[int, list[Delivery]] = {1: []}  # per connection, in order
        self.resend: list[Sent] = []  # what the broker still resends on this connection
        self.inbox: list[Delivery] = []  # new to the pipeline, not taken yet
        self.taken: list[Delivery] = []  # taken, write not finished
        self.stopping = False  # the pipeline refused a message: it takes nothing more
        self.written: set[bytes] = set()  # payloads whose readings are written
        self.acked: dict[int, list[int]] = {1: []}  # per connection: positions acked
        self.stands_for: dict[int, Delivery] = {}  # id(Inbound) -> its delivery

    # -- the ledger's callback: every PUBACK checked as it is sent -------------------

    def _pubacks(self, messages: list[Inbound]) -> None:
        assert self.up, "PUBACK sent while not connected"
        connection = self.connection
        positions = self.acked[connection]
        for message in messages:
            # Only after the readings of that message were written.
            assert message.payload in self.written, f"PUBACK before the write: {message}"
            delivery = self._answered(message, connection)
            assert delivery.position not in positions, f"PUBACK sent twice: {message}"
            assert not positions or positions[-1] < delivery.position, (
                f"PUBACK out of arrival order on connection {connection}: "
                f"arrival {delivery.position} after {positions[-1]}"
            )
            positions.append(delivery.position)
            self.wire.append(message.mid)

    def _answered(self, message: Inbound, connection: int) -> Delivery:
        """The arrival on ``connection`` that a PUBACK for ``message`` answers.

        Its own; or, for an original adopted by its DUP, the earliest arrival of that
        packet id and payload on this connection not acknowledged yet.
        """
        own = self.stands_for[id(message)]
        if own.connection == connection:
            return own
        acked = self.acked[connection]
        for delivery in self.arrivals[connection]:
            if (
                delivery.message.mid == message.mid
                and delivery.message.payload == message.payload
                and delivery.position not in acked
            ):
                return delivery
        raise AssertionError(f"PUBACK for {message}, which did not arrive on {connection}")

    # -- the broker ----------------------------------------------------------------

    def _deliver(self, sent: Sent, dup: bool) -> None:
        connection = self.connection
        message = Inbound(TOPIC, sent.payload, sent.mid, 1, connection, 0.0, dup)
        arrivals = self.arrivals[connection]
        delivery = Delivery(sent.serial, connection, len(arrivals), message)
        arrivals.append(delivery)
        self.stands_for[id(message)] = delivery
        if self.ledger.arrived(message):
            self.inbox.append(delivery)

    def _publish(self, mid: int, payload: bytes | None = None) -> None:
        self.serial += 1
        sent = Sent(self.serial, mid, payload or b"m%d" % self.serial)
        self.broker.append(sent)
        self._deliver(sent, dup=False)

    def _free(self) -> list[int]:
        return [m for m in range(1, PACKET_IDS + 1) if all(s.mid != m for s in self.broker)]

    @precondition(lambda self: len(self.broker) < self.window and self._free())
    @rule(data=st.data())
    def arrival(self, data: st.DataObject) -> None:
        """A new message under a free packet id (one reused after its PUBACK included),
        within Receive Maximum; possibly ahead of the resends (interleaved)."""
        self._publish(data.draw(st.sampled_from(self._free())))

    @precondition(lambda self: bool(self.broker) and not self.resend)
    @rule(data=st.data())
    def packet_id_reuse(self, data: st.DataObject) -> None:
        """mosquitto draining a wrapped backlog: a new message under an id still in flight
        (past Receive Maximum), sometimes with the same payload (a sensor repeating).
        Only once it has resent what it held: it numbers a message when it queues it,
        and the messages in flight at a reconnect go first."""
        older = data.draw(st.sampled_from(self.broker))
        self._publish(older.mid, older.payload if data.draw(st.booleans()) else None)

    @precondition(lambda self: bool(self.resend))
    @rule()
    def redelivery(self) -> None:
        """The next unacknowledged message, resent with DUP on the resumed session: a DUP
        of a message the pipeline still holds (adopted), of one written and acknowledged
        whose PUBACK was lost (acknowledged again), or of one never taken (new)."""
        self._deliver(self.resend.pop(0), dup=True)

    @precondition(lambda self: bool(self.wire))
    @rule(count=st.integers(1, 3))
    def broker_reads_pubacks(self, count: int) -> None:
        """The broker reads PUBACKs in order: each deletes its id's oldest message."""
        for mid in self.wire[:count]:
            oldest = next((s for s in self.broker if s.mid == mid), None)
            assert oldest is not None, f"PUBACK {mid} for nothing in flight"
            # The broker forgets a message only once its readings are written.
            assert oldest.payload in self.written, f"broker deleted an unwritten message ({mid})"
            self.broker.remove(oldest)
        del self.wire[:count]

    @rule(read=st.integers(0, 3), session_lost=st.booleans(), expired=st.booleans())
    def reconnect(self, read: int, session_lost: bool, expired: bool) -> None:
        """The connection drops: the broker reads some PUBACKs on the wire and loses the
        rest, what the pipeline has not taken is forgotten, and the next connection
        resumes the session (the broker resends what it holds, with DUP, but for a message
        expired meanwhile) or, the broker having lost it, starts a new one."""
        if self.wire and read:
            self.broker_reads_pubacks(read)
        self.wire.clear()
        self.up = False
        self.ledger.disconnected()
        for delivery in self.inbox:
            self.ledger.forget(delivery.message)
        self.inbox.clear()
        self.stopping = False
        self.connection += 1
        self.arrivals[self.connection] = []
        self.acked[self.connection] = []
        if session_lost:
            self.broker.clear()
            self.ledger.new_session(self.connection)
        elif expired and self.broker:
            del self.broker[0]  # its Message Expiry Interval ran out at the broker
        self.resend = list(self.broker)

    @precondition(lambda self: not self.up)
    @rule()
    def connack(self) -> None:
        """The source is through connecting (redeliveries may have arrived before)."""
        self.up = True
        self.ledger.connected(self.connection)

    @precondition(lambda self: bool(self.inbox) and not self.stopping)
    @rule(refuse=st.booleans())
    def take(self, refuse: bool) -> None:
        """The pipeline takes the oldest message of the inbox, or refuses it (stopping:
        it takes nothing more on this connection)."""
        delivery = self.inbox.pop(0)
        if refuse:
            self.stopping = True
            self.ledger.forget(delivery.message)
        else:
            self.taken.append(delivery)

    @precondition(lambda self: bool(self.taken))
    @rule(data=st.data())
    def write_done(self, data: st.DataObject) -> None:
        """Some taken messages' writes finish, in any order, reported together."""
        done = data.draw(st.lists(st.sampled_from(self.taken), min_size=1, unique_by=id))
        for delivery in done:
            self.taken.remove(delivery)
            self.written.add(delivery.message.payload)
        self.ledger.written([d.message for d in done])

    @precondition(lambda self: self.up and not self.resend and not self.stopping)
    @rule()
    def settle(self) -> None:
        """Nothing is left unacknowledged once written: after the resends, a new message
        arrives, the pipeline takes and writes everything and the broker reads every
        PUBACK; then the broker holds nothing, and neither does the ledger."""
        self._publish(next(m for m in range(1, 100) if all(s.mid != m for s in self.broker)))
        while self.inbox or self.taken:
            done = [*self.taken, *self.inbox]
            self.inbox.clear()
            self.taken.clear()
            self.written.update(d.message.payload for d in done)
            self.ledger.written([d.message for d in done])
        if self.wire:
            self.broker_reads_pubacks(len(self.wire))
        assert self.broker == [], f"left unacknowledged: {self.broker}"
        assert self.ledger.unacknowledged() == [], "the ledger holds what nothing will resend"

    @invariant()
    def written_messages_are_acknowledged_at_once(self) -> None:
        """Once the pipeline has written all it took on a connection, every message that
        arrived on it is acknowledged (not waiting for an event that may never come)."""
        if self.up and not (self.inbox or self.taken or self.stopping):
            arrived = len(self.arrivals[self.connection])
            assert sorted(self.acked[self.connection]) == list(range(arrived))

    @invariant()
    def remembered_pubacks_are_bounded(self) -> None:
        """The memory behind acknowledging DUPs again stays within 2 x Receive Maximum."""
        assert len(self.ledger.remembered()) <= 2 * self.window


LedgerMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=30)
test_ledger_machine = LedgerMachine.TestCase

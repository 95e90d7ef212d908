"""The source's receive path and its acknowledgement ledger, driven in process.

A real aiomqtt/paho client with the hooks installed reads PUBLISH packets from a socket
stand-in (tests/mqtt/test_paho_contract.py's ``KernelSocket``), the source's own consumer
offers them to a sink, and PUBACKs are captured from paho's out queue: no broker, so the
moments between two connections can be held still and looked at.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import aiomqtt
from paho.mqtt.enums import MQTTErrorCode

from ingest.config import Settings
from ingest.metrics import Health, Metrics
from ingest.mqtt.source import MqttSource
from tests.mqtt.test_paho_contract import KernelSocket, publish_packet

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from ingest.model import Inbound


class Connection:
    """One connection of the source's session: its client, socket and queued PUBACKs."""

    def __init__(self, source: MqttSource) -> None:
        self.client = aiomqtt.Client("127.0.0.1", protocol=aiomqtt.ProtocolVersion.V5)
        self.inbox = source._receiver(self.client)
        paho: Any = self.client._client
        self.sock = KernelSocket(65536)
        paho._sock = self.sock
        self.pubacks: list[bytes] = []
        paho._packet_queue = self._queue
        self.paho = paho
        source._connected(self.client)

    def _queue(self, _cmd: int, packet: bytes, *_a: object, **_k: object) -> MQTTErrorCode:
        """paho's packet queue: the PUBACKs are kept here, nothing is sent."""
        self.pubacks.append(bytes(packet))
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def receive(self, *packets: bytes) -> None:
        self.sock.feed(b"".join(packets))
        while self.sock.queue:
            self.paho.loop_read()


def packet(mid: int, dup: bool = False) -> bytes:
    return publish_packet(f"t/s{mid}/readings", b'{"temp": %d}' % mid, mid, 1, dup=dup)


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0)


async def test_a_connection_ending_forgets_what_the_pipeline_did_not_take() -> None:
    """Three QoS 1 messages: the pipeline took the first, the second is being offered to
    it (the pipeline is full) and the third waits in the inbox when the connection ends.
    On the resumed session the broker resends all three with DUP: the first is adopted
    by its write in flight (not offered again, acknowledged on the new connection once
    written), the other two are offered as new messages and acknowledged there."""
    metrics = Metrics("bucket")
    source = MqttSource(Settings(max_inflight_messages=100), metrics, Health())
    offered: list[Inbound] = []
    full = asyncio.Event()

    async def sink(message: Inbound) -> bool:
        offered.append(message)
        if len(offered) == 2:
            await full.wait()  # never set: the pipeline stays full
        return True

    first = Connection(source)
    consume = asyncio.create_task(source._consume(first.inbox, sink))
    first.receive(packet(1), packet(2), packet(3))
    await until(lambda: len(offered) == 2)
    assert [m.mid for m in first.inbox.messages] == [3]
    # The connection ends (as _consume_until_stopped does on a drop).
    consume.cancel()
    source._disconnected()
    source._close(first.inbox)
    assert (list(first.inbox.messages), first.inbox.current, first.inbox.bytes) == ([], None, 0)
    assert source._ledger.unacknowledged() == [1]  # only the message the pipeline took

    second = Connection(source)
    taken = offered[:1]
    offered.clear()
    consume = asyncio.create_task(source._consume(second.inbox, lambda m: _take(offered, m)))
    try:
        second.receive(packet(1, dup=True), packet(2, dup=True), packet(3, dup=True))
        await until(lambda: len(offered) == 2)
        assert [(m.mid, m.dup, m.generation) for m in offered] == [(2, True, 2), (3, True, 2)]
        source.sync_metrics()
        assert metrics.redeliveries_adopted._value.get() == 1
        # The first write finishes: acknowledged on the connection that adopted it.
        assert source.ack_all(taken) == 1
        assert source.ack_all(offered) == 2
        assert second.pubacks == [bytes((0x40, 2, 0, 1)), bytes((0x40, 2, 0, 2, 0x40, 2, 0, 3))]
        assert first.pubacks == []
        assert source._ledger.unacknowledged() == []
        # Messages arriving one at a time into the empty inbox each wake the consumer.
        for mid in (4, 5, 6):
            second.receive(packet(mid))

            def offered_last(mid: int = mid) -> bool:
                return offered[-1].mid == mid

            await until(offered_last)
    finally:
        consume.cancel()


async def _take(offered: list[Inbound], message: Inbound) -> bool:
    offered.append(message)
    return True


async def test_a_message_the_pipeline_refuses_is_forgotten_and_its_dup_offered_again() -> None:
    """A message the pipeline does not take (shutting down) is not acknowledged, and its
    DUP on the next connection is offered as a new message, not adopted."""
    source = MqttSource(Settings(max_inflight_messages=100), Metrics("bucket"), Health())
    refused: list[Inbound] = []

    async def shutting_down(message: Inbound) -> bool:
        refused.append(message)
        return False

    first = Connection(source)
    consume = asyncio.create_task(source._consume(first.inbox, shutting_down))
    first.receive(packet(7))
    await until(lambda: len(refused) == 1)
    assert source.ack_all(refused) == 0
    consume.cancel()
    source._disconnected()
    source._close(first.inbox)
    second = Connection(source)
    second.receive(packet(7, dup=True))
    assert [(m.mid, m.dup) for m in second.inbox.messages] == [(7, True)]
    source.sync_metrics()
    assert source._metrics.redeliveries_adopted._value.get() == 0


# mosquitto numbers a queued message when it queues it, so draining a backlog of more than
# 65,535 messages it sends new messages under packet ids still unacknowledged; a PUBACK
# deletes its oldest unacknowledged message with that id (db__message_delete_outgoing).


def reading(mid: int, payload: bytes, dup: bool = False) -> bytes:
    return publish_packet("t/s1/readings", payload, mid, 1, dup=dup)


def puback(*mids: int) -> bytes:
    return b"".join(bytes((0x40, 2)) + mid.to_bytes(2) for mid in mids)


@contextlib.asynccontextmanager
async def consuming(source: MqttSource, connection: Connection) -> AsyncIterator[list[Inbound]]:
    """The source's consumer on ``connection``, the pipeline taking every message into
    the list it yields; cancelled at the end."""
    offered: list[Inbound] = []
    consume = asyncio.create_task(source._consume(connection.inbox, lambda m: _take(offered, m)))
    try:
        yield offered
    finally:
        consume.cancel()


async def taken_then_disconnected(
    source: MqttSource, *packets: bytes
) -> tuple[Connection, list[Inbound]]:
    """A connection that receives ``packets``, whose messages the pipeline takes, and
    then ends: the connection and the messages taken."""
    first = Connection(source)
    async with consuming(source, first) as offered:
        first.receive(*packets)
        await until(lambda: len(offered) == len(packets))
    source._disconnected()
    source._close(first.inbox)
    return first, offered


async def test_two_new_messages_under_one_packet_id_are_both_acknowledged_in_order() -> None:
    """The broker sends a second message (not DUP) under a packet id whose first is not
    acknowledged yet: both are written and both PUBACKs go out, the older first, in one
    write; another id in between is not held back. The reuse is counted."""
    metrics = Metrics("timeseries")
    source = MqttSource(Settings(max_inflight_messages=100), metrics, Health())
    connection = Connection(source)
    async with consuming(source, connection) as offered:
        connection.receive(reading(5, b"1"), reading(6, b"2"), reading(5, b"3"))
        await until(lambda: len(offered) == 3)
        assert source.ack_all(offered) == 3
        assert connection.pubacks == [puback(5, 6, 5)]
        source.sync_metrics()
        assert metrics.packet_id_reused._value.get() == 1
        assert source._ledger.unacknowledged() == []


async def test_the_newer_message_of_a_packet_id_waits_for_the_older_to_be_written() -> None:
    """Written first, the newer of two messages under one packet id is not acknowledged
    (its PUBACK would make the broker forget the older, unwritten one); the older's write
    sends both PUBACKs."""
    source = MqttSource(Settings(max_inflight_messages=100), Metrics("timeseries"), Health())
    connection = Connection(source)
    async with consuming(source, connection) as offered:
        connection.receive(reading(5, b"older"), reading(5, b"newer"))
        await until(lambda: len(offered) == 2)
        older, newer = offered
        assert source.ack_all([newer]) == 0
        assert connection.pubacks == []
        assert source.ack_all([older]) == 2
        assert connection.pubacks == [puback(5, 5)]
        assert source._ledger.unacknowledged() == []


async def test_both_messages_of_a_packet_id_redelivered_after_a_reconnect_are_adopted() -> None:
    """Two messages under one packet id are in the pipeline when the connection ends, the
    newer already written. The broker resends both with DUP, in order: each is adopted by
    its write (not written again), and the PUBACKs go out on the new connection in order,
    the newer's once the older is written."""
    metrics = Metrics("timeseries")
    source = MqttSource(Settings(max_inflight_messages=100), metrics, Health())
    first, (older, newer) = await taken_then_disconnected(
        source, reading(5, b"older"), reading(5, b"newer")
    )
    assert source.ack_all([newer]) == 0  # written while disconnected

    second = Connection(source)
    async with consuming(source, second) as offered:
        second.receive(reading(5, b"older", dup=True), reading(5, b"newer", dup=True))
        assert (list(second.inbox.messages), offered) == ([], [])  # nothing written again
        source.sync_metrics()
        assert metrics.redeliveries_adopted._value.get() == 2
        assert second.pubacks == []
        assert source.ack_all([older]) == 2
        assert second.pubacks == [puback(5, 5)]
        assert first.pubacks == []
        assert source._ledger.unacknowledged() == []


async def test_a_redelivery_adopts_the_second_message_of_its_packet_id() -> None:
    """A sensor sends the same reading twice and the broker numbers both with one packet
    id. After a reconnect both come again with DUP: the first DUP adopts the first
    message, the second DUP (matching both) the second; both writes are acknowledged."""
    metrics = Metrics("timeseries")
    source = MqttSource(Settings(max_inflight_messages=100), metrics, Health())
    _, taken = await taken_then_disconnected(source, reading(5, b"same"), reading(5, b"same"))

    second = Connection(source)
    async with consuming(source, second) as offered:
        second.receive(reading(5, b"same", dup=True), reading(5, b"same", dup=True))
        assert (list(second.inbox.messages), offered) == ([], [])  # nothing written again
        source.sync_metrics()
        assert metrics.redeliveries_adopted._value.get() == 2
        assert source.ack_all(taken) == 2
        assert second.pubacks == [puback(5, 5)]
        assert source._ledger.unacknowledged() == []


async def test_a_message_the_broker_does_not_resend_no_longer_holds_back_its_packet_id() -> None:
    """Of two messages under one packet id in the pipeline at a reconnect, the broker
    resends only the second (the first expired there): the DUP adopts the second, whose
    write is then acknowledged without waiting for the first; a new message under the id
    queues behind it, and the first's write is not acknowledged (nothing holds it)."""
    source = MqttSource(Settings(max_inflight_messages=100), Metrics("timeseries"), Health())
    _, (expired, kept) = await taken_then_disconnected(
        source, reading(5, b"expired"), reading(5, b"kept")
    )

    second = Connection(source)
    async with consuming(source, second) as offered:
        second.receive(reading(5, b"kept", dup=True), reading(5, b"new"))
        await until(lambda: len(offered) == 1)
        assert source.ack_all([*offered, expired]) == 0  # the new one waits for "kept"
        assert source.ack_all([kept]) == 2
        assert second.pubacks == [puback(5, 5)]
        assert source._ledger.unacknowledged() == []

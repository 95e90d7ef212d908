"""Contract tests of the paho-mqtt internals that ingest/mqtt/paho_hooks.py uses or replaces.

Each test pins one behaviour the hooks rely on, against the installed paho-mqtt and
aiomqtt (pyproject.toml pins their minor versions): the packet reader's contract with
paho's ``_packet_read`` (a socket that returns chunks the way a kernel does), the
PUBLISH parser against paho's own encoder, the PUBACK bytes, the CONNACK callback,
pausing the reader (TCP and TLS) and the keepalive while paused, and the start-up check
that refuses other shapes.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

import aiomqtt
import paho.mqtt.client as paho_client
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from ingest.errors import IncompatibleError
from ingest.mqtt import paho_hooks
from tests.pipeline.test_daemon import make_tls_files
from tests.support.procs import ROOT, Broker, free_port
from tests.support.proxy import Proxy

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def publish_packet(
    topic: str,
    payload: bytes,
    mid: int = 0,
    qos: int = 0,
    dup: bool = False,
    props: bytes = b"",
    retain: bool = False,
) -> bytes:
    """An MQTT 5 PUBLISH as a broker sends it."""
    name = topic.encode()
    body = len(name).to_bytes(2) + name
    if qos:
        body += mid.to_bytes(2)
    body += varint(len(props)) + props + payload
    return (
        bytes((0x30 | qos << 1 | (0x08 if dup else 0) | (0x01 if retain else 0),))
        + varint(len(body))
        + body
    )


class KernelSocket:
    """A non-blocking socket's receive side: ``recv(n)`` returns what has arrived, at
    most ``n`` bytes and at most ``segment`` per call (a TCP segment, a TLS record), and
    raises BlockingIOError when nothing has."""

    def __init__(self, segment: int) -> None:
        self.segment = segment
        self.queue = bytearray()
        self.recvs = 0

    def feed(self, data: bytes) -> None:
        self.queue += data

    def recv(self, n: int) -> bytes:
        if not self.queue:
            raise BlockingIOError
        self.recvs += 1
        k = min(n, self.segment, len(self.queue))
        out = bytes(self.queue[:k])
        del self.queue[:k]
        return out

    def send(self, buffer: bytes | bytearray) -> int:
        """Nothing is written to it: a test that sends replaces paho's packet queue."""
        raise AssertionError(f"unexpected write of {len(buffer)} bytes")

    def pending(self) -> int:
        return 0

    def fileno(self) -> int:
        return -1

    def setblocking(self, flag: bool) -> None:
        pass

    def close(self) -> None:
        pass


class Hooked:
    """A real aiomqtt/paho client with the hooks installed, reading from a KernelSocket."""

    def __init__(self, segment: int) -> None:
        self.client = aiomqtt.Client("127.0.0.1", protocol=aiomqtt.ProtocolVersion.V5)
        self.delivered: list[tuple[str, bytes, int, int, bool, bool, object]] = []
        self.sessions: list[bool] = []
        paho_hooks.install(
            self.client,
            lambda *m: self.delivered.append(m),
            lambda present, _ids: self.sessions.append(present),
            lambda: None,
        )
        self.paho: Any = self.client._client
        self.sock = KernelSocket(segment)
        self.paho._sock = self.sock

    def readable(self) -> int:
        """What a level-triggered event loop does: call loop_read while the socket has
        bytes. Returns the number of calls."""
        calls = 0
        while self.sock.queue:
            assert self.paho.loop_read() == 0
            calls += 1
        return calls

    def feed_cut(self, stream: bytes, cuts: list[int]) -> Iterator[int]:
        """Feed ``stream`` in pieces ending at ``cuts`` (taken modulo its length, then
        the end), reading after each; yield the bytes fed so far."""
        sent = 0
        for point in sorted({cut % (len(stream) + 1) for cut in cuts} | {len(stream)}):
            self.sock.feed(stream[sent:point])
            sent = point
            self.readable()
            yield sent


def payloads_of(hooked: Hooked) -> list[bytes]:
    return [m[1] for m in hooked.delivered]


async def test_a_packet_completed_by_parsers_hundredth_read_is_handled_at_once() -> None:
    """paho reads a body in at most 100 recv calls per round and says "try again" even
    when the hundredth completed it. The reader must not take that for an empty socket:
    both packets below are in the socket, and nothing more will arrive."""
    segment = 1000
    for body_reads in (99, 100, 101):
        for slack in (0, 6, 40):
            hooked = Hooked(segment)
            # 1 command byte + 3 length bytes, then the body: the first body read gets
            # the rest of the first segment, every later one a whole segment. With
            # ``slack``, the last read stops short and a packet of that size fills the
            # rest of the segment; either way the socket is then empty.
            body_len = segment - 4 + (body_reads - 1) * segment - slack
            first = publish_packet("t", b"x" * (body_len - 4))  # topic 3, properties 1
            assert len(first) == 4 + body_len
            second = publish_packet("t", b"a" * (slack - 6)) if slack else b""
            hooked.sock.feed(first + second)
            hooked.readable()
            expected = [body_len - 4] + ([slack - 6] if slack else [])
            assert [len(p) for p in payloads_of(hooked)] == expected, (body_reads, slack)
            assert not hooked.sock.queue


@example(sizes=[92], segment=1, cuts=[])  # a body of exactly 100 one-byte reads
@example(sizes=[3, 92], segment=1, cuts=[])
@given(
    sizes=st.lists(st.integers(0, 300_000), min_size=1, max_size=6),
    segment=st.sampled_from([1, 7, 536, 1448, 16384, 65536, 262144]),
    cuts=st.lists(st.integers(0, 10**7), max_size=8),
)
async def test_every_complete_packet_is_delivered_before_the_reader_waits(
    sizes: list[int], segment: int, cuts: list[int]
) -> None:
    """Whatever the sizes and however the bytes arrive: once the socket is drained, every
    complete packet that arrived has been delivered, in order, and no byte is held."""
    hooked = Hooked(segment)
    packets = [
        publish_packet(f"s/{i}", bytes([i % 256]) * size, i + 1, 1) for i, size in enumerate(sizes)
    ]
    stream = b"".join(packets)
    ends = [sum(map(len, packets[: i + 1])) for i in range(len(packets))]
    for sent in hooked.feed_cut(stream, cuts):
        complete = sum(1 for end in ends if end <= sent)
        assert [m[2] for m in hooked.delivered] == list(range(1, complete + 1))
    assert [len(p) for p in payloads_of(hooked)] == sizes


PINGRESP = bytes((0xD0, 0))


@example(segment=65536, cuts=[])  # the whole stream in the buffer at once
@given(
    segment=st.sampled_from([1, 2, 3, 7, 13, 536, 65536]),
    cuts=st.lists(st.integers(0, 10**6), max_size=8),
)
async def test_publishes_between_other_packets_are_delivered_in_order_and_keep_alive(
    segment: int, cuts: list[int]
) -> None:
    """PUBLISH packets handled straight from the reader's buffer and the packets paho
    reads itself (PINGRESP, and publishes cut across reads) interleave in any order and
    any cut: every PUBLISH is delivered once, in order, with its topic, id, QoS, DUP, RETAIN
    and payload; a PINGRESP reaches paho (its keepalive clock is cleared); and receiving
    counts for the keepalive."""
    hooked = Hooked(segment)
    big = 130 * b"x"  # a two-byte remaining length
    packets = [
        (publish_packet("a/1", b"one", 1, 1, retain=True), ("a/1", b"one", 1, 1, False, True, 0)),
        (PINGRESP, None),
        (publish_packet("b", b"", 0, 0, retain=True), ("b", b"", 0, 0, False, True, 0)),
        (
            publish_packet(
                "é/2", big, 65535, 1, dup=True, props=bytes((0x02, 0, 0, 0, 60, 0x0B, 0x81, 0x01))
            ),
            ("é/2", big, 65535, 1, True, False, 129),
        ),
        (PINGRESP, None),
        (publish_packet("c", b"three", 2, 1), ("c", b"three", 2, 1, False, False, 0)),
    ]
    stream = b"".join(packet for packet, _ in packets)
    expected = [want for _, want in packets if want is not None]
    hooked.paho._last_bytes_received = 0.0
    hooked.paho._ping_t = 1.0  # as after a PINGREQ: reading a PINGRESP clears it
    list(hooked.feed_cut(stream, cuts))  # every piece fed and read
    assert hooked.delivered == expected
    assert hooked.paho._ping_t == 0
    assert hooked.paho._last_bytes_received > 0
    assert hooked.paho._in_packet["command"] == 0  # no packet left half read


async def test_a_burst_of_reads_yields_to_the_event_loop_and_resumes_exactly() -> None:
    """One readable event does a bounded amount of work; the rest waits in the socket
    (still readable), not in the reader's buffer."""
    hooked = Hooked(65536)
    many = [publish_packet("t", str(i).encode(), i + 1, 1) for i in range(1200)]
    big = publish_packet("t", b"b" * (paho_hooks.RECV_BURST + 5) * 65536, 2000, 1)
    hooked.sock.feed(b"".join(many) + big)
    calls = hooked.readable()
    assert calls >= 3  # 1,200 packets at READ_BURST = 500, then the large one in parts
    assert [m[2] for m in hooked.delivered] == [*range(1, 1201), 2000]


async def test_the_publish_parser_reads_what_paho_encodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Our PUBLISH handler against paho's own encoder: topic, id, QoS, DUP, the
    Subscription Identifiers, other properties skipped (user properties, message expiry,
    content type), payload intact."""
    sender = paho_client.Client(CallbackAPIVersion.VERSION2, protocol=paho_client.MQTTv5)
    sender._sock = KernelSocket(1)  # paho encodes only when connected
    queued: list[bytes] = []

    def queue(_cmd: int, packet: bytes, *_a: object, **_k: object) -> MQTTErrorCode:
        queued.append(bytes(packet))
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    monkeypatch.setattr(sender, "_packet_queue", queue)
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("k", "v" * 300)]
    props.MessageExpiryInterval = 60
    props.ContentType = "application/json"
    props.SubscriptionIdentifier = 268_435_455
    props.SubscriptionIdentifier = 3
    sender._send_publish(7, b"a/b/c", b'{"t": 1}', 1, retain=False, dup=True, properties=props)
    sender._send_publish(0, "é/x".encode(), b"zero", 0, retain=True, dup=False)
    hooked = Hooked(1448)
    hooked.sock.feed(b"".join(queued))
    hooked.readable()
    assert hooked.delivered == [
        ("a/b/c", b'{"t": 1}', 7, 1, True, False, (268_435_455, 3)),
        ("é/x", b"zero", 0, 0, False, True, 0),
    ]


async def test_only_retained_messages_sent_on_subscribing_arrive_with_retain(
    broker: Broker,
) -> None:
    """With the daemon's subscription options (Retain As Published off, Retain Handling
    1), mosquitto sets RETAIN on the retained message it sends because of a new
    subscription, and on nothing else: not on a live publish made with retain, not on
    one queued for the session while away, not again on a resubscription."""
    topic = f"ret/{uuid.uuid4().hex[:8]}"
    ident = f"c-{uuid.uuid4().hex[:8]}"
    got: list[tuple[bytes, bool]] = []
    options = SubscribeOptions(
        qos=1, retainAsPublished=False, retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB
    )
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 60

    def session(clean_start: bool) -> aiomqtt.Client:
        client = aiomqtt.Client(
            "127.0.0.1",
            broker.port,
            identifier=ident,
            protocol=aiomqtt.ProtocolVersion.V5,
            clean_start=clean_start,
            properties=props,
        )

        def deliver(
            _topic: str,
            payload: bytes,
            mid: int,
            qos: int,
            _dup: bool,
            retain: bool,
            _subscription: object,
        ) -> None:
            got.append((payload, retain))
            paho_hooks.ack(client, mid, qos)

        paho_hooks.install(client, deliver, lambda *_: None, lambda: None)
        return client

    async def until(count: int) -> None:
        await asyncio.wait_for(_until(lambda: len(got) == count), 10)

    async with aiomqtt.Client("127.0.0.1", broker.port) as publisher:
        await publisher.publish(topic, b"old", qos=1, retain=True)
        async with session(clean_start=True) as client:
            await client.subscribe(topic, options=options)
            await until(1)
            await publisher.publish(topic, b"live", qos=1, retain=True)
            await until(2)
        await publisher.publish(topic, b"queued", qos=1, retain=True)
        async with session(clean_start=False) as client:
            await until(3)
            await client.subscribe(topic, options=options)  # the session holds it
            await publisher.publish(topic, b"end", qos=1, retain=False)
            await until(4)
        await publisher.publish(topic, b"", qos=1, retain=True)  # clears the retained one
    assert got == [(b"old", True), (b"live", False), (b"queued", False), (b"end", False)]


async def test_a_publish_whose_header_runs_past_its_end_ends_the_connection() -> None:
    """The parser reads a packet in place in the read buffer: a topic length longer than
    the packet must not take the next packet's bytes for the rest of its header (a
    broken connection, handed to aiomqtt as any reader error), whether the packet is
    parsed from the buffer or by paho's reader (here cut across reads)."""
    good = publish_packet("t", b"next", 9, 1)
    for segment in (65536, 3):
        hooked = Hooked(segment)
        bad = bytearray(publish_packet("t", b"", 8, 1))
        bad[2:4] = (200).to_bytes(2)  # topic length 200 in a 7-byte body
        hooked.sock.feed(bytes(bad) + good)
        with pytest.raises(ValueError, match="malformed PUBLISH"):
            hooked.readable()
        assert hooked.delivered == []


async def test_ack_many_queues_exactly_the_bytes_of_pahos_own_pubacks() -> None:
    hooked = Hooked(1448)
    queued: list[tuple[int, bytes]] = []

    def queue(cmd: int, packet: bytes, *_a: object, **_k: object) -> MQTTErrorCode:
        queued.append((cmd, bytes(packet)))
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    hooked.paho._packet_queue = queue
    hooked.paho.manual_ack_set(on=True)
    for mid in (1, 300, 65535):
        hooked.paho.ack(mid, 1)
    own = b"".join(packet for _, packet in queued)
    queued.clear()
    paho_hooks.ack_many(hooked.client, [1, 300, 65535])
    assert queued == [(paho_hooks.PUBACK, own)]


async def test_the_installed_versions_have_every_internal_the_hooks_use() -> None:
    paho_hooks.check_compatible(aiomqtt.Client("127.0.0.1"))


@pytest.mark.parametrize("name", [*paho_hooks.REQUIRED, "on_connect"])
async def test_a_missing_or_changed_internal_is_refused_with_the_versions(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setattr(paho_client.Client, name, lambda _self, _changed: None)
    with pytest.raises(IncompatibleError) as info:
        paho_hooks.check_compatible(aiomqtt.Client("127.0.0.1"))
    text = str(info.value)
    assert f"paho-mqtt {version('paho-mqtt')} with aiomqtt {version('aiomqtt')}" in text
    assert f"Client.{name}" in text
    assert "\n" not in text


@pytest.mark.process
def test_the_daemon_refuses_to_start_on_other_paho_internals() -> None:
    """The real command: exit 1 with one line naming the versions, before connecting."""
    code = (
        "import sys, paho.mqtt.client as c; del c.Client._packet_read; "
        "from ingest.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "run",
            "--dry-run",
            "--mqtt-url",
            "mqtt://127.0.0.1:1",
            "--topic",
            "x/#",
            "--metrics-port",
            "0",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    lines = (run.stdout + run.stderr).strip().splitlines()
    assert run.returncode == 1, lines
    errors = [line for line in lines if " ERROR " in line]
    assert len(errors) == 1, lines
    assert f"paho-mqtt {version('paho-mqtt')}" in errors[0]
    assert "_packet_read" in errors[0]
    assert "Traceback" not in run.stderr


async def test_a_refused_connack_does_not_report_a_session(broker: Broker) -> None:
    """paho calls on_connect for a refusal too (session present is 0 there); the hook
    reports only an accepted CONNACK's flag."""
    proxy = Proxy("127.0.0.1", broker.port).start()
    ident = f"c-{uuid.uuid4().hex[:8]}"
    try:
        seen: list[bool] = []
        for refused in (True, False, False):
            proxy.refuse(1 if refused else 0)
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 60
            client = aiomqtt.Client(
                "127.0.0.1",
                proxy.port,
                identifier=ident,
                protocol=aiomqtt.ProtocolVersion.V5,
                clean_start=False,
                properties=props,
            )
            paho_hooks.install(
                client, lambda *_: None, lambda present, _ids: seen.append(present), lambda: None
            )
            if refused:
                with pytest.raises(aiomqtt.MqttCodeError):
                    await client.__aenter__()
            else:
                async with client:
                    pass
        # refused: nothing; then a new session (False) and the resumed one (True)
        assert seen == [False, True]
    finally:
        proxy.stop()


async def test_large_messages_through_mosquitto_arrive_without_waiting_for_more(
    broker: Broker,
) -> None:
    """Messages of several MB, each the last thing on the wire for a while: each one is
    delivered without a later byte (keepalive 60 s) having to push it out."""
    topic = f"big/{uuid.uuid4().hex[:8]}"
    got: asyncio.Queue[int] = asyncio.Queue()
    client = aiomqtt.Client(
        "127.0.0.1", broker.port, protocol=aiomqtt.ProtocolVersion.V5, keepalive=60
    )
    paho_hooks.install(
        client, lambda _t, p, *_: got.put_nowait(len(p)), lambda *_: None, lambda: None
    )
    async with client, aiomqtt.Client("127.0.0.1", broker.port) as publisher:
        await client.subscribe(topic, qos=0)
        for size in (6_553_000, 6_553_600, 6_600_000, 1_638_400):
            await publisher.publish(topic, b"p" * size, qos=1)
            assert await asyncio.wait_for(got.get(), 10) == size


async def test_a_partition_is_noticed_by_the_keepalive_through_the_hooks(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PINGREQ/PINGRESP go through the replaced reader: with keepalive 1 s, PINGRESPs are
    handled; a partition (nothing closed, nothing answered) ends the connection after
    paho's 1.5 keepalives, and on_lost is told."""
    proxy = Proxy("127.0.0.1", broker.port).start()
    lost = asyncio.Event()
    try:
        client = aiomqtt.Client(
            "127.0.0.1", proxy.port, protocol=aiomqtt.ProtocolVersion.V5, keepalive=1
        )
        paho_hooks.install(client, lambda *_: None, lambda *_: None, lost.set)
        paho = client._client
        answered: list[int] = []
        handle = paho._handle_pingresp

        def pingresp() -> MQTTErrorCode:
            answered.append(1)
            return handle()

        monkeypatch.setattr(paho, "_handle_pingresp", pingresp)
        async with client:
            await asyncio.wait_for(_until(lambda: len(answered) >= 2), 30)
            assert not lost.is_set()  # answered keepalives keep the connection
            proxy.cut()
            await asyncio.wait_for(lost.wait(), 30)
            with pytest.raises(aiomqtt.MqttError, match="Keep alive timeout"):
                await client._disconnected
    except aiomqtt.MqttError:
        pass  # the disconnect surfaces when the context exits
    finally:
        proxy.stop()
    assert lost.is_set()


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("transport", ["tcp", "tls"])
async def test_a_paused_reader_reads_nothing_more_and_resumes_from_what_it_buffered(
    broker: Broker, tmp_path: Path, transport: str
) -> None:
    """200 small messages wait in the socket of a paused reader. On resume, one recv
    takes them all into the reader's buffer and the first delivery pauses again: the
    rest sits in the buffer, the kernel socket is empty (nothing more will arrive), and
    nothing more is read while paused. The next resume delivers them all at once: a
    reader that only re-registered the socket would wait for a byte that never comes."""
    host, port, tls_params = "127.0.0.1", broker.port, None
    secure = None
    if transport == "tls":
        tls = make_tls_files(tmp_path)
        port = free_port()
        secure = Broker(
            tmp_path,
            extra=(
                f"listener {port} 127.0.0.1\n"
                f"cafile {tls['ca.crt']}\ncertfile {tls['server.crt']}\n"
                f"keyfile {tls['server.key']}\n"
            ),
        )
        secure.start()
        tls_params = aiomqtt.TLSParameters(ca_certs=str(tls["ca.crt"]))
    topic = f"pause/{uuid.uuid4().hex[:8]}"
    got: list[bytes] = []
    pause_at: list[int] = []

    def deliver(_topic: str, payload: bytes, *_: object) -> None:
        got.append(payload)
        if len(got) in pause_at:
            reader.pause()

    client = aiomqtt.Client(
        host, port, protocol=aiomqtt.ProtocolVersion.V5, keepalive=60, tls_params=tls_params
    )
    reader = paho_hooks.install(client, deliver, lambda *_: None, lambda: None)
    try:
        async with client, aiomqtt.Client(host, (secure or broker).port) as publisher:
            await client.subscribe(topic, qos=0)
            reader.pause()
            for i in range(200):
                await publisher.publish(topic, str(i).encode(), qos=0)
            await asyncio.sleep(0.5)
            assert got == []  # all 200 wait in the socket
            pause_at.append(1)
            reader.resume()
            await asyncio.wait_for(_until(lambda: len(got) >= 1), 5)
            await asyncio.sleep(0.5)
            assert got == [b"0"]  # paused after the packet that asked for it
            assert reader.paused
            reader.resume()
            await asyncio.wait_for(_until(lambda: len(got) == 200), 5)
            assert got == [str(i).encode() for i in range(200)]
            assert not reader.paused
    finally:
        if secure is not None:
            secure.stop()


async def test_a_pause_longer_than_two_keepalives_keeps_the_connection(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paused for 4 s with keepalive 1 s, data waiting unread in front of the PINGRESPs:
    paho's own check would close the connection after about a keepalive, the broker its
    side after 1.5 without a PINGREQ. PINGREQs keep going out, the connection and the
    message waiting in it survive the pause, and on resume the check is armed again: a
    partition afterwards is still noticed."""
    proxy = Proxy("127.0.0.1", broker.port).start()
    topic = f"keepalive/{uuid.uuid4().hex[:8]}"
    lost = asyncio.Event()
    got: list[bytes] = []
    try:
        client = aiomqtt.Client(
            "127.0.0.1", proxy.port, protocol=aiomqtt.ProtocolVersion.V5, keepalive=1
        )
        reader = paho_hooks.install(
            client, lambda _t, p, *_: got.append(p), lambda *_: None, lost.set
        )
        paho = client._client
        pings: list[float] = []
        send_pingreq = paho._send_pingreq

        def pingreq() -> MQTTErrorCode:
            pings.append(0)
            return send_pingreq()

        monkeypatch.setattr(paho, "_send_pingreq", pingreq)
        async with client, aiomqtt.Client("127.0.0.1", broker.port) as publisher:
            await client.subscribe(topic, qos=1)
            reader.pause()
            await publisher.publish(topic, b"waiting", qos=1)
            await asyncio.sleep(4)
            assert not lost.is_set()
            assert got == []
            assert len(pings) >= 2  # about one per keepalive
            reader.resume()
            await asyncio.wait_for(_until(lambda: got == [b"waiting"]), 5)
            await asyncio.sleep(2)
            assert not lost.is_set()  # the PINGRESPs read after the resume count
            proxy.cut()
            await asyncio.wait_for(lost.wait(), 30)
    except aiomqtt.MqttError:
        pass  # the disconnect surfaces when the context exits
    finally:
        proxy.stop()
    assert lost.is_set()


async def test_a_connection_the_broker_closes_during_a_pause_is_noticed(broker: Broker) -> None:
    """Paused, the reader does not read the broker's EOF: the kernel's TCP state tells
    that the peer closed, within seconds rather than at the next keepalive (60 s)."""
    proxy = Proxy("127.0.0.1", broker.port).start()
    lost = asyncio.Event()
    try:
        client = aiomqtt.Client(
            "127.0.0.1", proxy.port, protocol=aiomqtt.ProtocolVersion.V5, keepalive=60
        )
        reader = paho_hooks.install(client, lambda *_: None, lambda *_: None, lost.set)
        async with client:
            reader.pause()
            await asyncio.sleep(1.5)
            assert not lost.is_set()  # a pause alone ends nothing
            proxy.drop()
            await asyncio.wait_for(lost.wait(), 10)
    except aiomqtt.MqttError:
        pass  # the disconnect surfaces when the context exits
    finally:
        proxy.stop()
    assert lost.is_set()


@pytest.mark.parametrize("close", ["drop", "hang_up"])
async def test_what_the_broker_sent_before_closing_during_a_pause_is_still_read(
    broker: Broker, close: str
) -> None:
    """QoS 0 messages that reached the socket while reading was paused are the only copy
    (the broker does not resend QoS 0): when the peer closes, the reader reads up to its
    EOF, past the pause, then reports the connection lost. ``drop``: the connection is
    closed under both sides; ``hang_up``: the broker closes it (after reading an EOF)."""
    proxy = Proxy("127.0.0.1", broker.port).start()
    topic = f"t{uuid.uuid4().hex[:10]}/s1/readings"
    received: list[bytes] = []
    lost = asyncio.Event()
    try:
        client = aiomqtt.Client(
            "127.0.0.1", proxy.port, protocol=aiomqtt.ProtocolVersion.V5, keepalive=60
        )
        reader = paho_hooks.install(
            client, lambda _t, payload, *_: received.append(payload), lambda *_: None, lost.set
        )
        async with client:
            await client.subscribe(topic, qos=0)
            reader.pause()
            async with aiomqtt.Client("127.0.0.1", broker.port) as publisher:
                for i in range(5):
                    await publisher.publish(topic, b"%d" % i, qos=0)
            await asyncio.sleep(0.5)  # in the paused client's socket by now
            assert received == []
            getattr(proxy, close)()
            await asyncio.wait_for(lost.wait(), 10)
    except aiomqtt.MqttError:
        pass  # the disconnect surfaces when the context exits
    finally:
        proxy.stop()
    assert received == [b"0", b"1", b"2", b"3", b"4"]


@pytest.mark.parametrize("name", [*paho_hooks.KEEPALIVE_ATTRIBUTES, "_disconnected"])
async def test_a_missing_keepalive_internal_is_refused(name: str) -> None:
    client = aiomqtt.Client("127.0.0.1")
    target = client if name == "_disconnected" else client._client
    setattr(target, name, None)
    with pytest.raises(IncompatibleError, match=name):
        paho_hooks.check_compatible(client)

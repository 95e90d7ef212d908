"""bench/idealsub, the end-to-end benchmark's reference consumer, against a real mosquitto:
every message written once and acknowledged once, and nothing acknowledged before it is
written. The broker logs every packet it sends and takes (``log_type all``): what it
sent, and which PUBACKs it processed, come from its own record."""

from __future__ import annotations

import asyncio
import json
import re
import resource
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from bench import e2e
from bench.relay import Relay
from tests.support.procs import Broker
from tests.support.proxy import Proxy

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.process

FILTER = "fleet/#"


@pytest.fixture
def logged(tmp_path: Path) -> Iterator[Broker]:
    """A broker of the test's own that logs every packet, and queues QoS 0 messages for
    an offline persistent session as it queues QoS 1."""
    directory = tmp_path / "broker"
    directory.mkdir()
    broker = Broker(directory, extra="log_type all\nqueue_qos0_messages true\n")
    broker.start()
    yield broker
    broker.stop()


@dataclass
class Record:
    """What the broker's log says it did with one client's messages."""

    sent: int  # PUBLISHes it sent the client
    dup: int  # of those, resends (DUP)
    pubacks: int  # PUBACKs it processed
    reused: int  # new PUBLISHes under an id whose earlier message had no PUBACK yet
    most_in_flight: int  # unacknowledged QoS 1 messages at once, at most
    disconnects: int  # times a connection of the client ended


SENT = re.compile(r"Sending PUBLISH to (\S+) \(d(\d), q(\d), r\d, m(\d+),")
PUBACK = re.compile(r"Received PUBACK from (\S+) \(Mid: (\d+),")
GONE = re.compile(r"Client (\S+) (?:disconnected|closed its connection)")


def record(broker: Broker, client_id: str) -> Record:
    """The broker's own account of ``client_id``'s messages, from its log."""
    waiting: dict[int, int] = {}
    rec = Record(0, 0, 0, 0, 0, 0)
    in_flight = 0
    for line in (broker.directory / "mosquitto.log").read_text().splitlines():
        if (m := SENT.search(line)) and m[1] == client_id:
            rec.sent += 1
            dup, qos, mid = m[2] == "1", int(m[3]), int(m[4])
            rec.dup += dup
            if qos == 1:
                rec.reused += not dup and waiting.get(mid, 0) > 0
                waiting[mid] = waiting.get(mid, 0) + 1
                in_flight += 1
                rec.most_in_flight = max(rec.most_in_flight, in_flight)
        elif (m := PUBACK.search(line)) and m[1] == client_id:
            rec.pubacks += 1
            waiting[int(m[2])] -= 1
            in_flight -= 1
        elif (m := GONE.search(line)) and m[1] == client_id:
            rec.disconnects += 1
    return rec


def gone(broker: Broker, client_id: str, times: int, timeout: float = 10.0) -> None:
    """Wait until the broker has ended ``times`` connections of ``client_id`` (it has then
    read everything they sent)."""
    deadline = time.monotonic() + timeout
    while record(broker, client_id).disconnects < times:
        assert time.monotonic() < deadline, f"the broker still holds {client_id}'s connection"
        time.sleep(0.05)


def confirmed_backlog(
    broker: Broker, client_id: str, messages: list[tuple[str, str]], tmp_path: Path
) -> None:
    """A persistent session for ``client_id`` on FILTER, then ``messages`` published at QoS
    1, each confirmed by the broker (qos1pub), so they are queued for the session."""
    e2e.session(broker, client_id, 1, base=FILTER)
    lines = tmp_path / f"backlog-{uuid.uuid4().hex[:6]}.txt"
    lines.write_text("".join(f"{topic}\t{payload}\n" for topic, payload in messages))
    assert e2e.publish(broker, e2e.tools()["qos1pub"], lines, len(messages)) == len(messages)


def idealsub(
    port: int, client_id: str, out: Path, *options: str, limit: int | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run idealsub to its end; its exit and its counts (with ``limit``: its output file
    may grow to that many bytes, and a write past it kills it with SIGXFSZ)."""

    def limited() -> None:
        assert limit is not None
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run(
        [
            str(e2e.tools()["idealsub"]),
            *options,
            "127.0.0.1",
            str(port),
            client_id,
            FILTER,
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=None if limit is None else limited,
    )
    counts = json.loads(done.stdout) if done.returncode == 0 else {}
    return done, counts


def lines(path: Path) -> list[str]:
    """The complete lines of an output file (a line cut by a write that failed is not)."""
    return path.read_text().split("\n")[:-1]


def left(broker: Broker, client_id: str, tmp_path: Path) -> list[str]:
    """What the broker still holds for the session: what it sends a resuming client."""
    out = tmp_path / f"left-{uuid.uuid4().hex[:6]}.txt"
    done, counts = idealsub(broker.port, client_id, out, "--idle", "1")
    assert done.returncode == 0, done.stderr
    assert counts["session_present"] is True
    return lines(out)


def fleet(count: int, size: int = 8) -> list[tuple[str, str]]:
    """``count`` messages with distinct payloads of ``size`` characters (at least 8)."""
    return [(f"fleet/s{i % 100:03d}", f"{i:08d}".ljust(size, "x")) for i in range(count)]


def test_a_backlog_larger_than_a_read_is_written_once_and_acknowledged_once(
    logged: Broker, tmp_path: Path
) -> None:
    messages = fleet(2500, size=2000)  # 5 MB: more than one 4 MiB read can hold
    confirmed_backlog(logged, "ideal", messages, tmp_path)
    out = tmp_path / "out.txt"
    done, counts = idealsub(logged.port, "ideal", out, "--count", str(len(messages)))
    assert done.returncode == 0, done.stderr
    assert lines(out) == [payload for _, payload in messages]  # each once, in order
    assert counts["received"] == counts["written"] == counts["acked"] == len(messages)
    assert counts["reads"] >= 2
    assert counts["ended"] == "count"
    rec = record(logged, "ideal")
    assert (rec.sent, rec.pubacks) == (len(messages), len(messages))
    assert left(logged, "ideal", tmp_path) == []


def test_packet_ids_reused_while_unacknowledged_lose_and_repeat_nothing(
    logged: Broker, tmp_path: Path
) -> None:
    """mosquitto numbers a message when it queues it: a backlog of more than 65,535 wraps
    the ids, and each PUBACK of its oldest message in flight releases up to a Receive
    Maximum more, so it sends new messages under ids still waiting for their PUBACK."""
    messages = fleet(70_000)
    confirmed_backlog(logged, "ideal", messages, tmp_path)
    out = tmp_path / "out.txt"
    done, counts = idealsub(
        logged.port, "ideal", out, "--count", str(len(messages)), "--receive-maximum", "20"
    )
    assert done.returncode == 0, done.stderr
    rec = record(logged, "ideal")
    assert rec.reused > 0, rec
    assert rec.most_in_flight > 20, rec
    assert lines(out) == [payload for _, payload in messages]
    assert counts["acked"] == rec.pubacks == rec.sent == len(messages)
    assert left(logged, "ideal", tmp_path) == []


@pytest.mark.parametrize("read_size", [1, 7])
def test_packets_cut_anywhere_by_the_reads_are_each_written_and_acknowledged_once(
    logged: Broker, tmp_path: Path, read_size: int
) -> None:
    # Payload sizes around the remaining length's 1-, 2- and 3-byte forms (127 / 128
    # and 16,383 / 16,384 bytes with the topic), on topics of several lengths.
    sizes = [8, 9, 100, 108, 109, 110, 111, 112, 300, 16_350, 16_364, 16_365, 16_366, 20_000]
    messages = [
        (f"fleet/{'s' * (1 + i % 3)}", f"{i:08d}".ljust(sizes[i % len(sizes)], "y"))
        for i in range(140)
    ]
    confirmed_backlog(logged, "ideal", messages, tmp_path)
    out = tmp_path / "out.txt"
    done, counts = idealsub(
        logged.port,
        "ideal",
        out,
        "--count",
        str(len(messages)),
        "--read-size",
        str(read_size),
        "--topics",
    )
    assert done.returncode == 0, done.stderr
    assert lines(out) == [f"{topic}\t{payload}" for topic, payload in messages]
    assert counts["acked"] == len(messages)
    assert counts["reads"] >= counts["bytes"] // read_size
    assert record(logged, "ideal").pubacks == len(messages)
    assert left(logged, "ideal", tmp_path) == []


def test_killed_in_its_write_it_has_acknowledged_only_what_it_wrote(
    logged: Broker, tmp_path: Path
) -> None:
    messages = fleet(400, size=90)  # 36,400 bytes of output
    confirmed_backlog(logged, "ideal", messages, tmp_path)
    first = tmp_path / "first.txt"
    # The output may grow to 12,000 bytes: the write that crosses it is cut short and the
    # next one kills the process (SIGXFSZ), with that read's messages unacknowledged. It
    # connects through the benchmark's relay, which passes on every PUBACK it was sent
    # (a process killed with unread bytes resets its connection, and a broker reading
    # that connection itself may drop the PUBACKs that had not been read yet).
    relay = Relay.start(e2e.tools()["mqttrelay"], logged.port, 0)
    try:
        done, _ = idealsub(relay.port, "ideal", first, "--read-size", "2048", limit=12_000)
        gone(logged, "ideal", 2)  # the session's creation, then the killed one
    finally:
        relayed = relay.stop()["pubacks"]
    assert done.returncode == -signal.SIGXFSZ, done.stderr
    assert first.stat().st_size == 12_000
    acked = record(logged, "ideal").pubacks
    assert acked == relayed
    written = lines(first)
    assert 0 < acked <= len(written) < len(messages)
    second = tmp_path / "second.txt"
    done, counts = idealsub(logged.port, "ideal", second, "--idle", "1")
    assert done.returncode == 0, done.stderr
    resent = lines(second)
    payloads = [payload for _, payload in messages]
    # The broker resends exactly what had no PUBACK, in order, from the first message
    # the killed process had not acknowledged; all it acknowledged it had written.
    assert resent == payloads[acked:]
    assert written[:acked] == payloads[:acked]
    assert counts["dup"] > 0  # those it had sent before: redeliveries
    assert record(logged, "ideal").pubacks == len(messages)
    assert left(logged, "ideal", tmp_path) == []


def test_qos_0_and_1_with_properties_are_written_and_only_qos_1_acknowledged(
    logged: Broker, tmp_path: Path
) -> None:
    e2e.session(logged, "ideal", 1, base=FILTER)
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("site", "north"), ("fw", "1.2.3")]
    props.ContentType = "application/json"
    props.MessageExpiryInterval = 3600
    props.CorrelationData = b"\x00\x01"
    sent = [(f"fleet/s{i}", f"m{i:03d}", i % 3 == 0) for i in range(60)]  # every third QoS 0

    async def publish() -> None:
        async with aiomqtt.Client(
            "127.0.0.1", logged.port, identifier="pub", protocol=aiomqtt.ProtocolVersion.V5
        ) as client:
            for topic, payload, qos0 in sent:
                await client.publish(topic, payload, qos=0 if qos0 else 1, properties=props)

    asyncio.run(publish())  # on one connection: its last PUBACK follows every message
    out = tmp_path / "out.txt"
    done, counts = idealsub(logged.port, "ideal", out, "--count", str(len(sent)))
    assert done.returncode == 0, done.stderr
    assert lines(out) == [payload for _, payload, _ in sent]
    qos0 = sum(q for _, _, q in sent)
    assert (counts["qos0"], counts["qos1"]) == (qos0, len(sent) - qos0)
    assert counts["acked"] == record(logged, "ideal").pubacks == len(sent) - qos0
    assert left(logged, "ideal", tmp_path) == []


def test_it_keeps_an_idle_connection_alive_with_pingreq(logged: Broker, tmp_path: Path) -> None:
    # Keep alive 1 s: the broker closes a connection silent for 1.5 s.
    done, counts = idealsub(
        logged.port, "ideal", tmp_path / "out.txt", "--keepalive", "1", "--idle", "3.5"
    )
    assert done.returncode == 0, done.stderr
    assert counts["pings"] >= 5
    assert counts["ended"] == "idle"


def test_a_refused_connection_is_one_line_and_exit_1(logged: Broker, tmp_path: Path) -> None:
    proxy = Proxy("127.0.0.1", logged.port).start()
    try:
        proxy.refuse(1, 0x87)
        done, _ = idealsub(proxy.port, "ideal", tmp_path / "out.txt")
    finally:
        proxy.stop()
    assert done.returncode == 1
    assert (
        done.stderr == "idealsub: the broker refused the connection: reason 0x87 (not authorized)\n"
    )


def test_a_refused_subscription_is_one_line_and_exit_1(tmp_path: Path) -> None:
    """A broker that accepts the connection and refuses the subscription (as one with an
    access list does: SUBACK 0x87 and a Reason String)."""
    reason = b"not for you"
    suback = bytes((0x90, 2 + 1 + 3 + len(reason) + 1, 0, 1, 3 + len(reason), 0x1F, 0))
    suback += bytes((len(reason),)) + reason + b"\x87"

    def broker(server: socket.socket) -> None:
        conn, _ = server.accept()
        with conn:
            for answer in (bytes((0x20, 3, 0, 0, 0)), suback):  # CONNACK, then SUBACK
                read_packet(conn)
                conn.sendall(answer)
            conn.recv(1)

    with socket.create_server(("127.0.0.1", 0)) as server:
        thread = threading.Thread(target=broker, args=(server,), daemon=True)
        thread.start()
        done, _ = idealsub(server.getsockname()[1], "ideal", tmp_path / "out.txt")
        thread.join(5)
    assert done.returncode == 1
    assert done.stderr == (
        f"idealsub: the broker refused the subscription to {FILTER}: reason 0x87 "
        "(not authorized): not for you\n"
    )


def read_packet(conn: socket.socket) -> bytes:
    """One MQTT packet from a socket."""
    first = conn.recv(1, socket.MSG_WAITALL)
    length, shift = 0, 0
    while True:
        byte = conn.recv(1, socket.MSG_WAITALL)[0]
        length |= (byte & 127) << shift
        shift += 7
        if byte < 128:
            return first + conn.recv(length, socket.MSG_WAITALL)


def test_a_disconnect_from_the_broker_is_one_line_and_exit_1(
    logged: Broker, tmp_path: Path
) -> None:
    # mosquitto answers an invalid filter with DISCONNECT, reason 0x81
    out = tmp_path / "out.txt"
    done = subprocess.run(
        [
            str(e2e.tools()["idealsub"]),
            "127.0.0.1",
            str(logged.port),
            "ideal",
            "fleet/#/x",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr == (
        "idealsub: the broker disconnected: reason 0x81 (malformed packet) after 0 messages\n"
    )

"""MQTT faults around acknowledgement, through a real mosquitto, a TCP proxy and the daemon.

Each test names the row of docs/fault-model.md it covers.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from typing import TYPE_CHECKING, Any

import aiomqtt
import orjson

from tests.support.mongo import failpoint, stored, stored_values
from tests.support.procs import Broker, eventually
from tests.support.proxy import Proxy

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.support.procs import Daemon

NOW = time.time()
WRITE_COMMAND = {"bucket": "update", "timeseries": "insert"}


def messages(topic_root: str, count: int, start: int = 0) -> list[tuple[str, bytes]]:
    return [
        (
            f"{topic_root}/s{i % 3}/readings",
            orjson.dumps({"ts": NOW - 600 + i, "seq": i, "temp": 20 + i / 10}),
        )
        for i in range(start, start + count)
    ]


@contextlib.contextmanager
def proxied(broker: Broker) -> Iterator[Proxy]:
    proxy = Proxy("127.0.0.1", broker.port).start()
    try:
        yield proxy
    finally:
        proxy.stop()


async def test_pubacks_lost_with_a_dying_connection_are_sent_again_not_written_again(
    daemon: Callable[..., Daemon],
    mode: str,
    broker: Broker,
    topic_root: str,
    db: Any,
    mongo: Any,
    publish: Any,
) -> None:
    """Fault model: "PUBACK queued or on the wire, connection dies". The messages are
    written and their PUBACKs queued while a partition holds them; the connection then
    drops with them. The broker resends all 20 with DUP on the resumed session: each is
    acknowledged again, none is processed or written again (before, time-series mode
    stored 40 readings and bucket mode wrote 20 again)."""
    with proxied(broker) as proxy:
        proc = daemon(broker_url=f"mqtt://127.0.0.1:{proxy.port}")
        async with failpoint(mongo, [WRITE_COMMAND[mode]]):  # hold the writes...
            await publish(messages(topic_root, 20))
            await eventually(lambda: proc.metric("ingest_messages_received_total") == 20)
            proxy.cut()  # ...until the PUBACKs can no longer reach the broker
        # The writes were retried with backoff while refused: the next attempt can be up
        # to 30 s away (the backoff's cap), however long the refusal lasted.
        await eventually(lambda: proc.metric("ingest_messages_acked_total") == 20, timeout=90)
        proxy.drop()  # the held PUBACKs never arrive
        proxy.heal()
        await eventually(lambda: proc.metric("ingest_redeliveries_reacked_total") == 20, timeout=60)
        await eventually(lambda: proc.metric("ingest_mqtt_connected") == 1)
        assert proc.metric("ingest_messages_received_total") == 20
        assert proc.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == 20
        assert proc.metric(f'ingest_duplicate_readings_total{{mode="{mode}"}}') == 0
        # A clean stop through the proxy: the second PUBACKs (counted when queued) go out
        # before the DISCONNECT; tearing the proxy down first could cut them off.
        assert proc.stop() == 0
    assert await stored_values(db, mode, "seq") == list(range(20))
    assert await stored(db, mode) == 20
    # The second PUBACKs reached the broker: a new connection gets nothing again.
    again = daemon()
    await publish(messages(topic_root, 1, start=100))
    await eventually(lambda: again.metric("ingest_messages_acked_total") == 1)
    assert again.metric("ingest_messages_received_total") == 1
    assert await stored(db, mode) == 21


async def test_a_refused_reconnect_keeps_the_session_and_its_messages(
    daemon: Callable[..., Daemon],
    mode: str,
    broker: Broker,
    topic_root: str,
    db: Any,
    mongo: Any,
    publish: Any,
) -> None:
    """Fault model: "CONNACK refused (not authorised, server unavailable/busy)". The
    connection drops while writes are in flight and the next two CONNECTs are refused:
    the broker still holds the session, so the accepted reconnect resumes it and the DUP
    redeliveries are adopted by the writes in flight (before, the refusal was taken for a
    lost session: the messages were processed again and the first writes never acked)."""
    with proxied(broker) as proxy:
        proc = daemon(broker_url=f"mqtt://127.0.0.1:{proxy.port}")
        async with failpoint(mongo, [WRITE_COMMAND[mode]]):
            await publish(messages(topic_root, 10))
            await eventually(lambda: proc.metric("ingest_messages_received_total") == 10)
            await eventually(
                lambda: (
                    proc.metric(f'ingest_write_errors_total{{kind="transient",mode="{mode}"}}') >= 1
                )
            )
            proxy.refuse(2, code=0x87)  # not authorised, as during a password rotation
            proxy.drop()
            await eventually(lambda: proxy.refused == 2)
            await eventually(lambda: proc.metric("ingest_redeliveries_adopted_total") == 10)
        # The write may be waiting out its backoff (full jitter, up to 30 s) when the fail
        # point ends: on a loaded machine the refusals above take long enough for it.
        await eventually(lambda: proc.metric("ingest_messages_acked_total") == 10, timeout=60)
    assert proc.metric("ingest_messages_received_total") == 10
    assert proc.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == 10
    assert await stored_values(db, mode, "seq") == list(range(10))
    assert proc.metric("ingest_mqtt_reconnects_total") >= 3


async def test_a_lost_session_forgets_the_messages_in_flight_and_goes_on(
    daemon: Callable[..., Daemon], tmp_path: Path, topic_root: str, db: Any, mongo: Any
) -> None:
    """Fault model: "CONNACK accepted, session present 0". A broker without persistence
    restarts while writes are held: the session and its unacknowledged messages are gone
    at the broker, so nothing is redelivered. The writes still finish (at least once),
    nothing waits for an ack that cannot come, and new messages flow as before."""
    directory = tmp_path / "volatile"
    directory.mkdir()
    volatile = Broker(directory)
    volatile.start()
    try:
        proc = daemon(broker_url=volatile.url)
        async with failpoint(mongo, ["update"]):
            async with aiomqtt.Client("127.0.0.1", volatile.port) as client:
                for topic, payload in messages(topic_root, 5):
                    await client.publish(topic, payload, qos=1)
            await eventually(lambda: proc.metric("ingest_messages_received_total") == 5)
            volatile.restart()
            await eventually(
                lambda: (
                    proc.metric("ingest_mqtt_reconnects_total") >= 1
                    and proc.metric("ingest_mqtt_connected") == 1
                )
            )
        await eventually(lambda: proc.metric('ingest_readings_written_total{mode="bucket"}') == 5)
        async with aiomqtt.Client("127.0.0.1", volatile.port) as client:
            for topic, payload in messages(topic_root, 3, start=5):
                await client.publish(topic, payload, qos=1)
        await eventually(lambda: proc.metric("ingest_messages_acked_total") == 3)
        assert proc.metric("ingest_redeliveries_adopted_total") == 0
        assert await stored_values(db, "bucket", "seq") == list(range(8))
    finally:
        volatile.stop()


async def test_a_second_daemon_with_the_client_id_of_a_running_one_refuses_to_start(
    daemon: Callable[..., Daemon], broker: Broker, topic_root: str, db: Any, publish: Any
) -> None:
    """Fault model: "A second daemon on the same host with the same client id". A daemon
    runs with two workers (client ids X and X-w1); a second one started with X and one
    worker would take X's session and take X-w1's as a retired worker's. It refuses to
    start instead, in one line naming the running daemon and --client-id, before it
    reaches the broker: the running one keeps its connections (no reconnect) and stores
    what follows, once. (Before, the second took both sessions, the first's workers
    reconnected and took them back, in turn.)"""
    first = daemon("--workers", "2")
    assert first.process is not None
    second = daemon(wait_ready=False)
    assert second.wait(timeout=30) == 1
    lines = second.logs().strip().splitlines()
    assert lines[-1].startswith(
        f"ingest: error: --client-id: another ingest daemon (pid "
        f"{first.process.pid}) on this host uses client id "
        f"ingest-{topic_root} with the broker at 127.0.0.1:"
        f"{broker.port}"
    ), lines
    assert "taking the messages queued for" not in second.logs()
    await publish(messages(topic_root, 30))
    await eventually(lambda: first.metric("ingest_messages_acked_total") == 30)
    assert first.metric("ingest_mqtt_reconnects_total") == 0
    assert await stored_values(db, "bucket", "seq") == list(range(30))
    # Once the first has stopped, its client id is free: the next daemon takes it.
    assert first.stop() == 0
    third = daemon("--workers", "2")
    await publish(messages(topic_root, 1, start=100))
    await eventually(lambda: third.metric("ingest_messages_acked_total") == 1)
    assert await stored(db, "bucket") == 31


async def test_a_live_daemons_session_is_not_retired_as_an_earlier_runs_worker(
    daemon: Callable[..., Daemon], topic_root: str
) -> None:
    """A daemon whose client id is that of another one's worker 1 (``X-w1``) runs; a
    daemon with client id X and one worker looks for sessions of retired workers: it
    finds X-w1 in use on this host, leaves it alone (no probe, no drain) and starts."""
    first = daemon(client_id=f"ingest-{topic_root}-w1")
    second = daemon()
    assert second.process is not None
    assert (
        f"not looking for retired sessions from ingest-{topic_root}-w1 on: a running "
        f"daemon (pid {first.process.pid if first.process else 0}) uses it" in second.logs()
    )
    assert "taking the messages queued for" not in second.logs()
    assert first.metric("ingest_mqtt_reconnects_total") == 0
    assert first.metric("ingest_mqtt_connected") == 1


async def test_the_brokers_reason_for_closing_the_connection_is_logged_with_what_to_do(
    daemon: Callable[..., Daemon], broker: Broker, topic_root: str, db: Any, publish: Any
) -> None:
    """A broker that closes the connection with an MQTT 5 DISCONNECT says why; for 0x8E
    (session taken over: another client connected with the daemon's client id, as EMQX,
    HiveMQ and the MQTT 5 specification do) the log names the client id and what to do,
    rather than aiomqtt's "Disconnected during message iteration". The daemon reconnects
    and goes on."""
    with proxied(broker) as proxy:
        proc = daemon(broker_url=f"mqtt://127.0.0.1:{proxy.port}")
        proxy.disconnect(0x8E)
        await eventually(
            lambda: f"another client connected with client id ingest-{topic_root}" in proc.logs()
        )
        assert "Session taken over" in proc.logs()
        await eventually(lambda: proc.metric("ingest_mqtt_connected") == 1)
        await publish(messages(topic_root, 1))
        await eventually(lambda: proc.metric("ingest_messages_acked_total") == 1)
    assert await stored(db, "bucket") == 1


async def test_a_connect_left_unanswered_times_out_and_is_tried_again(
    daemon: Callable[..., Daemon], broker: Broker, topic_root: str, db: Any, publish: Any
) -> None:
    """Fault model: "CONNECT unanswered (partition while connecting)". The connection is
    dropped during a partition, so the reconnect's CONNECT is held and no CONNACK comes:
    the attempt times out (aiomqtt's 10 s), is logged and tried again with backoff, and
    once the partition heals the daemon connects and messages flow."""
    with proxied(broker) as proxy:
        proc = daemon(broker_url=f"mqtt://127.0.0.1:{proxy.port}")
        proxy.cut()
        proxy.drop()
        await eventually(lambda: proc.metric("ingest_mqtt_reconnects_total") >= 2, timeout=60)
        assert "timed out" in proc.logs()
        assert proc.metric("ingest_mqtt_connected") == 0
        proxy.heal()
        await eventually(lambda: proc.metric("ingest_mqtt_connected") == 1, timeout=60)
        await publish(messages(topic_root, 1))
        await eventually(lambda: proc.metric("ingest_messages_acked_total") == 1)
    assert await stored(db, "bucket") == 1


async def test_a_suback_that_never_comes_times_out_and_the_connection_is_made_again(
    daemon: Callable[..., Daemon], broker: Broker, topic_root: str, db: Any, publish: Any
) -> None:
    """Fault model: "SUBACK never arrives". CONNECT is answered, then the SUBSCRIBE is held
    (a partition right after CONNACK): the daemon never reports itself connected or
    ready without its subscription; the subscribe times out, the connection is made
    again, and once traffic flows the subscription is in place and messages arrive."""
    with proxied(broker) as proxy:
        proc = daemon(broker_url=f"mqtt://127.0.0.1:{proxy.port}")
        proxy.hold_after_connect()
        proxy.drop()
        await eventually(lambda: proc.metric("ingest_mqtt_reconnects_total") >= 2, timeout=60)
        assert "timed out" in proc.logs()
        assert proc.metric("ingest_mqtt_connected") == 0
        assert proc.readyz() == 503
        proxy.hold_after_connect(hold=False)
        await eventually(lambda: proc.metric("ingest_mqtt_connected") == 1, timeout=60)
        await publish(messages(topic_root, 1))
        await eventually(lambda: proc.metric("ingest_messages_acked_total") == 1)
    assert await stored(db, "bucket") == 1


async def test_a_stop_while_the_broker_is_unreachable_leaves_the_messages_to_the_next_process(
    daemon: Callable[..., Daemon],
    mode: str,
    broker: Broker,
    topic_root: str,
    db: Any,
    mongo: Any,
    publish: Any,
) -> None:
    """Fault model: "SIGTERM while the broker is unreachable". The writes finish, their
    PUBACKs cannot reach the broker, the process exits 0 within its shutdown timeout.
    The broker sends the messages again (DUP) to the next process, which finds their
    readings stored and acknowledges them without writing: each reading once, in both
    modes (time-series mode looks the readings of a DUP up before inserting them)."""
    with proxied(broker) as proxy:
        proc = daemon("--shutdown-timeout", "60", broker_url=f"mqtt://127.0.0.1:{proxy.port}")
        async with failpoint(mongo, [WRITE_COMMAND[mode]]):
            await publish(messages(topic_root, 10))
            await eventually(lambda: proc.metric("ingest_messages_received_total") == 10)
            proxy.cut()  # the broker is unreachable from now on
        await eventually(
            lambda: proc.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == 10, timeout=90
        )  # after the backoff's next attempt
        assert proc.stop() == 0
        proxy.drop()  # the PUBACKs held by the partition are lost
        proxy.heal()
        again = daemon(broker_url=f"mqtt://127.0.0.1:{proxy.port}")
        await eventually(lambda: again.metric("ingest_messages_acked_total") == 10, timeout=60)
    assert again.metric("ingest_messages_received_total") == 10
    assert again.metric(f'ingest_duplicate_readings_total{{mode="{mode}"}}') == 10
    assert again.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == 0
    assert await stored_values(db, mode, "seq") == list(range(10))


async def test_a_stop_whose_writes_outlast_the_shutdown_timeout_loses_nothing(
    daemon: Callable[..., Daemon],
    mode: str,
    broker: Broker,
    topic_root: str,
    db: Any,
    mongo: Any,
    publish: Any,
) -> None:
    """Fault model: "SIGTERM, writes still in flight at --shutdown-timeout". MongoDB
    refuses the writes; SIGTERM waits --shutdown-timeout, says what it leaves, and exits
    without acknowledging anything. The next process receives the messages again and
    writes them: each reading once."""
    proc = daemon("--shutdown-timeout", "2")
    async with failpoint(mongo, [WRITE_COMMAND[mode]]):
        await publish(messages(topic_root, 6))
        await eventually(lambda: proc.metric("ingest_messages_received_total") == 6)
        started = time.monotonic()
        assert proc.stop() == 0
        assert time.monotonic() - started < 20
        assert "shutdown timeout" in proc.logs()
    again = daemon()
    await eventually(lambda: again.metric("ingest_messages_acked_total") == 6, timeout=60)
    assert again.metric("ingest_messages_received_total") == 6
    assert await stored_values(db, mode, "seq") == list(range(6))


def fixed_width(topic_root: str, count: int) -> list[tuple[str, bytes]]:
    """Messages of one size each (three sensors, ``seq`` 100 and up), whose inbox share
    (``ingest_inbox_bytes``) tells how many wait there."""
    ts = int(NOW) - 600
    return [
        (
            f"{topic_root}/s{i % 3}/readings",
            orjson.dumps({"ts": ts + i, "seq": 100 + i, "temp": 20.5}),
        )
        for i in range(count)
    ]


def inbox_share(message: tuple[str, bytes]) -> int:
    """A message's estimated bytes in the inbox (ingest.mqtt.source.INBOX_MESSAGE_BYTES + ...)."""
    from ingest.mqtt.source import INBOX_MESSAGE_BYTES  # noqa: PLC0415

    return INBOX_MESSAGE_BYTES + len(message[0]) + len(message[1])


async def qos0_waiting_in_the_inbox(
    proc: Daemon, mongo: Any, publish: Any, mode: str, sent: list[tuple[str, bytes]]
) -> None:
    """Publish ``sent`` at QoS 0 while MongoDB refuses the writes (hold the fail point
    around this): 10 readings fill the pipeline, one waits for room, the rest in the inbox."""
    await publish(sent, qos=0)
    waiting = (len(sent) - 11) * inbox_share(sent[0])
    await eventually(
        lambda: (
            proc.metric("ingest_messages_received_total") == 10
            and proc.metric("ingest_inbox_bytes") == waiting
        )
    )
    await eventually(
        lambda: proc.metric(f'ingest_write_errors_total{{kind="transient",mode="{mode}"}}') >= 1
    )


QOS0_FLAGS = ("--qos", "0", "--batch-size", "5", "--max-buffered-readings", "10")


async def test_qos0_messages_read_before_a_reconnect_are_written_after_it(
    daemon: Callable[..., Daemon],
    mode: str,
    broker: Broker,
    topic_root: str,
    db: Any,
    mongo: Any,
    publish: Any,
) -> None:
    """Fault model: "Connection lost with QoS 0 messages in the inbox". MongoDB refuses
    the writes, so the pipeline is full and 39 QoS 0 messages wait in the daemon's inbox
    (one more for room in the pipeline); then the connection drops. The broker does not
    resend QoS 0: the inbox is the only copy, so its messages are taken first on the next
    connection and written once MongoDB accepts writes again (before, the 40 were thrown
    away with the old connection's inbox, uncounted)."""
    sent = fixed_width(topic_root, 50)
    with proxied(broker) as proxy:
        proc = daemon(*QOS0_FLAGS, broker_url=f"mqtt://127.0.0.1:{proxy.port}")
        async with failpoint(mongo, [WRITE_COMMAND[mode]]):
            await qos0_waiting_in_the_inbox(proc, mongo, publish, mode, sent)
            proxy.drop()
            await eventually(
                lambda: (
                    proc.metric("ingest_mqtt_reconnects_total") >= 1
                    and proc.metric("ingest_mqtt_connected") == 1
                )
            )
        # After the backoff's next attempt (up to 30 s).
        await eventually(
            lambda: proc.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == 50, timeout=90
        )
        assert proc.metric("ingest_messages_received_total") == 50
        assert proc.metric("ingest_messages_lost_total") == 0
    assert await stored_values(db, mode, "seq") == list(range(100, 150))


async def test_qos0_messages_behind_a_paused_reader_are_written_after_a_reconnect(
    daemon: Callable[..., Daemon],
    mode: str,
    broker: Broker,
    topic_root: str,
    db: Any,
    mongo: Any,
    publish: Any,
) -> None:
    """The issue's case: reading paused during a MongoDB outage (the inbox holds 20
    messages), then the connection drops. The messages in the inbox, and those the broker
    had already sent into the daemon's socket behind the pause, are the only copies:
    all 100 are written once MongoDB is back."""
    sent = fixed_width(topic_root, 100)
    with proxied(broker) as proxy:
        proc = daemon(
            *QOS0_FLAGS,
            "--max-inflight-messages",
            "20",
            broker_url=f"mqtt://127.0.0.1:{proxy.port}",
        )
        async with failpoint(mongo, [WRITE_COMMAND[mode]]):
            await publish(sent, qos=0)
            await eventually(
                lambda: (
                    proc.metric("ingest_mqtt_read_paused") == 1
                    and proc.metric("ingest_messages_received_total") == 10
                )
            )
            await asyncio.sleep(0.5)  # the rest is in the daemon's socket by now
            proxy.drop()
            await eventually(
                lambda: (
                    proc.metric("ingest_mqtt_reconnects_total") >= 1
                    and proc.metric("ingest_mqtt_connected") == 1
                ),
                timeout=30,
            )
        await eventually(
            lambda: proc.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == 100,
            timeout=90,
        )
        assert proc.metric("ingest_messages_lost_total") == 0
    assert await stored_values(db, mode, "seq") == list(range(100, 200))


async def test_a_stop_writes_the_qos0_messages_waiting_in_the_inbox(
    daemon: Callable[..., Daemon], mode: str, topic_root: str, db: Any, mongo: Any, publish: Any
) -> None:
    """Fault model: "SIGTERM with QoS 0 messages in the inbox". MongoDB is back but the
    pipeline has not caught up (19 messages wait in the inbox, one for room) when SIGTERM
    comes: the drain takes them first, since nothing would send them again, and writes
    them with the rest; none is lost (before, the 20 were dropped with the inbox)."""
    proc = daemon(*QOS0_FLAGS, "--shutdown-timeout", "60")
    async with failpoint(mongo, [WRITE_COMMAND[mode]]):
        await qos0_waiting_in_the_inbox(proc, mongo, publish, mode, fixed_width(topic_root, 30))
    proc.signal(signal.SIGTERM)  # as soon as MongoDB accepts writes again
    assert proc.wait(timeout=90) == 0
    assert "QoS 0 messages read from the broker and not taken" not in proc.logs()
    assert await stored_values(db, mode, "seq") == list(range(100, 130))


async def test_a_stop_with_qos0_messages_in_the_inbox_counts_and_logs_them_as_lost(
    daemon: Callable[..., Daemon], mode: str, topic_root: str, mongo: Any, publish: Any
) -> None:
    """Fault model: "SIGTERM with QoS 0 messages in the inbox". The messages read and never
    taken, and those taken whose write outlasts --shutdown-timeout, cannot be sent again
    by the broker: the stop says how many are lost, rather than dropping them silently."""
    proc = daemon(*QOS0_FLAGS, "--shutdown-timeout", "2")
    async with failpoint(mongo, [WRITE_COMMAND[mode]]):
        await qos0_waiting_in_the_inbox(proc, mongo, publish, mode, fixed_width(topic_root, 30))
        assert proc.metric("ingest_messages_lost_total") == 0
        assert proc.stop() == 0
    assert (
        "stopping with 20 QoS 0 messages read from the broker and not taken by the "
        "pipeline: they are lost"
    ) in proc.logs()
    assert "10 QoS 0 messages among them are lost" in proc.logs()

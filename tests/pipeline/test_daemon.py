"""The daemon end to end: a real mosquitto, the real driver over the wire, a real process."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import subprocess
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

import aiomqtt
import orjson
import pytest

from tests.support.mongo import failpoint, stored, stored_values
from tests.support.procs import Broker, eventually, free_port, http_status, password_broker
from tests.support.proxy import Proxy

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path

    from tests.support.procs import Daemon

NOW = time.time()
WRITE_COMMAND = {"bucket": "update", "timeseries": "insert"}


@contextlib.asynccontextmanager
async def writes_failing(
    proc: Daemon, mongo: Any, mode: str, broker: Broker, messages: list[tuple[str, bytes]]
) -> AsyncIterator[None]:
    """Publish ``messages`` to ``broker`` at QoS 1 while MongoDB refuses the daemon's
    writes; the body runs once a write has failed, and the fail point ends after it."""
    async with failpoint(mongo, [WRITE_COMMAND[mode]]):
        async with aiomqtt.Client("127.0.0.1", broker.port) as client:
            for topic, payload in messages:
                await client.publish(topic, payload, qos=1)
        await eventually(
            lambda: proc.metric(f'ingest_write_errors_total{{kind="transient",mode="{mode}"}}') >= 1
        )
        yield


def one(topic_root: str, sensor: str, i: int, **extra: Any) -> tuple[str, bytes]:
    payload = {"ts": NOW - 600 + i / 10, "seq": i, "temp": 20 + i / 10, **extra}
    return f"{topic_root}/{sensor}/readings", orjson.dumps(payload)


async def test_readings_of_every_payload_shape_are_stored(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any
) -> None:
    proc = daemon()
    await publish(
        [
            one(topic_root, "s1", 1),
            (
                f"{topic_root}/s1/readings",
                orjson.dumps(
                    [{"ts": NOW - 500, "temp": 21.5, "hum": 40}, {"ts": NOW - 499, "temp": 21.7}]
                ),
            ),
            (
                f"{topic_root}/ignored/readings",
                orjson.dumps(
                    {"sensor_id": "s2", "readings": [{"ts": NOW - 450, "temp": 19.0, "seq": 7}]}
                ),
            ),
        ]
    )
    await eventually(lambda: proc.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == 4)
    assert await stored(db, mode) == 4
    assert await stored_values(db, mode, "temp") == [19.0, 20.1, 21.5, 21.7]
    assert await stored_values(db, mode, "hum") == [40]
    assert await stored_values(db, mode, "seq") == [1, 7]
    assert proc.metric("ingest_messages_acked_total") == 3
    assert proc.stop() == 0


async def test_bucket_documents_hold_an_hour_of_one_sensor_with_its_statistics(
    daemon: Callable[..., Daemon], publish: Any, topic_root: str, db: Any
) -> None:
    proc = daemon()
    hour = (NOW - 7200) // 3600 * 3600
    await publish(
        [
            (
                f"{topic_root}/s1/readings",
                orjson.dumps(
                    [{"ts": hour + 10, "temp": 21.5, "hum": 40}, {"ts": hour + 20, "temp": 21.7}]
                ),
            ),
            (f"{topic_root}/s1/readings", orjson.dumps({"ts": hour + 5, "temp": 19.0, "seq": 7})),
            (f"{topic_root}/s1/readings", orjson.dumps({"ts": hour - 1, "temp": 1.0})),  # late
        ]
    )
    await eventually(lambda: proc.metric('ingest_readings_written_total{mode="bucket"}') == 4)
    docs = await db.buckets.find({}, {"_id": 0}).sort("bucket_start").to_list()
    assert [d["bucket_start"].timestamp() for d in docs] == [hour - 3600, hour]
    doc = docs[1]
    assert doc["sensor_id"] == "s1"
    assert doc["count"] == 3
    assert doc["stats"]["temp"] == {"count": 3, "sum": 62.2, "min": 19.0, "max": 21.7}
    assert doc["stats"]["hum"] == {"count": 1, "sum": 40.0, "min": 40, "max": 40}
    assert doc["first_ts"].timestamp() == hour + 5
    assert doc["last_ts"].timestamp() == hour + 20
    assert doc["schema_version"] == 2
    assert doc["tags"] == {}
    assert {"ts", "seq", "temp"} == set(next(r for r in doc["readings"] if "seq" in r))


async def test_timeseries_documents_are_one_per_reading_with_stable_fields(
    daemon: Callable[..., Daemon], publish: Any, topic_root: str, db: Any
) -> None:
    proc = daemon("--mode", "timeseries")
    await publish(
        [
            (
                f"{topic_root}/s1/readings",
                orjson.dumps({"ts": NOW - 60, "seq": 3, "temp": 21.5, "hum": 40}),
            ),
            (f"{topic_root}/s1/readings", orjson.dumps({"ts": NOW - 59, "hum": 41})),
        ]
    )
    await eventually(lambda: proc.metric('ingest_readings_written_total{mode="timeseries"}') == 2)
    docs = await db.readings.find({}, {"_id": 0}).sort("ts").to_list()
    assert [list(d) for d in docs] == [["ts", "meta", "seq", "hum", "temp"], ["ts", "meta", "hum"]]
    assert docs[0]["meta"] == {"sensor_id": "s1"}
    assert docs[0]["ts"].timestamp() == pytest.approx(NOW - 60, abs=0.001)


async def test_bad_input_is_counted_stored_in_rejects_and_never_blocks_good_readings(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any
) -> None:
    proc = daemon("--max-message-bytes", "2000")
    topic = f"{topic_root}/s1/readings"
    await publish(
        [
            (topic, b"\xff\xfe not utf-8"),
            one(topic_root, "s1", 1),
            (topic, b"{not json"),
            (topic, orjson.dumps({"temp": "22.5"})),
            (topic, orjson.dumps({"$set": 1})),
            (topic, b"[" * 3000),
            (f"{topic_root}/{'x' * 129}/readings", orjson.dumps({"temp": 1})),  # id too long
            (
                topic,
                orjson.dumps(
                    [
                        {"ts": NOW - 3, "temp": 1},
                        {"ts": NOW - 2, "temp": True},
                        {"ts": NOW - 1, "temp": 2},
                    ]
                ),
            ),
            (topic, orjson.dumps({"ts": 0, "temp": 1})),
            one(topic_root, "s1", 2),
        ]
    )
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 10)
    assert await stored(db, mode) == 4  # s1 x2, and the two good readings of the array
    metrics = proc.metrics()
    expected = {
        "invalid_utf8": 1,
        "invalid_json": 1,
        "bad_value": 2,
        "bad_field_name": 1,
        "too_large": 1,
        "bad_sensor_id": 1,
        "ts_out_of_window": 1,
    }
    for reason, count in expected.items():
        assert metrics[f'ingest_readings_rejected_total{{reason="{reason}"}}'] == count, reason
    rejects = await db.rejects.find({}).to_list()
    assert sorted(r["reason"] for r in rejects) == sorted(
        r for r, n in expected.items() for _ in range(n)
    )
    utf8 = next(r for r in rejects if r["reason"] == "invalid_utf8")
    assert utf8["topic"] == topic
    assert utf8["mode"] == mode
    assert utf8["payload"].endswith("not utf-8")
    assert utf8["payload_bytes"] == len(b"\xff\xfe not utf-8")
    big = next(r for r in rejects if r["reason"] == "too_large")
    assert len(big["payload"]) <= 512 < big["payload_bytes"]
    assert next(r for r in rejects if r["reason"] == "bad_value" and "index" in r)["index"] == 1


async def test_a_message_whose_write_failed_is_not_acked_and_comes_back(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any, mongo: Any
) -> None:
    async with failpoint(mongo, [WRITE_COMMAND[mode]]):
        first = daemon()
        await publish([one(topic_root, "s1", i) for i in range(3)])
        await eventually(
            lambda: (
                first.metric(f'ingest_write_errors_total{{kind="transient",mode="{mode}"}}') >= 1
            )
        )
        assert first.metric("ingest_messages_acked_total") == 0
        first.signal(signal.SIGKILL)
        first.wait()
    assert await stored(db, mode) == 0
    second = daemon()  # same client id: the broker redelivers the unacknowledged messages
    await eventually(lambda: second.metric("ingest_messages_acked_total") == 3)
    assert await stored(db, mode) == 3


async def test_a_crash_between_the_write_and_its_ack_stores_nothing_twice(
    daemon: Callable[..., Daemon],
    mode: str,
    broker: Broker,
    topic_root: str,
    db: Any,
    mongo: Any,
    publish: Any,
) -> None:
    """The worst moment to die: readings written, PUBACKs not yet at the broker. The
    broker redelivers every message (with DUP) to the restarted daemon. Bucket mode
    recognises the stored readings through its unique index; time-series mode looks up
    the readings of DUP messages before inserting. Neither writes them again."""
    proxy = Proxy("127.0.0.1", broker.port).start()
    try:
        first = daemon(broker_url=f"mqtt://127.0.0.1:{proxy.port}")
        async with failpoint(mongo, [WRITE_COMMAND[mode]]):  # hold the writes...
            await publish([one(topic_root, f"s{i % 3}", i) for i in range(20)])
            await eventually(lambda: first.metric("ingest_messages_received_total") == 20)
            proxy.cut()  # ...until the PUBACKs can no longer reach the broker
        await eventually(
            lambda: first.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == 20
        )
        first.signal(signal.SIGKILL)
        first.wait()
        proxy.drop()  # the held PUBACKs never arrive
    finally:
        proxy.stop()
    assert await stored(db, mode) == 20
    second = daemon()  # same client id: the broker redelivers all 20
    await eventually(lambda: second.metric("ingest_messages_acked_total") == 20)
    duplicates = second.metric(f'ingest_duplicate_readings_total{{mode="{mode}"}}')
    seqs = await stored_values(db, mode, "seq")
    assert set(seqs) == set(range(20))
    assert (seqs, duplicates) == (list(range(20)), 20)
    if mode == "bucket":
        docs = await db.buckets.find({}).to_list()
        assert sum(d["stats"]["temp"]["count"] for d in docs) == 20


async def test_transient_write_errors_are_retried_until_written(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any, mongo: Any
) -> None:
    proc = daemon()
    async with failpoint(mongo, [WRITE_COMMAND[mode]], mode={"times": 3}):
        await publish([one(topic_root, "s1", i) for i in range(5)])
        await eventually(lambda: proc.metric("ingest_messages_acked_total") == 5)
    assert proc.metric(f'ingest_write_errors_total{{kind="transient",mode="{mode}"}}') == 3
    assert await stored(db, mode) == 5


async def test_sigterm_writes_and_acks_the_open_batch_then_exits(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any
) -> None:
    proc = daemon("--flush-interval", "60", "--batch-size", "1000")
    await publish([one(topic_root, "s1", i) for i in range(5)])
    await eventually(lambda: proc.metric("ingest_messages_received_total") == 5)
    assert await stored(db, mode) == 0  # still lingering in the open batch
    started = time.monotonic()
    assert proc.stop() == 0
    assert time.monotonic() - started < 10
    assert await stored(db, mode) == 5
    assert "in-flight batches written and acknowledged" in proc.logs()
    again = daemon()  # nothing is redelivered: every message was acked before exit
    await publish([one(topic_root, "s1", 99)])
    await eventually(lambda: again.metric("ingest_messages_acked_total") == 1)
    assert again.metric("ingest_messages_received_total") == 1
    assert await stored(db, mode) == 6


async def test_backpressure_holds_memory_under_the_bound_and_loses_nothing(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any, mongo: Any
) -> None:
    proc = daemon(
        "--batch-size",
        "10",
        "--max-buffered-readings",
        "20",
        "--max-inflight-messages",
        "40",
        "--write-concurrency",
        "1",
    )
    async with failpoint(mongo, [WRITE_COMMAND[mode]]):
        await publish([one(topic_root, f"s{i % 3}", i) for i in range(150)])
        await eventually(lambda: proc.readyz() == 503)
        time.sleep(1.0)
        metrics = proc.metrics()
        assert metrics["ingest_buffered_readings"] <= 20
        # The broker holds the rest: at most the buffer plus the Receive Maximum got through.
        assert metrics["ingest_messages_received_total"] <= 20 + 40
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 150, timeout=40)
    assert await stored(db, mode) == 150
    await eventually(lambda: proc.readyz() == 200)


async def test_dry_run_builds_and_counts_writes_without_a_database(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str
) -> None:
    nowhere = f"mongodb://127.0.0.1:{free_port()}/?serverSelectionTimeoutMS=500"
    proc = daemon("--dry-run", mongodb_uri=nowhere)
    await publish([one(topic_root, "s1", i) for i in range(4)] + [one(topic_root, "s2", 0)])
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 5)
    assert proc.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == 5
    assert proc.metric(f'ingest_write_ops_total{{mode="{mode}"}}') >= 2
    assert proc.metric(f'ingest_info{{dry_run="true",mode="{mode}"}}') == 1
    assert proc.stop() == 0


async def test_health_is_alive_but_not_ready_without_a_broker(
    daemon: Callable[..., Daemon],
) -> None:
    proc = daemon(broker_url=f"mqtt://127.0.0.1:{free_port()}", wait_ready=False)
    await eventually(lambda: _status(proc, "/healthz") == 200)
    assert proc.readyz() == 503
    assert proc.metric("ingest_mqtt_connected") == 0
    assert http_status(proc.metrics_port, "/nope") == 404
    assert proc.stop() == 0


def _status(proc: Daemon, path: str) -> int:
    try:
        return http_status(proc.metrics_port, path)
    except OSError:
        return 0


async def test_a_backlog_queued_while_offline_is_drained_in_bursts(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str
) -> None:
    """Messages published while the daemon is down wait in its persistent session; on
    restart they arrive back to back (many packets per socket read) and all get through."""
    first = daemon("--dry-run")
    assert first.stop() == 0
    count = 3000
    await publish([one(topic_root, f"s{i % 7}", i) for i in range(count)])
    second = daemon("--dry-run")
    await eventually(lambda: second.metric("ingest_messages_acked_total") == count, timeout=30)
    assert second.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == count


async def test_retained_messages_are_stored_once_not_on_every_reconnect(
    daemon: Callable[..., Daemon], broker: Broker, topic_root: str, db: Any
) -> None:
    topic, payload = one(topic_root, "s1", 1)
    async with aiomqtt.Client("127.0.0.1", broker.port) as client:
        await client.publish(topic, payload, qos=1, retain=True)
    try:
        # A new session: the retained message is delivered once (and stored, as asked).
        first = daemon("--retained", "store")
        await eventually(lambda: first.metric("ingest_messages_acked_total") == 1)
        assert first.stop() == 0
        # The same persistent session: its subscription already exists.
        again = daemon("--retained", "store")
        time.sleep(1.0)
        assert again.metric("ingest_messages_received_total") == 0
        assert await stored(db, "bucket") == 1
    finally:
        async with aiomqtt.Client("127.0.0.1", broker.port) as client:
            await client.publish(topic, b"", qos=1, retain=True)  # clear it


async def test_a_subscription_granted_below_qos_1_is_not_accepted(
    daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """A broker that downgrades the subscription would turn ack-after-write into
    at-most-once: the daemon refuses it and stays unready rather than run like that."""
    capped = Broker(tmp_path, extra="max_qos 0\n")
    capped.start()
    try:
        proc = daemon(broker_url=capped.url, wait_ready=False)
        await eventually(lambda: "broker answered [0]" in proc.logs())
        assert proc.readyz() == 503
        assert proc.stop() == 0
    finally:
        capped.stop()


async def test_sigterm_while_waiting_for_mongodb_exits_promptly(
    daemon: Callable[..., Daemon],
) -> None:
    nowhere = f"mongodb://127.0.0.1:{free_port()}/?serverSelectionTimeoutMS=30000"
    proc = daemon("--shutdown-timeout", "2", mongodb_uri=nowhere, wait_ready=False)
    await eventually(lambda: _status(proc, "/healthz") == 200)
    started = time.monotonic()
    assert proc.stop() == 0
    assert time.monotonic() - started < 5


async def test_a_qos0_burst_while_writes_are_blocked_pauses_reading_and_loses_nothing(
    daemon: Callable[..., Daemon], publish: Any, topic_root: str, db: Any, mongo: Any
) -> None:
    """QoS 0 has no flow control. With writes blocked, the pipeline fills (20 readings),
    then the inbox (50 messages): the daemon stops reading its socket, says so
    (``ingest_mqtt_read_paused``, ``/readyz``), and the rest of the burst waits in TCP and
    at the broker. Once writes work again, every one of the 500 readings is stored, on
    the same connection."""
    proc = daemon(
        "--batch-size",
        "10",
        "--max-buffered-readings",
        "20",
        "--max-inflight-messages",
        "50",
        "--write-concurrency",
        "1",
    )
    burst = [one(topic_root, f"s{i % 10}", i) for i in range(500)]
    async with failpoint(mongo, ["update"]):
        await publish(burst, qos=0)
        await eventually(lambda: proc.metric("ingest_mqtt_read_paused") == 1)
        time.sleep(1.0)
        metrics = proc.metrics()
        assert metrics["ingest_buffered_readings"] <= 20
        assert metrics["ingest_messages_received_total"] <= 20 + 1
        assert metrics["ingest_mqtt_read_paused"] == 1
        assert 0 < metrics["ingest_inbox_bytes"] <= 51 * 1024
        assert _status(proc, "/readyz") == 503
    await eventually(
        lambda: proc.metric('ingest_readings_written_total{mode="bucket"}') == 500, timeout=120
    )
    assert await stored(db, "bucket") == 500
    assert await stored_values(db, "bucket", "seq") == list(range(500))
    metrics = proc.metrics()
    assert metrics["ingest_mqtt_read_pauses_total"] >= 1
    assert metrics["ingest_mqtt_read_paused_seconds_total"] >= 1.0
    assert metrics["ingest_mqtt_read_paused"] == 0
    assert metrics["ingest_mqtt_reconnects_total"] == 0
    assert "ingest_messages_dropped_total" not in metrics


async def test_a_qos0_backlog_larger_than_the_inbox_is_drained_on_connect(
    daemon: Callable[..., Daemon], tmp_path: Path, topic_root: str, db: Any
) -> None:
    """500 QoS 0 messages queued at the broker for the daemon's session while it was
    away: on connect they all come before the SUBACK, 10 times what the inbox holds.
    Reading pauses with the SUBACK still unread; the daemon consumes the inbox anyway,
    reads on, and stores every reading (the subscription is confirmed meanwhile)."""
    queueing = Broker(tmp_path, extra="queue_qos0_messages true\n")
    queueing.start()
    try:
        args = ("--batch-size", "10", "--max-inflight-messages", "50")
        first = daemon(*args, broker_url=queueing.url)
        assert first.stop() == 0  # the persistent session stays at the broker
        async with aiomqtt.Client("127.0.0.1", queueing.port) as client:
            for i in range(500):
                await client.publish(*one(topic_root, f"s{i % 10}", i), qos=0)
        proc = daemon(*args, broker_url=queueing.url, wait_ready=False)
        await eventually(lambda: _status(proc, "/healthz") == 200, timeout=60)
        await eventually(
            lambda: proc.metric('ingest_readings_written_total{mode="bucket"}') == 500, timeout=120
        )
        assert await stored_values(db, "bucket", "seq") == list(range(500))
        assert proc.metric("ingest_mqtt_read_pauses_total") >= 1
        assert proc.metric("ingest_mqtt_reconnects_total") == 0
        assert _status(proc, "/readyz") == 200
    finally:
        queueing.stop()


async def test_a_broker_restart_during_a_write_neither_loses_nor_duplicates(
    daemon: Callable[..., Daemon],
    mode: str,
    persistent: Broker,
    topic_root: str,
    db: Any,
    mongo: Any,
) -> None:
    """Writes fail (and are retried) while the broker restarts with its persistence: the
    daemon reconnects on its own, the broker redelivers the unacknowledged messages as
    DUPs, and the daemon acknowledges them once the original write succeeds instead of
    writing them a second time."""
    proc = daemon(broker_url=persistent.url)
    async with writes_failing(
        proc, mongo, mode, persistent, [one(topic_root, f"s{i % 2}", i) for i in range(20)]
    ):
        persistent.restart()
        await eventually(lambda: proc.metric("ingest_redeliveries_adopted_total") == 20)
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 20)
    assert await stored(db, mode) == 20
    assert await stored_values(db, mode, "seq") == list(range(20))
    assert proc.metric("ingest_mqtt_reconnects_total") >= 1
    time.sleep(0.5)
    assert proc.metric("ingest_messages_received_total") == 20  # nothing new came


async def test_run_refuses_a_collection_of_the_wrong_kind_with_one_line(
    daemon: Callable[..., Daemon], db: Any
) -> None:
    await db.readings.insert_one({"plain": "document"})
    proc = daemon("--mode", "timeseries", wait_ready=False)
    assert proc.wait(timeout=30) == 1
    errors = [line for line in proc.logs().splitlines() if " ERROR " in line]
    assert len(errors) == 1
    assert "is not a time-series collection" in errors[0]
    assert "Traceback" not in proc.logs()
    assert await db.readings.count_documents({}) == 1


async def test_broker_credentials_come_from_a_password_file_and_never_reach_the_logs(
    daemon: Callable[..., Daemon], tmp_path: Path, topic_root: str, db: Any
) -> None:
    secret = "s3cret-Pa55"
    locked = password_broker(tmp_path, "ingest", secret, extra="allow_anonymous false\n")
    locked.start()
    try:
        good, bad = tmp_path / "good", tmp_path / "bad"
        good.write_text(secret + "\n")
        bad.write_text("wrong-" + secret)
        url = f"mqtt://ingest@127.0.0.1:{locked.port}"
        refused = daemon(
            "--mqtt-password-file",
            str(bad),
            broker_url=url,
            wait_ready=False,
            client_id=f"bad-{topic_root}",
        )
        # Retrying cannot fix a wrong password: the start ends with one line, exit 1.
        assert refused.wait() == 1
        assert "refused the connection" in refused.logs().splitlines()[-1]
        assert secret not in refused.logs()
        proc = daemon("--mqtt-password-file", str(good), broker_url=url)
        async with aiomqtt.Client(
            "127.0.0.1", locked.port, username="ingest", password=secret
        ) as client:
            topic, payload = one(topic_root, "s1", 1)
            await client.publish(topic, payload, qos=1)
        await eventually(lambda: proc.metric("ingest_messages_acked_total") == 1)
        assert await stored(db, "bucket") == 1
        assert secret not in proc.logs()
    finally:
        locked.stop()


async def test_messages_not_yet_taken_when_the_connection_drops_are_processed_once(
    daemon: Callable[..., Daemon], persistent: Broker, topic_root: str, db: Any, mongo: Any
) -> None:
    """Backpressure holds messages in the inbox when the broker restarts: their DUP
    redeliveries are processed as new messages (not adopted), nothing is lost."""
    proc = daemon(
        "--batch-size",
        "5",
        "--max-buffered-readings",
        "5",
        "--max-inflight-messages",
        "40",
        "--write-concurrency",
        "1",
        broker_url=persistent.url,
    )
    async with writes_failing(
        proc, mongo, "bucket", persistent, [one(topic_root, "s1", i) for i in range(20)]
    ):
        persistent.restart()
        await eventually(
            lambda: (
                proc.metric("ingest_mqtt_reconnects_total") >= 1
                and proc.metric("ingest_mqtt_connected") == 1
            )
        )
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 20, timeout=30)
    assert await stored(db, "bucket") == 20
    assert await stored_values(db, "bucket", "seq") == list(range(20))


async def test_a_reconnect_while_reading_is_paused_reads_again_and_loses_nothing(
    daemon: Callable[..., Daemon], persistent: Broker, topic_root: str, db: Any, mongo: Any
) -> None:
    """Writes fail, the pipeline and the inbox fill (its byte bound: a quarter of 8,000
    bytes, a few messages) and reading pauses; then the broker restarts. The new
    connection reads from the start (the old inbox is forgotten, its messages come
    again), pauses again on the redeliveries, and once writes work every reading is
    stored once and reading is no longer paused."""
    proc = daemon(
        "--batch-size",
        "5",
        "--max-buffered-readings",
        "5",
        "--max-buffered-bytes",
        "8000",
        "--write-concurrency",
        "1",
        broker_url=persistent.url,
    )
    async with writes_failing(
        proc, mongo, "bucket", persistent, [one(topic_root, "s1", i) for i in range(30)]
    ):
        await eventually(lambda: proc.metric("ingest_mqtt_read_paused") == 1)
        persistent.restart()
        # Noticed while paused (the broker's FIN, from the TCP state); the redeliveries
        # fill the new connection's inbox ahead of its SUBACK, so it pauses again.
        await eventually(lambda: proc.metric("ingest_mqtt_reconnects_total") >= 1)
        await eventually(lambda: proc.metric("ingest_mqtt_read_pauses_total") >= 2)
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 30, timeout=60)
    # The SUBACK sits behind the redeliveries, read in the same bursts as the last of
    # them: the acks may go out before it is handled (connected: subscribed as well).
    await eventually(lambda: proc.metric("ingest_mqtt_connected") == 1)
    assert await stored(db, "bucket") == 30
    assert await stored_values(db, "bucket", "seq") == list(range(30))
    assert proc.metric("ingest_mqtt_read_paused") == 0
    await eventually(lambda: _status(proc, "/readyz") == 200)


async def test_writes_finishing_while_the_broker_is_down_are_acked_after_it_returns(
    daemon: Callable[..., Daemon], persistent: Broker, topic_root: str, db: Any, mongo: Any
) -> None:
    """No ack may go to a dead connection: writes that succeed during the reconnect
    backoff wait, and are acknowledged when the broker redelivers the messages."""
    proc = daemon(broker_url=persistent.url)
    async with writes_failing(
        proc, mongo, "bucket", persistent, [one(topic_root, "s1", i) for i in range(10)]
    ):
        persistent.stop()
        await eventually(lambda: proc.metric("ingest_mqtt_connected") == 0)
    await eventually(
        lambda: proc.metric('ingest_readings_written_total{mode="bucket"}') == 10, timeout=30
    )
    assert proc.metric("ingest_messages_acked_total") == 0
    persistent.start()
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 10, timeout=30)
    assert proc.metric("ingest_redeliveries_adopted_total") == 10
    assert await stored(db, "bucket") == 10


async def test_a_mongodb_outage_stops_acks_bounds_memory_and_loses_nothing(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any, mongo_uri: str
) -> None:
    """MongoDB unreachable for 30 s mid-stream (a proxy holds the traffic, as a network
    partition does): the daemon stops acking, keeps memory under its bound, turns
    unready, and writes everything once the network heals.

    A write sent during the partition times out, the daemon retries it, and the held
    original reaches MongoDB after the heal too. Bucket mode stores those readings once
    (idempotent writes); time-series mode can store the readings in flight twice (at
    most the buffer), which this test bounds."""
    target = mongo_uri.split("//", 1)[1].split("/", 1)[0]
    host, port = target.rsplit(":", 1)
    proxy = Proxy(host, int(port)).start()
    try:
        proxied = (
            f"mongodb://127.0.0.1:{proxy.port}/?directConnection=true"
            "&serverSelectionTimeoutMS=2000&socketTimeoutMS=2000"
        )
        proc = daemon(
            "--batch-size",
            "20",
            "--max-buffered-readings",
            "40",
            "--max-inflight-messages",
            "100",
            mongodb_uri=proxied,
        )
        await publish([one(topic_root, f"s{i % 3}", i) for i in range(50)])
        await eventually(lambda: proc.metric("ingest_messages_acked_total") == 50)
        proxy.cut()
        started = time.monotonic()
        await publish([one(topic_root, f"s{i % 3}", i) for i in range(50, 350)])
        await eventually(lambda: proc.readyz() == 503)
        peak = 0.0
        while time.monotonic() - started < 30:
            metrics = proc.metrics()
            peak = max(peak, metrics["ingest_buffered_readings"])
            assert metrics["ingest_messages_acked_total"] <= 50 + 40  # at most one batch in flight
            await asyncio.sleep(1)
        assert peak <= 40
        proxy.heal()
        await eventually(lambda: proc.metric("ingest_messages_acked_total") == 350, timeout=60)
        seqs = await stored_values(db, mode, "seq")
        assert set(seqs) == set(range(350))  # nothing missing
        if mode == "bucket":
            assert len(seqs) == 350
        else:
            assert len(seqs) - 350 <= 40  # duplicates only from writes in flight
        print(  # noqa: T201
            f"\n{mode}: {len(seqs) - 350} readings stored twice after the partition; "
            f"{proc.metric(f'ingest_duplicate_readings_total{{mode="{mode}"}}'):.0f} "
            "duplicates detected"
        )
        await eventually(lambda: proc.readyz() == 200)
    finally:
        proxy.stop()


async def test_daemons_on_one_shared_subscription_split_the_load_and_write_each_reading_once(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any
) -> None:
    group = f"g{topic_root}"
    procs = [daemon("--shared-group", group, client_id=f"{group}-{i}") for i in range(3)]
    await publish([one(topic_root, f"s{i % 20}", i) for i in range(600)])
    await eventually(
        lambda: sum(p.metric("ingest_messages_acked_total") for p in procs) == 600, timeout=40
    )
    shares = [p.metric("ingest_messages_received_total") for p in procs]
    assert sum(shares) == 600
    assert all(share > 0 for share in shares), shares  # each daemon got a share
    assert await stored(db, mode) == 600
    assert await stored_values(db, mode, "seq") == list(range(600))
    if mode == "bucket":  # 20 sensors: the daemons updated the same buckets concurrently
        docs = await db.buckets.find({}).to_list()
        assert all(d["count"] == len(d["readings"]) for d in docs)
        temps = [20 + i / 10 for i in range(600)]
        assert sum(d["stats"]["temp"]["count"] for d in docs) == 600
        assert math.isclose(sum(d["stats"]["temp"]["sum"] for d in docs), math.fsum(temps))
        assert min(d["stats"]["temp"]["min"] for d in docs) == min(temps)
        assert max(d["stats"]["temp"]["max"] for d in docs) == max(temps)


def make_tls_files(directory: Path) -> dict[str, Path]:
    """A throwaway CA, a broker certificate for 127.0.0.1 and a client certificate, with
    the extensions Python 3.13's strict verification (VERIFY_X509_STRICT) requires."""
    files = {
        name: directory / name
        for name in (
            "ca.key",
            "ca.crt",
            "server.key",
            "server.csr",
            "server.crt",
            "server.ext",
            "client.key",
            "client.csr",
            "client.crt",
            "client.ext",
        )
    }
    common = "authorityKeyIdentifier=keyid,issuer\nbasicConstraints=critical,CA:FALSE\n"
    files["server.ext"].write_text(
        common + "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
    )
    files["client.ext"].write_text(
        common + "keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"
    )

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    ssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout",
        str(files["ca.key"]),
        "-out",
        str(files["ca.crt"]),
    )
    for who, cn in (("server", "127.0.0.1"), ("client", "ingest")):
        ssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={cn}",
            "-keyout",
            str(files[f"{who}.key"]),
            "-out",
            str(files[f"{who}.csr"]),
        )
        ssl(
            "x509",
            "-req",
            "-in",
            str(files[f"{who}.csr"]),
            "-CA",
            str(files["ca.crt"]),
            "-CAkey",
            str(files["ca.key"]),
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            str(files[f"{who}.ext"]),
            "-out",
            str(files[f"{who}.crt"]),
        )
    return files


async def test_mqtts_with_a_private_ca_and_a_client_certificate(
    daemon: Callable[..., Daemon], tmp_path: Path, topic_root: str, db: Any
) -> None:
    """mqtts:// verifies the broker against --mqtt-ca-file and presents the client
    certificate; a broker the CA did not sign is refused."""
    tls = make_tls_files(tmp_path)
    port = free_port()
    secure = Broker(
        tmp_path,
        extra=(
            f"listener {port} 127.0.0.1\n"
            f"cafile {tls['ca.crt']}\ncertfile {tls['server.crt']}\nkeyfile {tls['server.key']}\n"
            "require_certificate true\n"
        ),
    )
    secure.start()
    try:
        proc = daemon(
            "--mqtt-ca-file",
            str(tls["ca.crt"]),
            "--mqtt-cert-file",
            str(tls["client.crt"]),
            "--mqtt-key-file",
            str(tls["client.key"]),
            broker_url=f"mqtts://127.0.0.1:{port}",
        )
        async with aiomqtt.Client("127.0.0.1", secure.port) as client:  # plain listener
            await client.publish(*one(topic_root, "s1", 1), qos=1)
        await eventually(lambda: proc.metric("ingest_messages_acked_total") == 1)
        assert await stored(db, "bucket") == 1
        untrusted = daemon(
            broker_url=f"mqtts://127.0.0.1:{port}",
            wait_ready=False,
            client_id=f"untrusted-{topic_root}",
        )
        # No retry can make the certificate verify: the start ends with one line, exit 1.
        assert untrusted.wait() == 1
        last = untrusted.logs().splitlines()[-1]
        assert last.startswith("ingest: error: --mqtt-ca-file:"), last
        assert "CERTIFICATE_VERIFY_FAILED" in last
    finally:
        secure.stop()


async def test_no_secret_appears_in_logs_metrics_or_connection_errors(
    daemon: Callable[..., Daemon], broker: Broker
) -> None:
    """Credentials in both URLs, MongoDB unreachable so its errors get logged: neither
    password shows up anywhere the daemon writes or serves."""
    mqtt_secret, mongo_secret = "mqtt-Pa55-word", "mongo-Pa55-word"
    nowhere = f"mongodb://app:{mongo_secret}@127.0.0.1:{free_port()}/?serverSelectionTimeoutMS=300"
    proc = daemon(
        mongodb_uri=nowhere,
        wait_ready=False,
        broker_url=f"mqtt://ingest:{mqtt_secret}@127.0.0.1:{broker.port}",
    )
    await eventually(lambda: "cannot prepare MongoDB collections" in proc.logs())
    await eventually(lambda: _status(proc, "/healthz") == 200)
    with urllib.request.urlopen(f"http://127.0.0.1:{proc.metrics_port}/metrics") as resp:
        served = resp.read().decode()
    with pytest.raises(urllib.error.HTTPError) as unready:  # 503, reasons in the body
        urllib.request.urlopen(f"http://127.0.0.1:{proc.metrics_port}/readyz")
    assert unready.value.code == 503
    served += unready.value.read().decode()
    unready.value.close()
    assert proc.stop() == 0
    for secret in (mqtt_secret, mongo_secret):
        assert secret not in proc.logs()
        assert secret not in served

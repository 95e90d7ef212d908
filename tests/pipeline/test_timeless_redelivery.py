"""Readings without their own time, redelivered after a crash: stored once, at one time.

Most devices (Zigbee2MQTT, Shelly, Tasmota, ESPHome) send no time: their readings take
their arrival time. When the daemon dies after writing them and before the broker has
their PUBACKs, the broker resends the messages (DUP) to the restarted daemon; without a
record of the times the first delivery gave, the redelivery's readings would take new
arrival times and be stored a second time. The delivery ledger (ingest/store/deliveries.py)
gives them the recorded times again, so the writers find them stored (duplicates).
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

import orjson

from tests.support.mongo import failpoint, instants, stored, stored_values
from tests.support.procs import eventually
from tests.support.proxy import Proxy

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.support.procs import Broker, Daemon

WRITE_COMMAND = {"bucket": "update", "timeseries": "insert"}
COLLECTION = {"bucket": "buckets", "timeseries": "readings"}


async def crash_before_the_acks(start: Callable[[str], Daemon], broker: Broker, mongo: Any,
                                publish: Any, messages: list[tuple[str, bytes]], mode: str,
                                readings: int) -> None:
    """Start a daemon behind a proxy, let it write ``messages`` (``readings`` readings),
    lose their PUBACKs, SIGKILL it."""
    proxy = Proxy("127.0.0.1", broker.port).start()
    try:
        first = start(f"mqtt://127.0.0.1:{proxy.port}")
        async with failpoint(mongo, [WRITE_COMMAND[mode]]):  # hold the writes...
            await publish(messages)
            await eventually(lambda: first.metric("ingest_messages_received_total")
                             == len(messages))
            proxy.cut()  # ...until the PUBACKs can no longer reach the broker
        await eventually(lambda: first.metric(
            f'ingest_readings_written_total{{mode="{mode}"}}') == readings)
        first.signal(signal.SIGKILL)
        first.wait()
        proxy.drop()  # the held PUBACKs never arrive
    finally:
        proxy.stop()


async def test_timeless_readings_redelivered_after_a_crash_are_stored_once(
        daemon: Callable[..., Daemon], mode: str, broker: Broker, topic_root: str, db: Any,
        mongo: Any, publish: Any) -> None:
    """20 QoS 1 messages without a time, written, PUBACKs lost, SIGKILL, restart: the
    broker resends all 20 with DUP; each reading is stored once, at its first time."""
    messages = [(f"{topic_root}/s{i % 3}/readings", orjson.dumps({"seq": i, "temp": 20 + i}))
                for i in range(20)]

    await crash_before_the_acks(lambda url: daemon(broker_url=url), broker, mongo, publish,
                                messages, mode, 20)
    before = await instants(db[COLLECTION[mode]], mode)
    assert len(before) == 20
    second = daemon()  # same client id: the broker redelivers all 20 with DUP
    await eventually(lambda: second.metric("ingest_messages_acked_total") == 20)
    assert second.metric(f'ingest_duplicate_readings_total{{mode="{mode}"}}') == 20
    assert await stored(db, mode) == 20
    assert await stored_values(db, mode, "seq") == list(range(20))
    assert await instants(db[COLLECTION[mode]], mode) == before


async def test_zigbee2mqtt_states_redelivered_after_a_crash_are_stored_once(
        daemon: Callable[..., Daemon], mode: str, broker: Broker, topic_root: str, db: Any,
        mongo: Any, publish: Any) -> None:
    """The zigbee2mqtt preset (no time in its messages): the same, through the mapping
    rules; devices repeat a state word for word, and each message keeps its own time."""
    devices = [f"{topic_root}-{name}" for name in ("hall", "porch")]
    messages = [(f"zigbee2mqtt/{devices[i % 2]}",
                 orjson.dumps({"temperature": 20 + i // 4, "state": "ON", "linkquality": 90}))
                for i in range(12)]  # messages i and i + 2 are the same state of one device
    topics = [arg for device in devices for arg in ("--topic", f"zigbee2mqtt/{device}")]

    def start(url: str | None = None) -> Daemon:
        return daemon("--preset", "zigbee2mqtt", *topics, rule_topics=True, broker_url=url)

    await crash_before_the_acks(start, broker, mongo, publish, messages, mode, 12)
    before = await instants(db[COLLECTION[mode]], mode)
    assert len(before) == 12
    second = start()
    await eventually(lambda: second.metric("ingest_messages_acked_total") == 12)
    assert second.metric(f'ingest_duplicate_readings_total{{mode="{mode}"}}') == 12
    assert second.metric('ingest_redeliveries_retimed_total{outcome="recorded"}') == 12
    assert await instants(db[COLLECTION[mode]], mode) == before

"""Readings without their own time, redelivered after a crash: stored once, at one time.

Most devices (Zigbee2MQTT, Shelly, Tasmota, ESPHome) send no time: their readings take
their arrival time. When the daemon dies after writing them and before the broker has
their PUBACKs, the broker resends the messages (DUP) to the restarted daemon; without a
record of the times the first delivery gave, the redelivery's readings would take new
arrival times and be stored a second time. The delivery ledger (ingest/store/deliveries.py)
gives them the recorded times again, so the writers find them stored (duplicates).
"""

from __future__ import annotations

import asyncio
import signal
from typing import TYPE_CHECKING, Any

import orjson

from ingest.config import Settings
from ingest.devices import decode
from ingest.errors import WriteError
from ingest.metrics import Health, Metrics
from ingest.model import Inbound, Reading
from ingest.pipeline.stages import Pipeline
from ingest.store.deliveries import COLLECTION as LEDGER
from ingest.store.deliveries import Deliveries, Latest, unpack
from ingest.store.writers import Outcome, Plan
from tests.support.acks import Acks
from tests.support.mongo import failpoint, instants, stored, stored_values
from tests.support.procs import eventually
from tests.support.proxy import Proxy

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.support.procs import Broker, Daemon

WRITE_COMMAND = {"bucket": "update", "timeseries": "insert"}
COLLECTION = {"bucket": "buckets", "timeseries": "readings"}


async def crash_before_the_acks(
    start: Callable[[str], Daemon],
    broker: Broker,
    mongo: Any,
    publish: Any,
    messages: list[tuple[str, bytes]],
    mode: str,
    readings: int,
) -> None:
    """Start a daemon behind a proxy, let it write ``messages`` (``readings`` readings),
    lose their PUBACKs, SIGKILL it."""
    proxy = Proxy("127.0.0.1", broker.port).start()
    try:
        first = start(f"mqtt://127.0.0.1:{proxy.port}")
        async with failpoint(mongo, [WRITE_COMMAND[mode]]):  # hold the writes...
            await publish(messages)
            await eventually(
                lambda: first.metric("ingest_messages_received_total") == len(messages)
            )
            proxy.cut()  # ...until the PUBACKs can no longer reach the broker
        await eventually(
            lambda: first.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == readings
        )
        first.signal(signal.SIGKILL)
        first.wait()
        proxy.drop()  # the held PUBACKs never arrive
    finally:
        proxy.stop()


async def test_timeless_readings_redelivered_after_a_crash_are_stored_once(
    daemon: Callable[..., Daemon],
    mode: str,
    broker: Broker,
    topic_root: str,
    db: Any,
    mongo: Any,
    publish: Any,
) -> None:
    """20 QoS 1 messages without a time, written, PUBACKs lost, SIGKILL, restart: the
    broker resends all 20 with DUP; each reading is stored once, at its first time."""
    messages = [
        (f"{topic_root}/s{i % 3}/readings", orjson.dumps({"seq": i, "temp": 20 + i}))
        for i in range(20)
    ]

    await crash_before_the_acks(
        lambda url: daemon(broker_url=url), broker, mongo, publish, messages, mode, 20
    )
    before = await instants(db[COLLECTION[mode]], mode)
    assert len(before) == 20
    second = daemon()  # same client id: the broker redelivers all 20 with DUP
    await eventually(lambda: second.metric("ingest_messages_acked_total") == 20)
    assert second.metric(f'ingest_duplicate_readings_total{{mode="{mode}"}}') == 20
    assert await stored(db, mode) == 20
    assert await stored_values(db, mode, "seq") == list(range(20))
    assert await instants(db[COLLECTION[mode]], mode) == before


async def test_zigbee2mqtt_states_redelivered_after_a_crash_are_stored_once(
    daemon: Callable[..., Daemon],
    mode: str,
    broker: Broker,
    topic_root: str,
    db: Any,
    mongo: Any,
    publish: Any,
) -> None:
    """The zigbee2mqtt preset (no time in its messages): the same, through the mapping
    rules; devices repeat a state word for word, and each message keeps its own time."""
    devices = [f"{topic_root}-{name}" for name in ("hall", "porch")]
    messages = [
        (
            f"zigbee2mqtt/{devices[i % 2]}",
            orjson.dumps({"temperature": 20 + i // 4, "state": "ON", "linkquality": 90}),
        )
        for i in range(12)
    ]  # messages i and i + 2 are the same state of one device
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


# --------------------------------------------------------------------------- the pipeline

NOW = 1_790_000_000.0


class LedgerFirst:
    """A writer that keeps the readings and, per reading, whether the ledger held its
    time when it was written (None for the one with a time of its own, ``v`` 0)."""

    mode = "bucket"

    def __init__(self, db: Any) -> None:
        self.db = db
        self.written: list[Reading] = []
        self.recorded_first: list[bool | None] = []

    async def ensure_schema(self) -> None:
        return None

    def plan(self, readings: list[Reading]) -> Plan:
        return Plan(list(readings), [[r] for r in readings])

    async def write(self, plan: Plan) -> Outcome:
        recorded = {
            t
            for doc in await self.db[LEDGER].find({}).to_list()
            for _mid, _crc, entry in unpack(doc["entries"], doc["n"])
            for t in entry.times
        }
        self.recorded_first += [None if r.values["v"] == 0 else r.ms in recorded for r in plan.ops]
        self.written += plan.ops
        return Outcome(written=len(plan.ops))

    def take_lookups(self) -> tuple[int, float]:
        return 0, 0.0


class NoRejects:
    async def write(self, docs: list[dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
        return len(docs), []


class FailingOnce(Deliveries):
    """The ledger, whose first lookup fails as a network error would."""

    failed = False

    async def tail(self) -> Latest:
        if not self.failed:
            self.failed = True
            raise WriteError("connection reset")
        return await super().tail()


async def through_a_pipeline(
    db: Any, messages: list[Inbound], ledger: type[Deliveries] = Deliveries
) -> tuple[LedgerFirst, Metrics]:
    """``messages`` through a pipeline with client ``c1``'s ledger, as one process would."""
    writer, metrics = LedgerFirst(db), Metrics("bucket")
    settings = Settings(batch_size=4, flush_interval=0.05, write_concurrency=1)  # in order
    pipeline = Pipeline(
        settings,
        writer,
        NoRejects(),  # type: ignore[arg-type]
        Acks(),
        metrics,
        Health(),
        deliveries=ledger(db[LEDGER], "c1", keep=100),
    )
    task = asyncio.create_task(pipeline.run())
    for message in messages:
        if not pipeline.take_now(message):
            assert await pipeline.submit(message)
    await asyncio.wait_for(pipeline.drain(), 30)
    task.cancel()
    return writer, metrics


def timeless(mid: int, value: int, qos: int = 1, dup: bool = False, at: float = NOW) -> Inbound:
    return Inbound("sensors/a/readings", orjson.dumps({"v": value}), mid, qos, 1, at, dup)


async def test_a_resent_message_takes_the_times_recorded_before_its_first_write(
    db: Any, monkeypatch: Any
) -> None:
    """A process records the times of its QoS 1 messages without a time before writing
    them (QoS 0 and timed ones are not recorded); the next process gives their DUPs those
    times, and a DUP whose first delivery was never recorded takes its arrival time."""
    monkeypatch.setattr(decode.ARRIVALS, "given", None)  # the pipelines set it
    monkeypatch.setattr(decode.ARRIVALS, "_last", {})  # no arrival times of other tests
    timed = Inbound("sensors/a/readings", orjson.dumps({"ts": NOW - 5, "v": 0}), 9, 1, 1, NOW)
    first, _ = await through_a_pipeline(
        db, [timed, timeless(1, 1), timeless(2, 2), timeless(3, 3, qos=0), timeless(4, 1)]
    )
    # each timeless reading's time was recorded before the reading was written
    assert first.recorded_first == [None, True, True, False, True]  # QoS 0: not resent
    given = [r.ms for r in first.written[1:]]
    assert len(set(given)) == 4  # one sensor: a millisecond apart
    later = NOW + 30
    second, metrics = await through_a_pipeline(
        db,
        [
            timeless(1, 1, dup=True, at=later),
            timeless(2, 2, dup=True, at=later),
            timeless(4, 1, dup=True, at=later),
            timeless(5, 5, dup=True, at=later),
        ],
    )
    assert [r.ms for r in second.written] == [given[0], given[1], given[3], int(later * 1000)]
    assert [
        metrics.redeliveries_retimed.labels(outcome)._value.get()
        for outcome in ("recorded", "unrecorded")
    ] == [3, 1]


async def test_batches_of_timed_readings_record_nothing(db: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(decode.ARRIVALS, "given", None)
    monkeypatch.setattr(decode.ARRIVALS, "_last", {})
    messages = [
        Inbound("sensors/a/readings", orjson.dumps({"ts": NOW + i, "v": i}), i + 1, 1, 1, NOW)
        for i in range(6)
    ]
    writer, _ = await through_a_pipeline(db, messages)
    assert (len(writer.written), await db[LEDGER].count_documents({})) == (6, 0)


async def test_a_failed_ledger_lookup_is_retried(db: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(decode.ARRIVALS, "given", None)
    monkeypatch.setattr(decode.ARRIVALS, "_last", {})
    monkeypatch.setattr("ingest.pipeline.stages.backoff", lambda *_a, **_k: 0.0)
    first, _ = await through_a_pipeline(db, [timeless(1, 1)])
    again, metrics = await through_a_pipeline(
        db, [timeless(1, 1, dup=True, at=NOW + 9)], FailingOnce
    )
    assert [r.ms for r in again.written] == [r.ms for r in first.written]
    assert metrics.write_errors.labels("bucket", "transient")._value.get() == 1

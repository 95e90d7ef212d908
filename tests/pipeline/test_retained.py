"""Retained messages (--retained): old state that the broker sends on subscribing.

mosquitto sends a topic's retained message to every member of a shared group when it
subscribes, and again whenever a subscription is made anew (here: the sessions end
between two runs, as when they expire). Through the real daemon with two workers, the
real broker and the store: ``ignore`` stores none of it and counts each delivery,
``store`` stores each state once at the time it was first seen; live publishes (with
the retain flag too) are readings either way.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import aiomqtt
import pytest

from ingest.config import Settings
from ingest.devices.mapping import Mapping
from ingest.errors import WriteError
from ingest.metrics import Health, Metrics
from ingest.model import Inbound, Reading
from ingest.pipeline.retained import COLLECTION, FirstSeen
from ingest.pipeline.stages import Pipeline
from ingest.store.writers import Outcome, Plan
from tests.support.acks import Acks
from tests.support.mongo import COLLECTION as READINGS
from tests.support.mongo import failpoint
from tests.support.procs import eventually

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.support.procs import Broker, Daemon

TIMED_TS = "2026-01-01T00:00:00Z"
SKIPPED = 'ingest_retained_messages_total{outcome="skipped"}'
NEW = 'ingest_retained_messages_total{outcome="new"}'
KNOWN = 'ingest_retained_messages_total{outcome="known"}'


async def publish(
    broker: Broker, messages: list[tuple[str, dict[str, Any]]], retain: bool = True
) -> None:
    """Publish at QoS 1, retained unless told otherwise."""
    async with aiomqtt.Client(
        "127.0.0.1", broker.port, identifier=f"pub-{uuid.uuid4().hex[:8]}"
    ) as client:
        for topic, payload in messages:
            await client.publish(topic, json.dumps(payload), qos=1, retain=retain)


async def end_sessions(broker: Broker, client_ids: list[str]) -> None:
    """End the daemon's sessions (as an expiry does): its next start subscribes anew."""
    for client_id in client_ids:
        async with aiomqtt.Client(
            "127.0.0.1",
            broker.port,
            identifier=client_id,
            protocol=aiomqtt.ProtocolVersion.V5,
            clean_start=True,
        ):
            pass


async def readings(db: Any, mode: str) -> list[tuple[str, datetime, float]]:
    """Every stored reading as (sensor, time, temp), sorted."""
    coll = db[READINGS[mode]]
    if mode == "timeseries":
        docs = await coll.find({}).to_list()
        return sorted((d["meta"]["sensor_id"], d["ts"], d["temp"]) for d in docs)
    docs = await coll.find({}).to_list()
    return sorted((d["sensor_id"], r["ts"], r["temp"]) for d in docs for r in d["readings"])


async def run_once(daemon: Callable[..., Daemon], retained: str, delivered: int) -> Daemon:
    """Two workers; wait until every worker has had the retained states (two each)."""
    proc = daemon("--workers", "2", "--retained", retained)
    await eventually(lambda: sum(proc.metric(name) for name in (SKIPPED, NEW, KNOWN)) == delivered)
    await eventually(
        lambda: (
            proc.metric("ingest_messages_acked_total")
            == proc.metric("ingest_messages_received_total")
        )
    )
    return proc


@pytest.mark.parametrize("retained", ["ignore", "store"])
async def test_a_retained_state_through_two_workers_and_a_restart(
    daemon: Callable[..., Daemon],
    broker: Broker,
    db: Any,
    topic_root: str,
    mode: str,
    retained: str,
) -> None:
    # The usual retained state: a reading without a time of its own (ESPHome, Tasmota,
    # Homie); and one with its own time.
    states = [
        (f"{topic_root}/r1", {"sensor_id": "r1", "temp": 21.5}),
        (f"{topic_root}/r2", {"sensor_id": "r2", "ts": TIMED_TS, "temp": 3.0}),
    ]
    await publish(broker, states)
    first = await run_once(daemon, retained, 4)  # each worker gets both states
    # A live publish: a reading, delivered once through the group.
    await publish(
        broker, [(f"{topic_root}/live", {"sensor_id": "live", "temp": 1.0})], retain=False
    )
    await eventually(lambda: first.metric("ingest_messages_acked_total") == 5)
    metrics = first.metrics()
    assert first.stop() == 0
    before = await readings(db, mode)
    await end_sessions(broker, [f"ingest-{topic_root}", f"ingest-{topic_root}-w1"])

    again = await run_once(daemon, retained, 4)  # sent again on the new subscriptions
    after = await readings(db, mode)
    restarted = again.metrics()
    assert again.stop() == 0
    live = [r for r in after if r[0] == "live"]
    assert [(r[0], r[2]) for r in live] == [("live", 1.0)]
    if retained == "ignore":
        assert after == live
        assert (metrics[SKIPPED], restarted[SKIPPED]) == (4, 4)
        assert metrics[NEW] == metrics[KNOWN] == restarted[NEW] == restarted[KNOWN] == 0
        assert "retained messages arrive on subscribing" in first.logs()
        assert first.logs().count("skipping them, counted in") <= 2  # once per worker
        return
    # One state, one time: that of the first delivery to any worker, kept across runs.
    assert (metrics[NEW], metrics[KNOWN], restarted[NEW], restarted[KNOWN]) == (2, 2, 0, 4)
    assert metrics[SKIPPED] == restarted[SKIPPED] == 0
    record = await db[COLLECTION].find_one({"_id": f"{topic_root}/r1"})
    times = {sensor: {r[1] for r in after if r[0] == sensor} for sensor in ("r1", "r2")}
    assert times == {"r1": {record["first_seen"]}, "r2": {datetime(2026, 1, 1, tzinfo=UTC)}}
    assert after == before  # the restart stored nothing again
    if mode == "bucket":  # idempotent per sensor and instant: once, whatever the race
        assert [(r[0], r[2]) for r in after] == [("live", 1.0), ("r1", 21.5), ("r2", 3.0)]


async def test_two_daemons_recording_one_state_agree_and_a_new_payload_is_a_new_time(
    db: Any,
) -> None:
    store = FirstSeen(db[COLLECTION])
    one, two = (
        await store.first_seen("a/t", b"x", 1000.0),
        await store.first_seen("a/t", b"x", 2000.0),
    )
    assert (one, two) == ((1_000_000, True), (1_000_000, False))
    assert await store.first_seen("a/t", b"y", 3000.5) == (3_000_500, True)
    assert await store.first_seen("a/t", b"y", 4000.0) == (3_000_500, False)
    assert await store.first_seen("a/t", b"x", 5000.0) == (5_000_000, True)  # changed back
    assert await db[COLLECTION].count_documents({}) == 1  # one document per topic


class Racing:
    """The collection, with another daemon recording ``payload`` just after our read."""

    def __init__(self, collection: Any, payload: bytes) -> None:
        self.collection, self.payload, self.raced = collection, payload, False

    async def find_one(self, *args: Any, **kwargs: Any) -> Any:
        doc = await self.collection.find_one(*args, **kwargs)
        if not self.raced:
            self.raced = True
            await FirstSeen(self.collection).first_seen("a/t", self.payload, 6000.0)
        return doc

    def with_options(self, **_options: Any) -> Racing:
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self.collection, name)


async def test_a_daemon_that_loses_the_race_takes_the_winners_time(db: Any) -> None:
    """Its read saw an old payload, its upsert's filter no longer matches (the winner
    recorded the same payload), the insert collides on _id: it reads the winner's."""
    await FirstSeen(db[COLLECTION]).first_seen("a/t", b"old", 1000.0)
    loser = FirstSeen(Racing(db[COLLECTION], b"new"))  # type: ignore[arg-type]
    assert await loser.first_seen("a/t", b"new", 7000.0) == (6_000_000, False)
    assert await db[COLLECTION].count_documents({}) == 1


async def test_a_mongodb_failure_of_the_record_is_retried_and_nothing_doubles(
    daemon: Callable[..., Daemon], broker: Broker, db: Any, mongo: Any, topic_root: str
) -> None:
    await publish(broker, [(f"{topic_root}/r1", {"sensor_id": "r1", "temp": 21.5})])
    async with failpoint(mongo, ["findAndModify"], {"times": 3}):
        proc = daemon("--retained", "store")
        await eventually(lambda: proc.metric(NEW) == 1, timeout=30)
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 1)
    assert proc.metric('ingest_write_errors_total{kind="transient",mode="bucket"}') >= 1
    assert proc.stop() == 0
    assert [(r[0], r[2]) for r in await readings(db, "bucket")] == [("r1", 21.5)]


# --------------------------------------------------------------------------- the pipeline


class Recorder:
    """A writer that keeps what it is asked to look up and to write."""

    mode = "timeseries"

    def __init__(self) -> None:
        self.written: list[Reading] = []

    async def ensure_schema(self) -> None:
        return None

    def plan(self, readings: list[Reading]) -> Plan:
        return Plan(list(readings), [[r] for r in readings])

    async def write(self, plan: Plan) -> Outcome:
        self.written += plan.ops
        return Outcome(written=len(plan.ops))

    def take_lookups(self) -> tuple[int, float]:
        return 0, 0.0


class Recorded:
    """A FirstSeen that answers from memory, failing as told first."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.times: dict[str, int] = {}

    async def first_seen(self, topic: str, _payload: bytes, now: float) -> tuple[int, bool]:
        if self.failures:
            self.failures -= 1
            raise WriteError("connection reset")
        new = topic not in self.times
        return self.times.setdefault(topic, int(now * 1000)), new


async def through_pipeline(
    messages: list[Inbound], retained: str, worker: int = 0, record: Recorded | None = None
) -> tuple[Recorder, Acks, Metrics]:
    """Messages through a pipeline as worker ``worker`` of two, with the shelly preset."""
    mapping = Mapping.load(None, ["shelly"])
    mapping.arrivals.spread(worker, 2)
    settings = Settings(
        batch_size=10,
        flush_interval=0.05,
        retained=retained,  # type: ignore[arg-type]
        mapping=mapping,
    )
    writer, acks, metrics = Recorder(), Acks(), Metrics("timeseries")
    pipeline = Pipeline(
        settings,
        writer,
        Rejects(),  # type: ignore[arg-type]
        acks,
        metrics,
        Health(),
        record,  # type: ignore[arg-type]
    )
    task = asyncio.create_task(pipeline.run())
    for message in messages:
        taken = pipeline.take_now(message)
        if taken is None:
            taken = await pipeline.submit(message)
        assert taken
    await asyncio.wait_for(pipeline.drain(), 30)
    task.cancel()
    pipeline.sync_metrics()
    return writer, acks, metrics


class Rejects:
    async def write(self, docs: list[dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
        return len(docs), []


SHELLY = "shellies/shelly1pm-84CCA8ADE5E2/temperature"
ARRIVED = 1_790_000_000.1234


def inbound(mid: int, *, retained: bool, at: float = ARRIVED) -> Inbound:
    return Inbound(SHELLY, b"21.5", mid, 1, 1, at, dup=False, retained=retained)


async def test_ignore_acknowledges_and_counts_a_retained_message_in_its_turn() -> None:
    writer, acks, metrics = await through_pipeline(
        [
            inbound(1, retained=False),
            inbound(2, retained=True),
            inbound(3, retained=False, at=ARRIVED + 1),
        ],
        "ignore",
    )
    assert acks.mids == [1, 2, 3]  # in arrival order, the skipped one included
    assert len(writer.written) == 2
    values = metrics.registry.get_sample_value
    assert values("ingest_retained_messages_total", {"outcome": "skipped"}) == 1
    assert values("ingest_messages_received_total") == 3


async def test_store_gives_a_retained_state_the_same_instant_in_every_worker() -> None:
    """Untimed readings of a preset are spread over the workers' milliseconds (each
    worker its own residue); a retained state's first-seen time is taken exactly, by
    both workers, so the writers' duplicate check finds the second copy."""
    record = Recorded(failures=2)  # retried like a write
    given = []
    for worker, arrived in ((0, ARRIVED), (1, ARRIVED + 5)):
        writer, acks, _ = await through_pipeline(
            [inbound(1, retained=True, at=arrived), inbound(2, retained=False, at=arrived)],
            "store",
            worker,
            record,
        )
        assert acks.mids == [1, 2]
        retained, live = writer.written  # in arrival order
        assert live.ms is not None
        assert live.ms % 2 == worker
        given.append(retained.ms)
    assert given == [int(ARRIVED * 1000)] * 2

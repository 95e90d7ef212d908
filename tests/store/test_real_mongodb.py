"""Behaviour only a real MongoDB server can show (issue 8).

Every test here is marked ``real_mongodb``: under the mongoeco emulator it is reported as
skipped with the reason; CI runs it against MongoDB 7.0 and 8.0 (``.github/workflows/ci.yml``).
What each test relies on is documented by MongoDB; the page is named in each docstring.
docs/development.md ("Emulator gaps") lists where the emulator differs and which test here
covers it. Test data stays small and every test runs under a time limit.

Timestamps are recent (this hour or the last few), never fixed dates: a time-series
collection or TTL index with a retention would otherwise let the server's TTL monitor
(every 60 s) delete data while a test reads it.
"""

from __future__ import annotations

import asyncio
import math
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson
import pytest
from pymongo import AsyncMongoClient, MongoClient, monitoring
from pymongo.errors import OperationFailure, WriteError

from ingest.model import Reading
from ingest.store.schema import BUCKET_VALIDATOR, Schema
from ingest.store.writers.bucket import SCHEMA_VERSION, BucketWriter
from ingest.store.writers.timeseries import TimeseriesWriter
from loadgen.measure import storage
from tests.support.procs import eventually

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.support.procs import Daemon

HOUR = 3600
TIME_LIMIT = 60.0  # seconds per test, daemons included


def hour_start(hours_ago: int) -> int:
    """The start of the UTC hour ``hours_ago`` hours before this one."""
    return (int(time.time()) // HOUR - hours_ago) * HOUR


def at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def reading(sensor: str, epoch: int, seq: int) -> Reading:
    """Integral epochs (stored exactly at millisecond precision) and values in halves
    (sums exact in binary floating point), always a float so a time-series bucket never
    sees a change of type."""
    return Reading(sensor, at(epoch), float(epoch), {"v": seq * 0.5}, seq)


def schema_for(
    db: Any,
    name: str,
    *,
    retention_days: float | None = None,
    granularity: str = "seconds",
    custom_span: int | None = None,
) -> Schema:
    return Schema(
        db,
        name,
        rejects_collection="rejects",
        rejects_max_bytes=1 << 20,
        retention_days=retention_days,
        span_seconds=HOUR,
        granularity=granularity,
        custom_span=custom_span,
    )


async def collection_info(db: Any, name: str) -> dict[str, Any]:
    cursor = await db.list_collections(filter={"name": name})
    entries = await cursor.to_list()
    assert entries, f"{name} is not listed"
    return dict(entries[0])


async def raw_buckets(db: Any, name: str) -> list[dict[str, Any]]:
    """The stored buckets of time-series collection ``name``, oldest first.

    MongoDB 7.0 and 8.0 keep them in ``system.buckets.<name>`` (documented under "How
    Bucketing Works" and "System Collections"); servers with "viewless" time-series
    collections (8.2+) have no such namespace and return them for ``rawData: true``.
    """
    bucket_ns = f"system.buckets.{name}"
    if await db.list_collection_names(filter={"name": bucket_ns}):
        cursor = db[bucket_ns].find({}).sort([("control.min.ts", 1), ("meta.sensor_id", 1)])
        return list(await cursor.to_list())
    reply = await db.command(
        {
            "aggregate": name,
            "rawData": True,
            "cursor": {},
            "pipeline": [{"$sort": {"control.min.ts": 1, "meta.sensor_id": 1}}],
        }
    )
    return list(reply["cursor"]["firstBatch"])


def measurements(bucket: dict[str, Any]) -> int:
    """Readings in one stored bucket: ``control.count`` in compressed buckets (version 2
    and 3, the only kind 8.0 creates); in an uncompressed one (version 1, still written
    for open buckets by 7.0) the number of entries of the time field's data object."""
    control = bucket["control"]
    if "count" in control:
        return int(control["count"])
    return len(bucket["data"]["ts"])


def check_bucket_documents(docs: list[dict[str, Any]], cap: int) -> list[int]:
    """Each bucket-mode document agrees with its own readings; returns all stored seqs.

    Per document, not just in total: a ``$push`` and its ``$inc``/``$min``/``$max`` must
    have been applied together, whatever the concurrency.
    """
    seqs: list[int] = []
    for doc in docs:
        readings = doc["readings"]
        assert doc["count"] == len(readings), doc["_id"]
        assert 1 <= doc["count"] <= cap, doc["_id"]
        assert doc["schema_version"] == SCHEMA_VERSION
        values = [r["v"] for r in readings]
        stat = doc["stats"]["v"]
        assert stat["count"] == len(values)
        assert math.isclose(stat["sum"], math.fsum(values), rel_tol=0, abs_tol=1e-9)
        assert stat["min"] == min(values)
        assert stat["max"] == max(values)
        assert doc["first_ts"] == min(r["ts"] for r in readings)
        assert doc["last_ts"] == max(r["ts"] for r in readings)
        names = [[k for k in r if k not in ("ts", "seq")] for r in readings]
        assert doc["bytes"] == sum(41 + 10 * len(n) + sum(map(len, n)) for n in names)
        seqs.extend(int(r["seq"]) for r in readings)
    return seqs


async def write_all(writer: Any, batch: list[Reading]) -> None:
    """Write a batch as the pipeline would: retry only what failed transiently."""
    pending = batch
    for _ in range(100):
        outcome = await writer.write(writer.plan(pending))
        assert not outcome.refused, outcome.refused
        assert not getattr(outcome, "conflicts", None), outcome  # every reading is new
        if not outcome.retry:
            return
        pending = outcome.retry
        await asyncio.sleep(0.05)
    raise AssertionError(f"{len(pending)} readings still not written after 100 attempts")


async def write_conflicts(client: Any) -> int | None:
    """serverStatus ``metrics.operation.writeConflicts``, if the server reports it."""
    status = await client.admin.command("serverStatus")
    value = status.get("metrics", {}).get("operation", {}).get("writeConflicts")
    return None if value is None else int(value)


# --- time-series bucket internals ----------------------------------------------------------


@pytest.mark.real_mongodb
async def test_timeseries_stores_one_bucket_per_sensor_within_the_hour(db: Any) -> None:
    """Granularity "seconds": a sensor's readings within one hour share one bucket, and each
    sensor (metaField value) has its own. Docs: core/timeseries/timeseries-bucketing ("How
    Bucketing Works", bucket document limit 1000), core/timeseries/timeseries-limitations
    ("1000 measurements or 125KB"), core/timeseries/timeseries-automatic-removal
    (listCollections ``expireAfterSeconds``).
    """
    async with asyncio.timeout(TIME_LIMIT):
        t0 = hour_start(1)
        schema = schema_for(db, "readings", retention_days=2)
        writer = TimeseriesWriter(db.readings, schema)
        await writer.ensure_schema()
        sensors = ["a", "b", "c"]
        per_sensor = 30  # one a minute: far below the 1000-measurement and 125 KB limits
        written = [reading(s, t0 + 60 * i, i) for i in range(per_sensor) for s in sensors]
        for start in range(0, len(written), 25):  # several inserts, sensors interleaved
            await write_all(writer, written[start : start + 25])

        info = await collection_info(db, "readings")
        assert info["type"] == "timeseries"
        assert info["options"]["expireAfterSeconds"] == 2 * 86400
        assert info["options"]["timeseries"]["bucketMaxSpanSeconds"] == HOUR

        buckets = await raw_buckets(db, "readings")
        assert sorted(b["meta"]["sensor_id"] for b in buckets) == sensors  # one each
        last = t0 + 60 * (per_sensor - 1)
        for bucket in buckets:
            assert measurements(bucket) == per_sensor
            assert bucket["control"]["min"]["ts"] == at(t0)  # on the hour: rounding keeps it
            assert bucket["control"]["max"]["ts"] == at(last)
            assert bucket["control"]["min"]["v"] == 0.0
            assert bucket["control"]["max"]["v"] == (per_sensor - 1) * 0.5
        # collStats' ``timeseries`` document would say the same, but MongoDB documents it
        # as "data for internal diagnostic use": the stored buckets above are the check.
        assert await db.readings.count_documents({}) == len(written)


@pytest.mark.real_mongodb
@pytest.mark.parametrize(
    ("options", "step", "count", "starts"),
    [
        # granularity "seconds": a bucket spans at most one hour (bucketMaxSpanSeconds 3600)
        ({}, 300, 24, [0, HOUR]),
        # custom bucketing: span = rounding = 600 s, bucket starts rounded down to 600 s
        ({"custom_span": 600}, 60, 30, [0, 600, 1200]),
    ],
    ids=["granularity-seconds", "custom-600s"],
)
async def test_readings_beyond_the_bucket_span_open_new_buckets(
    db: Any, options: dict[str, Any], step: int, count: int, starts: list[int]
) -> None:
    """One sensor, readings in time order across more than bucketMaxSpanSeconds: a reading
    past the open bucket's span opens a new bucket whose minimum time is the reading's time
    rounded down by bucketRoundingSeconds. Docs: core/timeseries/timeseries-granularity
    ("Using Custom Bucketing Parameters": rounding, 1-31536000 s, no granularity with them),
    core/timeseries/timeseries-bucketing ("Closure": time moved past the covered span).
    """
    async with asyncio.timeout(TIME_LIMIT):
        t0 = hour_start(3)
        schema = schema_for(db, "readings", **options)
        writer = TimeseriesWriter(db.readings, schema)
        await writer.ensure_schema()
        offset = 30 if "custom_span" in options else 0  # not on a boundary: rounding shows
        written = [reading("a", t0 + offset + step * i, i) for i in range(count)]
        await write_all(writer, written[: count // 2])
        await write_all(writer, written[count // 2 :])

        span = options.get("custom_span", HOUR)
        info = await collection_info(db, "readings")
        assert info["type"] == "timeseries"
        assert info["options"]["timeseries"]["bucketMaxSpanSeconds"] == span
        if "custom_span" in options:
            assert info["options"]["timeseries"]["bucketRoundingSeconds"] == span
            assert "granularity" not in info["options"]["timeseries"]

        buckets = await raw_buckets(db, "readings")
        assert [b["control"]["min"]["ts"] for b in buckets] == [at(t0 + s) for s in starts]
        expected = [[r for r in written if t0 + s <= r.epoch < t0 + s + span] for s in starts]
        assert [measurements(b) for b in buckets] == [len(e) for e in expected]
        assert [b["control"]["max"]["ts"] for b in buckets] == [e[-1].ts for e in expected]
        assert sum(measurements(b) for b in buckets) == count
        # (collStats' ``timeseries`` counters are "for internal diagnostic use": not asserted.)


# --- storage figures -----------------------------------------------------------------------


@pytest.mark.real_mongodb
async def test_storage_figures_the_benchmark_reports_are_present_on_a_real_server(
    db: Any, mongo_uri: str, record_property: Any
) -> None:
    """The same readings in both layouts; loadgen's ``storage()`` (``$collStats``
    storageStats, on ``system.buckets.<name>`` for time-series) reports positive
    size/storageSize/totalIndexSize/avgObjSize and the right document counts, and dbStats
    has its size fields. Docs: reference/operator/aggregation/collStats (storageStats),
    reference/command/collStats (output fields), reference/command/dbStats.
    """
    async with asyncio.timeout(TIME_LIMIT):
        t0 = hour_start(1)
        written = [reading(s, t0 + 10 * i, i) for i in range(20) for s in ("a", "b", "c")]
        buckets = BucketWriter(db.buckets, schema_for(db, "buckets"), HOUR, 3600)
        series = TimeseriesWriter(db.readings, schema_for(db, "readings"))
        for writer in (buckets, series):
            await writer.ensure_schema()
            await write_all(writer, written)

        def figures() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
            with MongoClient[dict[str, Any]](mongo_uri, tz_aware=True) as client:
                sync_db = client[db.name]
                return (
                    storage(sync_db, "buckets", "bucket"),
                    storage(sync_db, "readings", "timeseries"),
                    dict(sync_db.command("dbStats")),
                )

        bucket_fig, series_fig, db_stats = await asyncio.to_thread(figures)
        record_property("storage_bucket", bucket_fig)
        record_property("storage_timeseries", series_fig)
        for fig in (bucket_fig, series_fig):
            for key in ("data_size", "storage_size", "total_index_size", "avg_document_size"):
                assert isinstance(fig[key], (int, float)), (key, fig)
                assert fig[key] > 0, (key, fig)
        assert bucket_fig["source"] == "buckets"
        assert bucket_fig["documents"] == 3  # one per sensor-hour
        assert series_fig["source"] == "system.buckets.readings"
        assert series_fig["documents"] == 3  # buckets, one per sensor
        assert series_fig["readings_documents"] == len(written)
        for key in ("dataSize", "storageSize", "indexSize", "totalSize"):
            assert db_stats[key] > 0, (key, db_stats)
        assert db_stats["totalSize"] == db_stats["storageSize"] + db_stats["indexSize"]
        assert db_stats["objects"] >= 6


# --- concurrency ---------------------------------------------------------------------------


@pytest.mark.real_mongodb
async def test_concurrent_writers_on_one_bucket_keep_every_document_exact(
    db: Any, mongo_uri: str, record_property: Any
) -> None:
    """Eight clients upsert into the same sensor-hour at once, in small batches, with a cap
    of 25 readings per document: every document's count, sum, min, max, first/last time
    and byte estimate match the readings it holds, none exceeds the cap, and every reading
    is stored exactly once. Docs: core/wiredtiger ("Document Level Concurrency": a write
    conflict makes MongoDB transparently retry the operation), core/write-operations-atomicity
    (a write is atomic on one document), reference/command/serverStatus
    (metrics.operation.writeConflicts, recorded, not asserted).
    """
    async with asyncio.timeout(TIME_LIMIT):
        t0 = hour_start(1)
        cap, writers_n, batches_n = 25, 8, 12
        clients = [
            AsyncMongoClient[dict[str, Any]](mongo_uri, tz_aware=True) for _ in range(writers_n)
        ]
        try:
            writers = [
                BucketWriter(c[db.name].buckets, schema_for(c[db.name], "buckets"), HOUR, cap)
                for c in clients
            ]
            await writers[0].ensure_schema()
            batches: list[list[list[Reading]]] = []
            seq = 0
            for w in range(writers_n):
                mine = []
                for b in range(batches_n):
                    size = 1 + (w + b) % 4  # 1..4 readings: many updates of one document
                    mine.append([reading("hot", t0 + seq + k, seq + k) for k in range(size)])
                    seq += size
                batches.append(mine)
            before = await write_conflicts(clients[0])
            go = asyncio.Event()

            async def run(w: int) -> None:
                await go.wait()
                for batch in batches[w]:
                    await write_all(writers[w], batch)

            tasks = [asyncio.create_task(run(w)) for w in range(writers_n)]
            go.set()
            await asyncio.gather(*tasks)
            after = await write_conflicts(clients[0])
        finally:
            for c in clients:
                await c.close()
        if before is not None and after is not None:
            record_property("server_write_conflicts", after - before)

        docs = await db.buckets.find({}).to_list()
        assert {(d["sensor_id"], d["bucket_start"]) for d in docs} == {("hot", at(t0))}
        seqs = check_bucket_documents(docs, cap)
        assert sorted(seqs) == list(range(seq))  # each reading once, none missing
        assert len(docs) >= -(-seq // cap)


@pytest.mark.real_mongodb
async def test_daemons_on_one_shared_subscription_fill_one_bucket_exactly(
    daemon: Callable[..., Daemon], publish: Any, topic_root: str, db: Any
) -> None:
    """Three real daemons share one subscription and write one sensor-hour in tiny batches
    (3 readings, cap 40 per document): the same per-document exactness as above, end to end.
    Docs: as the test above; MQTT 5 shared subscriptions split messages between the
    daemons (tested under the emulator by test_daemon.py).
    """
    async with asyncio.timeout(TIME_LIMIT + 30):
        group = f"g{topic_root}"
        cap, total = 40, 300
        procs = [
            daemon(
                "--shared-group",
                group,
                "--batch-size",
                "3",
                "--flush-interval",
                "0.05",
                "--bucket-max-readings",
                str(cap),
                client_id=f"{group}-{i}",
            )
            for i in range(3)
        ]
        t0 = hour_start(1)
        await publish(
            [
                (f"{topic_root}/hot/readings", orjson.dumps({"ts": t0 + i, "seq": i, "v": i * 0.5}))
                for i in range(total)
            ]
        )
        await eventually(
            lambda: sum(p.metric("ingest_messages_acked_total") for p in procs) == total,
            timeout=TIME_LIMIT,
        )
        assert all(p.metric("ingest_messages_received_total") > 0 for p in procs)
        docs = await db.buckets.find({}).to_list()
        assert {(d["sensor_id"], d["bucket_start"]) for d in docs} == {("hot", at(t0))}
        assert sorted(check_bucket_documents(docs, cap)) == list(range(total))


# --- validator -----------------------------------------------------------------------------


@pytest.mark.real_mongodb
async def test_the_bucket_validator_refuses_malformed_documents_and_updates(db: Any) -> None:
    """The $jsonSchema validator (validationLevel strict, validationAction error) refuses
    inserts and updates that break it, with code 121 and the failing rule in
    errInfo.details. Docs: core/schema-validation (and "Specify JSON Schema Validation":
    bsonType "int"/"long" excludes doubles), core/schema-validation/handle-invalid-documents,
    reference/command/listCollections (options.validator, validationLevel, validationAction).
    """
    async with asyncio.timeout(TIME_LIMIT):
        await schema_for(db, "buckets").ensure_buckets()
        info = await collection_info(db, "buckets")
        assert info["type"] == "collection"
        assert info["options"]["validator"] == BUCKET_VALIDATOR  # round-trips: no collMod
        assert info["options"]["validationLevel"] == "strict"
        assert info["options"]["validationAction"] == "error"

        now = at(hour_start(0))
        good = {
            "sensor_id": "a",
            "tags": {},
            "bucket_start": now,
            "count": 1,
            "bytes": 52,
            "first_ts": now,
            "last_ts": now,
            "readings": [{"ts": now, "seq": 0, "v": 1.0}],
            "stats": {"v": {"count": 1, "sum": 1.0, "min": 1.0, "max": 1.0}},
            "schema_version": 2,
        }
        await db.buckets.insert_one(dict(good))
        bad: dict[str, dict[str, Any]] = {
            "count 0": {"count": 0},
            "count a double": {"count": 1.0},
            "count a string": {"count": "1"},
            "bytes 0": {"bytes": 0},
            "sensor_id with a control character": {"sensor_id": "bad\x01id"},
            "tags a string": {"tags": "a=b"},
            "schema_version of an earlier shape": {"schema_version": 1},
            "bucket_start a string": {"bucket_start": now.isoformat()},
            "readings an object": {"readings": {}},
            "stats an array": {"stats": []},
            "schema_version a double": {"schema_version": 1.5},
        }
        for why, change in bad.items():
            with pytest.raises(WriteError) as caught:
                await db.buckets.insert_one({**good, **change})
            assert caught.value.code == 121, why
            details = (caught.value.details or {}).get("errInfo", {}).get("details", {})
            assert details.get("operatorName") == "$jsonSchema", (why, caught.value.details)
        for field in BUCKET_VALIDATOR["$jsonSchema"]["required"]:
            with pytest.raises(WriteError) as caught:
                await db.buckets.insert_one({k: v for k, v in good.items() if k != field})
            assert caught.value.code == 121, field
        for update in (
            {"$set": {"count": 0}},
            {"$unset": {"stats": ""}},
            {"$set": {"last_ts": "later"}},
        ):
            with pytest.raises(WriteError) as caught:
                await db.buckets.update_one({"sensor_id": "a"}, update)
            assert caught.value.code == 121, update
        assert await db.buckets.count_documents({}) == 1
        assert await db.buckets.find_one({}, {"_id": 0}) == good


# --- the schema code against what a real server reports ------------------------------------


class CommandNames(monitoring.CommandListener):
    """Records the name of every command a client starts."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.names.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest.mark.real_mongodb
@pytest.mark.parametrize("mode", ["bucket", "timeseries"])
async def test_restarting_sends_no_collmod_when_nothing_changed(
    mongo_uri: str, db: Any, mode: str
) -> None:
    """What we compare (validator, expireAfterSeconds, time-series options) equals what a
    real server reports back, so a restart changes nothing: a daemon needs the collMod
    privilege (dbAdmin, not readWrite) only when the configuration really changed.
    Docs: reference/command/listCollections, core/timeseries/timeseries-granularity
    ("Retrieve the Current Bucketing Parameters": derived bucketMaxSpanSeconds),
    reference/built-in-roles (readWrite has no collMod).
    """
    async with asyncio.timeout(TIME_LIMIT):
        listener = CommandNames()
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            mongo_uri, tz_aware=True, event_listeners=[listener]
        )
        try:
            cdb = client[db.name]
            for _ in range(2):
                schema = schema_for(cdb, "data", retention_days=7)
                if mode == "bucket":
                    await schema.ensure_buckets()
                else:
                    await schema.ensure_timeseries()
        finally:
            await client.close()
        assert "collMod" not in listener.names, listener.names
        assert listener.names.count("create") == 2  # the collection and rejects, once each


@pytest.mark.real_mongodb
async def test_changed_retention_changes_expire_after_seconds_of_the_timeseries_collection(
    db: Any,
) -> None:
    """Retention added, then changed, on an existing time-series collection goes through
    collMod expireAfterSeconds and is reported by listCollections. (The TTL index of bucket
    mode is covered by test_bucket_writer.py.) Docs:
    core/timeseries/timeseries-automatic-removal ("Enable Automatic Removal", "Change the
    expireAfterSeconds Parameter", "Retrieve the Current Value").
    """
    async with asyncio.timeout(TIME_LIMIT):
        await schema_for(db, "readings").ensure_timeseries()
        assert "expireAfterSeconds" not in (await collection_info(db, "readings"))["options"]
        for days in (2, 5):
            await schema_for(db, "readings", retention_days=days).ensure_timeseries()
            info = await collection_info(db, "readings")
            assert info["options"]["expireAfterSeconds"] == days * 86400


@pytest.mark.real_mongodb
async def test_an_older_bucket_validator_is_replaced_through_collmod(db: Any) -> None:
    """A bucket collection created with an older validator gets the current one, strict.
    Docs: reference/command/collMod (validator, validationLevel, validationAction)."""
    async with asyncio.timeout(TIME_LIMIT):
        old = {"$jsonSchema": {"bsonType": "object", "required": ["sensor_id"]}}
        await db.command(
            {
                "create": "buckets",
                "validator": old,
                "validationLevel": "moderate",
                "validationAction": "warn",
            }
        )
        await schema_for(db, "buckets").ensure_buckets()
        options = (await collection_info(db, "buckets"))["options"]
        assert options["validator"] == BUCKET_VALIDATOR
        assert options["validationLevel"] == "strict"
        assert options["validationAction"] == "error"
        with pytest.raises(WriteError) as caught:
            await db.buckets.insert_one({"sensor_id": "a"})
        assert caught.value.code == 121


@pytest.mark.real_mongodb
async def test_granularity_with_other_custom_bucketing_is_refused(db: Any) -> None:
    """Custom bucketing parameters must be equal and come without granularity; we never
    send both (Schema.timeseries_options). Docs: core/timeseries/timeseries-granularity
    ("set both parameters to the same value, and do not set granularity"),
    reference/command/create (timeseries options)."""
    async with asyncio.timeout(TIME_LIMIT):
        with pytest.raises(OperationFailure):
            await db.command(
                {
                    "create": "mixed",
                    "timeseries": {
                        "timeField": "ts",
                        "metaField": "meta",
                        "granularity": "seconds",
                        "bucketMaxSpanSeconds": 600,
                        "bucketRoundingSeconds": 600,
                    },
                }
            )
        with pytest.raises(OperationFailure):
            await db.command(
                {
                    "create": "unequal",
                    "timeseries": {
                        "timeField": "ts",
                        "bucketMaxSpanSeconds": 600,
                        "bucketRoundingSeconds": 60,
                    },
                }
            )
        assert "mixed" not in await db.list_collection_names()
        assert schema_for(db, "x", custom_span=600).timeseries_options() == {
            "timeField": "ts",
            "metaField": "meta",
            "bucketMaxSpanSeconds": 600,
            "bucketRoundingSeconds": 600,
        }

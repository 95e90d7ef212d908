"""Bucket mode: coalesced upserts, the size cap, late data, exact statistics.

The first tests check the operations built for a batch (no I/O); the rest send them
through the real driver to MongoDB (the emulator, or a real server when configured).
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import bson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.errors import SchemaError
from ingest.model import Reading, Scalar
from ingest.store.schema import BUCKET_INDEX, BUCKET_TTL_INDEX, READINGS_INDEX, Schema
from ingest.store.writers.bucket import BucketWriter, reading_bytes, ts_key
from tests.support.mongo import stored_values

HOUR = 3600
T0 = 1_790_000_000 // HOUR * HOUR  # an hour boundary


def reading(sensor: str, epoch: float, **values: Scalar) -> Reading:
    return Reading(sensor, datetime.fromtimestamp(epoch, UTC), epoch, values or {"v": 1.0})


def writer_for(
    db: Any, name: str = "buckets", max_readings: int = 3600, retention_days: float | None = None
) -> BucketWriter:
    schema = Schema(
        db,
        name,
        rejects_collection="rejects",
        rejects_max_bytes=1 << 20,
        retention_days=retention_days,
        span_seconds=HOUR,
    )
    return BucketWriter(db[name], schema, HOUR, max_readings)


# --- the operations a batch becomes ---------------------------------------------------------

NO_DB: Any = defaultdict(lambda: None)  # plan() builds operations without touching a database


def test_one_update_per_sensor_hour() -> None:
    batch = [
        reading("a", T0 + 1),
        reading("b", T0 + 2),
        reading("a", T0 + 3),
        reading("a", T0 + HOUR + 1),
        reading("b", T0 + 4),
    ]
    plan = writer_for(NO_DB).plan(batch)
    assert len(plan.ops) == 3
    keys = [(op["q"]["sensor_id"], op["q"]["bucket_start"]) for op in plan.ops]
    start = datetime.fromtimestamp(T0, UTC)
    later = datetime.fromtimestamp(T0 + HOUR, UTC)
    assert keys == [("a", start), ("b", start), ("a", later)]
    assert [len(g) for g in plan.groups] == [2, 2, 1]
    first = plan.ops[0]["u"]
    assert first["$inc"]["count"] == 2
    assert [r["ts"] for r in first["$push"]["readings"]["$each"]] == [batch[0].ts, batch[2].ts]
    assert first["$setOnInsert"] == {"schema_version": 2}
    assert all(op["q"]["tags"] == {} for op in plan.ops)
    assert plan.ops[0]["upsert"] is True


def test_late_reading_goes_to_the_bucket_of_its_own_hour() -> None:
    plan = writer_for(NO_DB).plan([reading("a", T0 + 10), reading("a", T0 - 5)])
    starts = sorted(op["q"]["bucket_start"] for op in plan.ops)
    assert starts == [datetime.fromtimestamp(T0 - HOUR, UTC), datetime.fromtimestamp(T0, UTC)]


def test_group_larger_than_the_cap_is_split_and_each_filter_leaves_room() -> None:
    batch = [reading("a", T0 + i) for i in range(12)]
    plan = writer_for(NO_DB, max_readings=5).plan(batch)
    assert [len(g) for g in plan.groups] == [5, 5, 2]
    assert [op["q"]["count"] for op in plan.ops] == [{"$lte": 0}, {"$lte": 0}, {"$lte": 3}]
    assert all(op["q"]["bytes"]["$lte"] > 0 for op in plan.ops)


def test_statistics_of_one_update() -> None:
    batch = [
        reading("a", T0 + 1, temp=22.5, hum=40),
        reading("a", T0 + 2, temp=21.0),
        reading("a", T0 + 3, temp=23.5, hum=41),
    ]
    op = writer_for(NO_DB).plan(batch).ops[0]["u"]
    assert op["$inc"] == {
        "count": 3,
        "bytes": sum(reading_bytes(r) for r in batch),
        "stats.temp.count": 3,
        "stats.temp.sum": 67.0,
        "stats.hum.count": 2,
        "stats.hum.sum": 81.0,
    }
    assert op["$min"]["stats.temp.min"] == 21.0
    assert op["$max"]["stats.temp.max"] == 23.5
    assert op["$min"]["stats.hum.min"] == 40
    assert op["$max"]["stats.hum.max"] == 41
    assert op["$min"]["first_ts"] == batch[0].ts
    assert op["$max"]["last_ts"] == batch[2].ts


# --- through the driver -------------------------------------------------------------------

values = st.one_of(
    st.integers(-(10**6), 10**6), st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)
)
readings_st = st.lists(
    st.builds(
        lambda s, dt, v, w: Reading(
            s,
            datetime.fromtimestamp(T0 + dt, UTC),
            T0 + dt,
            {"v": v} if w is None else {"v": v, "w": w},
        ),
        st.sampled_from(["a", "b", "c"]),
        st.integers(-HOUR, 2 * HOUR - 1),
        values,
        st.none() | values,
    ),
    min_size=1,
    max_size=25,
)


async def expected_vs_stored(coll: Any, written: list[Reading]) -> None:
    expected: dict[tuple[str, datetime], list[Reading]] = defaultdict(list)
    for r in written:
        expected[(r.sensor_id, datetime.fromtimestamp(r.epoch // HOUR * HOUR, UTC))].append(r)
    docs = await coll.find({}).to_list()
    stored: dict[tuple[str, datetime], list[dict[str, Any]]] = defaultdict(list)
    for doc in docs:
        stored[(doc["sensor_id"], doc["bucket_start"])].append(doc)
        assert doc["count"] == len(doc["readings"])
    assert stored.keys() == expected.keys()
    for key, group in expected.items():
        parts = stored[key]
        assert sum(d["count"] for d in parts) == len(group)
        assert min(d["first_ts"] for d in parts) == min(r.ts for r in group).replace(
            microsecond=min(r.ts for r in group).microsecond // 1000 * 1000
        )
        for name in ("v", "w"):
            given_vals = [r.values[name] for r in group if name in r.values]
            vals = [v for v in given_vals if isinstance(v, int | float)]
            assert vals == given_vals  # numbers only: bucket statistics are over numbers
            if not vals:
                assert all(name not in d["stats"] for d in parts)
                continue
            stats = [d["stats"][name] for d in parts if name in d["stats"]]
            assert sum(s["count"] for s in stats) == len(vals)
            assert math.isclose(
                sum(s["sum"] for s in stats), math.fsum(vals), rel_tol=1e-9, abs_tol=1e-6
            )
            assert min(s["min"] for s in stats) == min(vals)
            assert max(s["max"] for s in stats) == max(vals)
            stored_vals = sorted(x[name] for d in parts for x in d["readings"] if name in x)
            assert stored_vals == sorted(vals)


def first_of_each_ts(readings: list[Reading]) -> list[Reading]:
    """What bucket mode stores: the first reading of each sensor and millisecond."""
    first: dict[tuple[str, int], Reading] = {}
    for r in readings:
        first.setdefault((r.sensor_id, ts_key(r.ts)), r)
    return list(first.values())


# Each example is a round trip to the store: a count of its own, not the profile's.
@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.lists(readings_st, min_size=1, max_size=4),
    cap=st.sampled_from([3, 10, 3600]),
    replays=st.lists(st.integers(0, 3), max_size=3),
)
async def test_stats_equal_what_the_readings_imply_after_many_batches_and_replays(
    db: Any, batches: list[list[Reading]], cap: int, replays: list[int]
) -> None:
    """Arbitrary batches, some written again (as after a crash or a retried write): each
    sensor keeps the first reading of each timestamp, counted once; a repeat is a
    duplicate if its values are the same, a conflict otherwise."""
    writer = writer_for(db, f"b{uuid.uuid4().hex[:8]}", max_readings=cap)
    await writer.ensure_schema()
    sent = batches + [batches[i] for i in replays if i < len(batches)]
    seen: dict[tuple[str, int], Reading] = {}
    for batch in sent:
        outcome = await writer.write(writer.plan(batch))
        new = dups = conflicts = 0
        for r in batch:
            key = (r.sensor_id, ts_key(r.ts))
            first = seen.get(key)
            if first is None:
                seen[key] = r
                new += 1
            elif first.values == r.values:
                dups += 1
            else:
                conflicts += 1
        assert (outcome.written, outcome.duplicates, len(outcome.conflicts)) == (
            new,
            dups,
            conflicts,
        )
        assert not outcome.retry
        assert not outcome.refused
    coll = db[writer._collection.name]
    await expected_vs_stored(coll, first_of_each_ts([r for b in sent for r in b]))
    assert await coll.count_documents({"count": {"$gt": cap}}) == 0


async def test_a_write_repeated_after_it_filled_its_document_is_not_stored_again(db: Any) -> None:
    """The retry of a write whose first attempt landed (and filled its document) would
    start a new document: the unique index refuses it, and nothing is counted twice."""
    writer = writer_for(db, max_readings=5)
    await writer.ensure_schema()
    batch = [reading("a", T0 + i, v=float(i)) for i in range(5)]
    assert (await writer.write(writer.plan(batch))).written == 5
    again = await writer.write(writer.plan(batch))
    assert (again.written, again.duplicates, again.conflicts) == (0, 5, [])
    docs = await db.buckets.find({}).to_list()
    assert [(d["count"], d["stats"]["v"]["sum"]) for d in docs] == [(5, 10.0)]


async def test_a_redelivery_mixed_with_new_readings_writes_only_the_new_ones(db: Any) -> None:
    writer = writer_for(db, max_readings=4)
    await writer.ensure_schema()
    old = [reading("a", T0 + i, v=1.0) for i in range(3)]
    await writer.write(writer.plan(old))
    new = [reading("a", T0 + 10 + i, v=2.0) for i in range(3)]
    outcome = await writer.write(writer.plan([*new[:1], *old, *new[1:]]))
    assert (outcome.written, outcome.duplicates) == (3, 3)
    await expected_vs_stored(db.buckets, old + new)
    assert await db.buckets.count_documents({"count": {"$gt": 4}}) == 0


async def test_another_reading_at_a_stored_time_is_refused_as_a_conflict(db: Any) -> None:
    writer = writer_for(db)
    await writer.ensure_schema()
    await writer.write(writer.plan([reading("a", T0 + 1, v=1.0)]))
    late = reading("a", T0 + 1, v=9.0)
    same_batch = [
        reading("b", T0 + 2, v=1.0),
        reading("b", T0 + 2, v=2.0),
        reading("b", T0 + 2, v=1.0),
    ]
    outcome = await writer.write(writer.plan([late, *same_batch]))
    assert outcome.written == 1
    assert outcome.duplicates == 1
    assert [(r.sensor_id, r.values) for r, _ in outcome.conflicts] == [
        ("a", {"v": 9.0}),
        ("b", {"v": 2.0}),
    ]
    assert "a already has v=1.0 at" in outcome.conflicts[0][1]
    assert await stored_values(db, "bucket", "v") == [1.0, 1.0]


async def test_the_unique_index_is_not_built_over_readings_stored_twice(db: Any) -> None:
    """A collection written without the index (an older version) and holding a reading
    twice is refused with one line instead of being written into without the guard."""
    writer = writer_for(db)
    await writer.ensure_schema()
    await writer.write(writer.plan([reading("a", T0 + 1)]))
    await db.buckets.drop_index(READINGS_INDEX)
    await db.buckets.insert_one(await db.buckets.find_one({}, {"_id": 0}))
    with pytest.raises(SchemaError, match="holds a reading twice"):
        await writer.ensure_schema()


async def test_bucket_overflow_starts_new_documents_never_above_the_cap(db: Any) -> None:
    writer = writer_for(db, max_readings=5)
    await writer.ensure_schema()
    written = []
    for i in range(4):  # 4 batches of 3 readings for the same sensor-hour
        batch = [reading("a", T0 + 3 * i + j, v=float(j)) for j in range(3)]
        await writer.write(writer.plan(batch))
        written += batch
    docs = await db.buckets.find({}).to_list()
    assert all(d["count"] <= 5 for d in docs)
    assert sum(d["count"] for d in docs) == 12
    assert {d["bucket_start"] for d in docs} == {datetime.fromtimestamp(T0, UTC)}
    await expected_vs_stored(db.buckets, written)


async def test_concurrent_writers_keep_counts_exact_and_under_the_cap(
    mongo_uri: str, db: Any
) -> None:
    """Several daemons update the same sensor-hour at once: the cap and the sums hold."""
    from pymongo import AsyncMongoClient  # noqa: PLC0415

    clients: list[AsyncMongoClient[dict[str, Any]]] = [
        AsyncMongoClient(mongo_uri, tz_aware=True) for _ in range(3)
    ]
    try:
        writers = [writer_for(c[db.name], max_readings=7) for c in clients]
        await writers[0].ensure_schema()
        batches = [
            [reading("a", T0 + 10 * w + i, v=float(w * 100 + i)) for i in range(4)]
            for w in range(12)
        ]

        async def run(w: int) -> None:
            writer = writers[w % 3]
            await writer.write(writer.plan(batches[w]))

        await asyncio.gather(*(run(w) for w in range(12)))
    finally:
        for c in clients:
            await c.close()
    docs = await db.buckets.find({}).to_list()
    assert all(d["count"] <= 7 for d in docs)
    await expected_vs_stored(db.buckets, [r for b in batches for r in b])


async def test_a_refused_update_does_not_stop_the_others(db: Any) -> None:
    """The validator refuses one operation; the rest of the unordered bulk is applied."""
    writer = writer_for(db)
    await writer.ensure_schema()
    bad = reading("bad\x01id", T0 + 1)  # bypasses decode; the validator's pattern refuses it
    good = [reading("a", T0 + 1), reading("b", T0 + 2)]
    outcome = await writer.write(writer.plan([good[0], bad, good[1]]))
    assert outcome.written == 2
    assert [r for r, _ in outcome.refused] == [bad]
    assert "121" in outcome.refused[0][1]
    assert not outcome.retry
    assert sorted(d["sensor_id"] for d in await db.buckets.find({}).to_list()) == ["a", "b"]


async def test_schema_is_idempotent_with_validator_index_ttl_and_capped_rejects(db: Any) -> None:
    writer = writer_for(db, retention_days=7)
    await writer.ensure_schema()
    await writer.ensure_schema()
    indexes = await db.buckets.index_information()
    assert indexes[BUCKET_INDEX]["key"] == [("sensor_id", 1), ("tags", 1), ("bucket_start", 1)]
    assert not indexes[BUCKET_INDEX].get("unique")
    assert indexes[READINGS_INDEX]["key"] == [("sensor_id", 1), ("tags", 1), ("readings.ts", 1)]
    assert indexes[READINGS_INDEX]["unique"] is True
    assert indexes[BUCKET_TTL_INDEX]["expireAfterSeconds"] == 7 * 86400 + HOUR
    options = await db.buckets.options()
    assert "$jsonSchema" in options["validator"]
    assert (await db.rejects.options())["capped"] is True
    with pytest.raises(Exception, match="validation"):
        await db.buckets.insert_one({"sensor_id": "x"})


@pytest.mark.real_mongodb  # the emulator has no collMod
async def test_changed_retention_updates_the_ttl_index(db: Any) -> None:
    await writer_for(db, retention_days=7).ensure_schema()
    await writer_for(db, retention_days=30).ensure_schema()
    indexes = await db.buckets.index_information()
    assert indexes[BUCKET_TTL_INDEX]["expireAfterSeconds"] == 30 * 86400 + HOUR


async def test_documents_also_stay_under_a_byte_budget(db: Any, monkeypatch: Any) -> None:
    """Wide readings fill a document by size before they reach the count cap."""
    from ingest.store.writers import bucket  # noqa: PLC0415

    monkeypatch.setattr(bucket, "MAX_BUCKET_BYTES", 4000)
    writer = writer_for(db)
    await writer.ensure_schema()
    wide: dict[str, Scalar] = {
        f"measurement_{i:03d}": float(i) for i in range(20)
    }  # ~ 500 estimated bytes
    written = []
    for b in range(3):
        batch = [
            Reading("a", datetime.fromtimestamp(T0 + 10 * b + i, UTC), T0 + 10 * b + i, wide)
            for i in range(7)
        ]
        await writer.write(writer.plan(batch))
        written += batch
    docs = await db.buckets.find({}).to_list()
    assert all(d["bytes"] <= 4000 for d in docs)
    assert len(docs) >= 21 * bucket.reading_bytes(written[0]) // 4000
    assert sum(d["count"] for d in docs) == 21
    await expected_vs_stored(db.buckets, written)


async def test_thousands_of_names_count_their_statistics_in_the_byte_budget(
    db: Any, monkeypatch: Any
) -> None:
    """A sensor whose readings each bring new measurement names grows by its ``stats`` as
    much as by its readings: every document's real BSON size stays within twice the
    budget (the margin MongoDB's 16 MiB limit has over the 8 MiB budget)."""
    from ingest.store.writers import bucket  # noqa: PLC0415

    budget = 16_384
    monkeypatch.setattr(bucket, "MAX_BUCKET_BYTES", budget)
    writer = writer_for(db)
    await writer.ensure_schema()
    readings = [
        Reading(
            "a",
            None,
            T0 + i / 10,
            {f"n{3 * i + k:04d}": 1.0 for k in range(3)},
            None,
            T0 * 1000 + i * 100,
        )
        for i in range(1000)
    ]
    for start in range(0, len(readings), 250):
        outcome = await writer.write(writer.plan(readings[start : start + 250]))
        assert outcome.written == 250
    docs = await db.buckets.find({}).to_list()
    assert sum(d["count"] for d in docs) == 1000
    assert len({name for d in docs for name in d["stats"]}) == 3000
    assert max(len(bson.encode(d)) for d in docs) <= 2 * budget
    assert all(d["bytes"] <= budget for d in docs)


def test_a_reading_larger_than_the_budget_goes_alone_and_the_server_decides() -> None:
    from ingest.store.writers.bucket import MAX_BUCKET_BYTES, chunks  # noqa: PLC0415

    huge = Reading(
        "a",
        datetime.fromtimestamp(T0, UTC),
        T0,
        {f"m{i:06d}": 1.0 for i in range(MAX_BUCKET_BYTES // 17 + 1)},
    )
    small = reading("a", T0 + 1)
    assert [len(c) for c, _ in chunks([small, huge, small], 3600)] == [1, 1, 1]

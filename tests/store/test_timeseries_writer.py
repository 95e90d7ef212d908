"""Time-series mode: collection options, refusing the wrong collection, documents, writes."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import pytest

from ingest.errors import SchemaError
from ingest.model import Reading, Scalar
from ingest.store.schema import TIMESERIES_INDEX, Schema
from ingest.store.writers import Plan
from ingest.store.writers.timeseries import TimeseriesWriter, reading_document
from tests.support.procs import ROOT

T0 = 1_790_000_000.0


def reading(sensor: str, epoch: float, seq: int | None = None, **values: Scalar) -> Reading:
    return Reading(sensor, datetime.fromtimestamp(epoch, UTC), epoch, values or {"v": 1.0}, seq)


def schema_for(
    db: Any,
    *,
    granularity: str = "seconds",
    span: int | None = None,
    retention_days: float | None = None,
    name: str = "readings",
) -> Schema:
    return Schema(
        db,
        name,
        rejects_collection="rejects",
        rejects_max_bytes=1 << 20,
        retention_days=retention_days,
        span_seconds=3600,
        granularity=granularity,
        custom_span=span,
    )


def test_document_has_stable_field_order_and_no_empty_fields() -> None:
    doc = reading_document(reading("s1", T0, seq=4, temp=21.5, hum=40, co2=400))
    assert list(doc) == ["ts", "meta", "seq", "co2", "hum", "temp"]
    assert doc["meta"] == {"sensor_id": "s1"}
    assert "seq" not in reading_document(reading("s1", T0, temp=1.0))


def test_plan_sorts_by_sensor_then_time() -> None:
    batch = [reading("b", T0 + 2), reading("a", T0 + 5), reading("b", T0 + 1), reading("a", T0 + 3)]
    plan = TimeseriesWriter(None, None).plan(batch)  # type: ignore[arg-type]
    assert [(d["meta"]["sensor_id"], d["ts"].timestamp()) for d in plan.ops] == [
        ("a", T0 + 3),
        ("a", T0 + 5),
        ("b", T0 + 1),
        ("b", T0 + 2),
    ]
    assert [g[0] for g in plan.groups] == sorted(batch, key=lambda r: (r.sensor_id, r.epoch))


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, {"timeField": "ts", "metaField": "meta", "granularity": "seconds"}),
        (
            {"granularity": "hours"},
            {"timeField": "ts", "metaField": "meta", "granularity": "hours"},
        ),
        (
            {"span": 600},
            {
                "timeField": "ts",
                "metaField": "meta",
                "bucketMaxSpanSeconds": 600,
                "bucketRoundingSeconds": 600,
            },
        ),
    ],
)
async def test_collection_is_created_with_the_configured_options(
    db: Any, kwargs: dict[str, Any], expected: dict[str, Any]
) -> None:
    schema = schema_for(db, retention_days=2, **kwargs)
    await schema.ensure_timeseries()
    await schema.ensure_timeseries()  # idempotent
    options = await db.readings.options()
    for key, value in expected.items():
        assert options["timeseries"][key] == value
    assert "granularity" not in options["timeseries"] or "span" not in kwargs
    assert options["expireAfterSeconds"] == 2 * 86400
    index = (await db.readings.index_information())[TIMESERIES_INDEX]
    assert index["key"] == [("meta.sensor_id", 1), ("ts", 1)]
    assert (await db.rejects.options())["capped"] is True


async def test_a_regular_collection_of_that_name_is_refused(db: Any) -> None:
    await db.readings.insert_one({"not": "a time-series collection"})
    with pytest.raises(SchemaError, match="not a time-series collection"):
        await schema_for(db).ensure_timeseries()
    assert await db.readings.count_documents({}) == 1


async def test_a_time_series_collection_with_other_options_is_refused(db: Any) -> None:
    await schema_for(db, granularity="minutes").ensure_timeseries()
    with pytest.raises(SchemaError, match="granularity is 'minutes', configured 'seconds'"):
        await schema_for(db).ensure_timeseries()
    with pytest.raises(SchemaError, match="bucketMaxSpanSeconds"):
        await schema_for(db, span=600).ensure_timeseries()


async def test_bucket_mode_refuses_a_time_series_collection(db: Any) -> None:
    await schema_for(db, name="buckets").ensure_timeseries()
    with pytest.raises(SchemaError, match="not a regular collection"):
        await schema_for(db, name="buckets").ensure_buckets()


def test_init_db_on_the_wrong_kind_of_collection_exits_non_zero_with_one_line(
    mongo_uri: str, db_name: str
) -> None:
    from pymongo import MongoClient  # noqa: PLC0415

    with MongoClient[dict[str, Any]](mongo_uri) as client:
        client[db_name].readings.insert_one({"x": 1})
        try:
            result = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "ingest",
                    "init-db",
                    "--mode",
                    "timeseries",
                    "--mongodb-uri",
                    mongo_uri,
                    "--db",
                    db_name,
                ],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=ROOT,
                check=False,
            )
        finally:
            client.drop_database(db_name)
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "is not a time-series collection" in lines[0]
    assert "Traceback" not in result.stderr


async def test_readings_are_written_one_document_each(db: Any) -> None:
    schema = schema_for(db)
    writer = TimeseriesWriter(db.readings, schema)
    await writer.ensure_schema()
    batch = [reading("a", T0 + i, seq=i, temp=20.0 + i) for i in range(5)]
    outcome = await writer.write(writer.plan(batch))
    assert outcome.written == 5
    assert not outcome.retry
    assert not outcome.refused
    assert sorted(d["seq"] for d in await db.readings.find({}).to_list()) == list(range(5))


@pytest.mark.real_mongodb  # the emulator accepts a time-series document without its time field
async def test_a_refused_document_does_not_stop_the_others(db: Any) -> None:
    writer = TimeseriesWriter(db.readings, schema_for(db))
    await writer.ensure_schema()
    good = [reading("a", T0 + 1), reading("a", T0 + 2)]
    bad = reading("a", T0 + 3)
    plan = Plan(
        [
            reading_document(good[0]),
            {"meta": {"sensor_id": "a"}, "v": 1.0},
            reading_document(good[1]),
        ],
        [[good[0]], [bad], [good[1]]],
    )
    outcome = await writer.write(plan)
    assert outcome.written == 2
    assert [r for r, _ in outcome.refused] == [bad]
    assert await db.readings.count_documents({}) == 2

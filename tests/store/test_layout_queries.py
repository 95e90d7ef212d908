"""The documented queries give the same answers in both storage modes."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ingest.model import Reading, Scalar
from ingest.store import layout_queries
from ingest.store.schema import Schema
from ingest.store.writers.bucket import BucketWriter
from ingest.store.writers.timeseries import TimeseriesWriter

START = datetime(2026, 5, 1, 8, tzinfo=UTC)


def fleet() -> list[Reading]:
    rng = random.Random(7)
    out = []
    for sensor in ("s1", "s2", "s3"):
        for i in range(90):  # 3 hours, one reading every 2 minutes, shuffled below
            ts = START + timedelta(seconds=120 * i + rng.randint(0, 59))
            values: dict[str, Scalar] = {"temp": round(rng.uniform(15, 25), 2)}
            if i % 3 == 0:
                values["hum"] = rng.randint(30, 60)
            out.append(Reading(sensor, ts, ts.timestamp(), values, i))
    rng.shuffle(out)
    return out


def number(value: Scalar) -> float:
    """A measurement that fleet() wrote as a number."""
    assert isinstance(value, int | float)
    return value


async def write_both(db: Any, readings: list[Reading]) -> None:
    schema = Schema(
        db,
        "buckets",
        rejects_collection="rejects",
        rejects_max_bytes=1 << 20,
        retention_days=None,
        span_seconds=3600,
    )
    bucket = BucketWriter(db.buckets, schema, 3600, max_readings=20)  # forces overflow docs
    ts_schema = Schema(
        db,
        "readings",
        rejects_collection="rejects",
        rejects_max_bytes=1 << 20,
        retention_days=None,
        span_seconds=3600,
    )
    series = TimeseriesWriter(db.readings, ts_schema)
    await bucket.ensure_schema()
    await series.ensure_schema()
    for i in range(0, len(readings), 50):
        for writer in (bucket, series):
            outcome = await writer.write(writer.plan(readings[i : i + 50]))
            assert outcome.written == len(readings[i : i + 50])


async def test_recent_readings_of_one_sensor_match(db: Any) -> None:
    readings = fleet()
    await write_both(db, readings)
    since, until = START + timedelta(minutes=50), START + timedelta(minutes=110)
    bucket = await (
        await db.buckets.aggregate(layout_queries.recent_bucket("s2", since, until))
    ).to_list()
    series = await (
        await db.readings.aggregate(layout_queries.recent_timeseries("s2", since, until))
    ).to_list()
    expected = sorted(
        (r for r in readings if r.sensor_id == "s2" and since <= r.ts < until),
        key=lambda r: r.epoch,
    )
    assert [d["seq"] for d in bucket] == [r.seq for r in expected]
    assert [d["seq"] for d in series] == [r.seq for r in expected]
    assert [d["temp"] for d in bucket] == [d["temp"] for d in series]


async def test_hourly_statistics_of_all_sensors_match(db: Any) -> None:
    readings = fleet()
    await write_both(db, readings)
    since, until = START, START + timedelta(hours=3)
    bucket = await (
        await db.buckets.aggregate(layout_queries.hourly_bucket("hum", since, until))
    ).to_list()
    series = await (
        await db.readings.aggregate(layout_queries.hourly_timeseries("hum", since, until))
    ).to_list()
    assert len(bucket) == len(series) == 9  # 3 sensors x 3 hours
    for b, s in zip(bucket, series, strict=True):
        assert (b["sensor_id"], b["hour"], b["count"], b["min"], b["max"]) == (
            s["sensor_id"],
            s["hour"],
            s["count"],
            s["min"],
            s["max"],
        )
        assert math.isclose(b["avg"], s["avg"], rel_tol=1e-12)
        group = [
            number(r.values["hum"])
            for r in readings
            if r.sensor_id == b["sensor_id"]
            and b["hour"] <= r.ts < b["hour"] + timedelta(hours=1)
            and "hum" in r.values
        ]
        assert b["count"] == len(group)
        assert math.isclose(b["avg"], sum(group) / len(group), rel_tol=1e-12)


@pytest.mark.parametrize("field", ["$temp", "$$ROOT", "stats.temp", "a.b", ""])
def test_a_field_that_is_not_a_measurement_name_is_refused(field: str) -> None:
    """The field becomes part of field paths (``$stats.<field>``, ``$<field>``)."""
    for query in (layout_queries.hourly_bucket, layout_queries.hourly_timeseries):
        with pytest.raises(ValueError, match="is not a measurement name"):
            query(field, START, START + timedelta(hours=1))

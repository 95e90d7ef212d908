"""Time-series mode: every write looks up the instants it would store, and leaves out
what is there (duplicates), refuses changed fields (conflicts) and adds new fields."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from ingest.errors import WriteError
from ingest.model import Reading, Scalar
from ingest.store.schema import Schema
from ingest.store.writers.timeseries import TimeseriesWriter
from tests.support.mongo import failpoint

T0 = 1_790_000_000.0


def reading(sensor: str, epoch: float, seq: int | None = None, **values: Scalar) -> Reading:
    return Reading(sensor, datetime.fromtimestamp(epoch, UTC), epoch, values or {"v": 1.0}, seq)


def writer_for(db: Any) -> TimeseriesWriter:
    schema = Schema(
        db,
        "readings",
        rejects_collection="rejects",
        rejects_max_bytes=1 << 20,
        retention_days=None,
        span_seconds=3600,
    )
    return TimeseriesWriter(db.readings, schema)


async def test_only_readings_not_stored_yet_are_kept(db: Any) -> None:
    writer = writer_for(db)
    await writer.ensure_schema()
    stored = [
        reading("a", T0 + 1, seq=1, temp=20.5, hum=40),
        reading("b", T0 + 1.001, seq=2, temp=21),
    ]
    assert (await writer.write(writer.plan(stored))).written == 2
    fresh = [
        reading("a", T0 + 2, seq=3, temp=20.5),  # another time
        reading("a", T0 + 1, seq=1, temp=99.0, hum=40),  # same time, other values
        reading("c", T0 + 1, seq=1, temp=20.5, hum=40),
    ]  # another sensor
    again = [
        reading("a", T0 + 1, seq=1, hum=40, temp=20.5),  # value order does not matter
        reading("b", T0 + 1.001, seq=2, temp=21.0),
    ]  # nor int against float
    outcome = await writer.write(writer.plan([*fresh, *again]))
    assert (outcome.written, outcome.duplicates) == (2, 2)
    assert [r for r, _ in outcome.conflicts] == [fresh[1]]
    assert await db.readings.count_documents({}) == 4
    assert writer.take_lookups()[0] == 2 + 5
    assert writer.take_lookups() == (0, 0.0)


async def test_a_failed_lookup_is_a_retriable_write_error(db: Any, mongo: Any) -> None:
    writer = writer_for(db)
    await writer.ensure_schema()
    async with failpoint(mongo, ["find"], code=11602):
        with pytest.raises(WriteError, match="code 11602") as caught:
            await writer.write(writer.plan([reading("a", T0)]))
    assert type(caught.value) is WriteError  # retriable, not refused


async def test_many_sensors_are_looked_up_in_several_queries(db: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr("ingest.store.writers.timeseries.LOOKUP_SENSORS", 2)
    writer = writer_for(db)
    await writer.ensure_schema()
    stored = [reading(f"s{i}", T0 + i, seq=i) for i in range(5)]
    await writer.write(writer.plan(stored))
    fresh = [reading(f"s{i}", T0 + 100 + i, seq=i) for i in range(5)]
    outcome = await writer.write(writer.plan(stored + fresh))
    assert (outcome.written, outcome.duplicates) == (5, 5)
    assert await db.readings.count_documents({}) == 10

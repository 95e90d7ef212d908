"""A series is a sensor and its tags; one instant of a series is one reading, in both layouts.

One model of what should be stored (readings of a series at one millisecond merge their
fields; a field already there with the same value adds nothing; with another value the
later reading is refused) is checked against both writers, over the real driver, with
generated streams of series, tags and colliding instants, written in several batches
and partly written again (as after a crash).
"""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ingest.errors import WriteError
from ingest.model import Reading
from ingest.store.schema import Schema
from ingest.store.writers.bucket import BucketWriter
from ingest.store.writers.instants import merged, new_fields, same_value, tags_key
from ingest.store.writers.timeseries import TimeseriesWriter
from tests.support.mongo import instants

HOUR = 3600
T0 = 1_790_000_000 // HOUR * HOUR
type Instant = tuple[str, tuple[tuple[str, str], ...], int]


def reading(
    sensor: str,
    ms: int,
    values: dict[str, Any],
    tags: dict[str, str] | None = None,
    seq: int | None = None,
) -> Reading:
    return Reading(sensor, None, ms / 1000, values, seq, ms, tags)


class Model:
    """What should be stored, reading by reading, in the order they are written."""

    def __init__(self) -> None:
        self.stored: dict[Instant, dict[str, Any]] = {}

    def write(self, batch: list[Reading]) -> tuple[int, int, int]:
        """Apply a batch; (written, duplicates, conflicts) as a writer must count them."""
        written = duplicates = conflicts = 0
        for r in batch:
            key = (r.sensor_id, tags_key(r.tags), r.ms or 0)
            fields = self.stored.get(key)
            if fields is None:
                self.stored[key] = dict(r.values)
                written += 1
                continue
            new = new_fields(r, fields)
            if isinstance(new, str):
                conflicts += 1
            elif not new:
                duplicates += 1
            else:
                fields.update(new)
                written += 1
        return written, duplicates, conflicts


async def stored_bucket(coll: Any) -> dict[Instant, dict[str, Any]]:
    return await instants(coll, "bucket")


async def stored_timeseries(coll: Any) -> dict[Instant, dict[str, Any]]:
    return await instants(coll, "timeseries")


def writers(db: Any) -> tuple[BucketWriter, TimeseriesWriter]:
    name = uuid.uuid4().hex[:8]

    def schema(coll: str) -> Schema:
        return Schema(
            db,
            coll,
            rejects_collection="rejects",
            rejects_max_bytes=1 << 20,
            retention_days=None,
            span_seconds=HOUR,
        )

    bucket = BucketWriter(db[f"b{name}"], schema(f"b{name}"), HOUR, 3)
    timeseries = TimeseriesWriter(db[f"t{name}"], schema(f"t{name}"))
    return bucket, timeseries


def same_answer(got: dict[Instant, dict[str, Any]], want: dict[Instant, dict[str, Any]]) -> None:
    assert got.keys() == want.keys()
    for key, fields in want.items():
        assert got[key].keys() == fields.keys(), key
        assert all(same_value(got[key][k], v) for k, v in fields.items()), key


series = st.sampled_from(
    [
        ("s1", None),
        ("s1", {"path": "/"}),
        ("s1", {"path": "/boot"}),
        ("Кухня", None),
        ("s1", {}),
        ("s2", {"cpu": "cpu0", "host": "h"}),
    ]
)
values = st.dictionaries(
    st.sampled_from(["a", "b", "c"]), st.sampled_from([1, 2, 1.5, True]), min_size=1, max_size=3
)


@st.composite
def a_reading(draw: st.DrawFn) -> Reading:
    sensor, tags = draw(series)
    # a few instants, within one hour and across the hour (several documents)
    ms = T0 * 1000 + draw(st.sampled_from([0, 1, 2, HOUR * 1000 + 5]))
    return reading(sensor, ms, draw(values), tags, draw(st.none() | st.integers(0, 3)))


# A reading deferred for repeating a field holds back the later readings of its instant:
# {a: 2} must meet {a: 1} (a conflict), not merge into {b: 2} ahead of it.
_HELD_BACK = [
    [
        reading("s1", T0 * 1000, {"b": 2}),
        reading("s1", T0 * 1000, {"a": 1, "b": 2, "c": 2}),
        reading("s1", T0 * 1000, {"a": 2}),
    ]
]


# Each example is a round trip to the store: a count of its own, not the profile's.
@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(batches=_HELD_BACK, replays=[])
@example(batches=[[*_HELD_BACK[0][:2], reading("s1", T0 * 1000, {"a": 1})]], replays=[])
@given(
    batches=st.lists(st.lists(a_reading(), min_size=1, max_size=8), min_size=1, max_size=4),
    replays=st.lists(st.integers(0, 3), max_size=2),
)
async def test_both_layouts_store_and_refuse_what_the_model_says(
    db: Any, batches: list[list[Reading]], replays: list[int]
) -> None:
    bucket, timeseries = writers(db)
    await bucket.ensure_schema()
    await timeseries.ensure_schema()
    model = Model()
    sent = batches + [batches[i] for i in replays if i < len(batches)]
    for batch in sent:
        want = model.write(batch)
        for writer in (bucket, timeseries):
            outcome = await writer.write(writer.plan(batch))
            assert not outcome.retry
            assert not outcome.refused
            assert (outcome.written, outcome.duplicates, len(outcome.conflicts)) == want, (
                writer.mode
            )
    same_answer(await stored_bucket(bucket._collection), model.stored)
    same_answer(await stored_timeseries(timeseries._collection), model.stored)


def test_readings_of_one_instant_merge_and_a_changed_field_is_a_conflict() -> None:
    first = reading("press", T0 * 1000, {"pressure": 1013.5}, {"group": "g"}, seq=1)
    assert merged(first, reading("press", T0 * 1000, {"pressure": 1013.5})) is None
    both = merged(first, reading("press", T0 * 1000, {"running": True, "mode": 2}, seq=2))
    assert isinstance(both, Reading)
    assert both.values == {"pressure": 1013.5, "running": True, "mode": 2}
    assert both.seq == 1  # the first reading's
    conflict = merged(first, reading("press", T0 * 1000, {"pressure": 999.0}, {"group": "g"}))
    assert conflict == (
        "press{group=g} already has pressure=1013.5 at "
        "2026-09-21T14:00:00.000+00:00 (this reading: 999.0); the stored "
        "value is kept"
    )


async def test_a_default_reading_and_a_rule_reading_of_one_instant_store_together(db: Any) -> None:
    """No tags (the default format) and empty tags (a rule) are one series: a number from
    one and a string from the other at one instant are one stored instant, whichever came
    first (the string is not taken for a number)."""
    at = T0 * 1000 + 7
    default = reading("boiler", at, {"h": 0})
    rule = reading("boiler", at, {"state": "on"}, {})
    for batch in ([default, rule], [rule, default]):
        bucket, timeseries = writers(db)
        for writer in (bucket, timeseries):
            await writer.ensure_schema()
            outcome = await writer.write(writer.plan(batch))
            assert (outcome.written, outcome.duplicates, len(outcome.conflicts)) == (2, 0, 0)
        want: dict[Instant, dict[str, Any]] = {("boiler", (), at): {"h": 0, "state": "on"}}
        same_answer(await stored_bucket(bucket._collection), want)
        same_answer(await stored_timeseries(timeseries._collection), want)
        doc = await bucket._collection.find_one({})
        assert doc is not None
        assert doc["stats"] == {"h": {"count": 1, "sum": 0.0, "min": 0, "max": 0}}


async def test_a_stored_instant_takes_new_fields_once_and_refuses_changed_ones(db: Any) -> None:
    """Across batches (bucket: into the stored entry; time series: a second document)."""
    sparkplug = {"group": "Plant1", "node": "Edge1", "device": "Press"}
    at = T0 * 1000 + 250
    first = [reading("Plant1/Edge1/Press", at, {"Hydraulic_Pressure": 1013.5}, sparkplug)]
    second = [reading("Plant1/Edge1/Press", at, {"Running": True, "Mode": 2}, sparkplug)]
    bad = [reading("Plant1/Edge1/Press", at, {"Mode": 3}, sparkplug)]
    bucket, timeseries = writers(db)
    for writer in (bucket, timeseries):
        await writer.ensure_schema()
        for batch, counts in (
            (first, (1, 0, 0)),
            (second, (1, 0, 0)),
            (second, (0, 1, 0)),
            (bad, (0, 0, 1)),
        ):
            outcome = await writer.write(writer.plan(batch))
            assert (outcome.written, outcome.duplicates, len(outcome.conflicts)) == counts
    key = ("Plant1/Edge1/Press", tags_key(sparkplug), at)
    want = {key: {"Hydraulic_Pressure": 1013.5, "Running": True, "Mode": 2}}
    same_answer(await stored_bucket(bucket._collection), want)
    same_answer(await stored_timeseries(timeseries._collection), want)
    doc = await bucket._collection.find_one({})
    assert doc is not None
    assert doc["stats"]["Mode"] == {"count": 1, "sum": 2.0, "min": 2, "max": 2}
    assert doc["stats"]["Running"]["count"] == 1
    assert doc["count"] == 1
    assert doc["tags"] == {"device": "Press", "group": "Plant1", "node": "Edge1"}


async def test_merges_that_landed_count_once_when_another_merge_fails(
    db: Any, monkeypatch: Any
) -> None:
    """Bucket settle: a failed merge is retried alone; the ones that landed are written,
    not duplicates of the retry."""
    at = T0 * 1000 + 500
    first = [reading("boiler", at, {"temp": 60.5}), reading("boiler", at + 1, {"temp": 61})]
    second = [
        reading("boiler", at, {"pressure": 1.5}),
        reading("boiler", at + 1, {"pressure": 1.6}),
    ]
    bucket, _ = writers(db)
    await bucket.ensure_schema()
    await bucket.write(bucket.plan(first))
    merge = bucket._merge

    async def failing(r: Reading, doc_id: Any, new: dict[str, Any]) -> bool:
        if r.ms == at + 1:
            raise WriteError("connection reset")
        return await merge(r, doc_id, new)

    monkeypatch.setattr(bucket, "_merge", failing)
    outcome = await bucket.write(bucket.plan(second))
    assert (outcome.written, outcome.duplicates, [r.ms for r in outcome.retry]) == (1, 0, [at + 1])
    assert isinstance(outcome.error, WriteError)
    monkeypatch.setattr(bucket, "_merge", merge)
    again = await bucket.write(bucket.plan(outcome.retry))
    assert (again.written, again.duplicates, again.retry) == (1, 0, [])
    want: dict[Instant, dict[str, Any]] = {
        ("boiler", (), at): {"temp": 60.5, "pressure": 1.5},
        ("boiler", (), at + 1): {"temp": 61, "pressure": 1.6},
    }
    same_answer(await stored_bucket(bucket._collection), want)

"""Booleans, strings, tags and units in both writers: operations, and stored documents."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import bson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.model import Reading
from ingest.store.schema import Schema
from ingest.store.writers.bucket import BucketWriter, reading_bytes
from ingest.store.writers.instants import new_fields, same_value
from ingest.store.writers.timeseries import TimeseriesWriter, reading_document

if TYPE_CHECKING:
    from collections.abc import Mapping

HOUR = 3600
T0 = 1_790_000_000 // HOUR * HOUR
NO_DB: Any = defaultdict(lambda: None)


MAPPED: dict[str, str] = {}  # what the mapping path gives a reading without tags


def reading(
    epoch: float,
    values: dict[str, Any],
    tags: dict[str, str] | None = MAPPED,
    units: dict[str, str] | None = None,
    sensor: str = "s1",
) -> Reading:
    """A reading as the mapping path makes it (tags None: as the default decoder does)."""
    ts = datetime.fromtimestamp(epoch, UTC)
    return Reading(sensor, ts, epoch, values, None, int(epoch * 1000), tags, units)


def bucket(db: Any) -> BucketWriter:
    schema = Schema(
        db,
        "buckets",
        rejects_collection="rejects",
        rejects_max_bytes=1 << 20,
        retention_days=None,
        span_seconds=HOUR,
    )
    return BucketWriter(db["buckets"], schema, HOUR, 3600)


def test_booleans_count_as_0_1_and_strings_get_no_statistics_single_and_coalesced() -> None:
    one = bucket(NO_DB).plan([reading(T0 + 1, {"on": True, "mode": "eco", "t": 20})])
    doc = one.ops[0]["u"]
    assert doc["$inc"]["stats.on.sum"] == 1.0
    assert doc["$min"]["stats.on.min"] == 1
    assert type(doc["$min"]["stats.on.min"]) is int
    assert not any("mode" in key for part in ("$inc", "$min", "$max") for key in doc[part])
    assert doc["$push"]["readings"]["$each"][0]["on"] is True
    batch = [
        reading(T0 + 1, {"on": True, "mode": "eco"}),
        reading(T0 + 2, {"on": False, "mode": "away"}),
        reading(T0 + 3, {"on": True}),
    ]
    doc = bucket(NO_DB).plan(batch).ops[0]["u"]
    assert doc["$inc"]["stats.on.count"] == 3
    assert doc["$inc"]["stats.on.sum"] == 2
    assert (doc["$min"]["stats.on.min"], doc["$max"]["stats.on.max"]) == (0, 1)
    assert type(doc["$max"]["stats.on.max"]) is int
    assert "stats.mode.count" not in doc["$inc"]


def test_tags_are_the_bucket_key_units_are_set_and_the_default_path_sets_nothing() -> None:
    plan = bucket(NO_DB).plan(
        [
            reading(T0 + 1, {"t": 1}, {"room": "a", "floor": "1"}, {"t": "Cel"}),
            reading(T0 + 2, {"t": 2}, {"room": "b"}),
        ]
    )
    ops = [sent(op) for op in plan.ops]
    assert [op["q"]["tags"] for op in ops] == [{"floor": "1", "room": "a"}, {"room": "b"}]
    assert list(ops[0]["q"]["tags"]) == ["floor", "room"]  # name order: one key
    assert ops[0]["u"]["$set"] == {"units.t": "Cel"}
    assert "$set" not in ops[1]["u"]
    assert "$set" not in sent(bucket(NO_DB).plan([reading(T0 + 1, {"t": 1})]).ops[0])["u"]
    assert "$set" not in sent(bucket(NO_DB).plan([reading(T0 + 1, {"t": 1}, None)]).ops[0])["u"]


def sent(op: Mapping[str, Any]) -> dict[str, Any]:
    """A statement as the server receives it (built as a dict, or written as bytes)."""
    return bson.decode(bson.encode(op))


def test_true_and_1_are_different_readings() -> None:
    assert same_value(1, 1.0)
    assert not same_value(True, 1)  # noqa: FBT003
    assert not same_value(0, False)  # noqa: FBT003
    assert new_fields(reading(T0, {"a": True}), {"a": True}) == {}
    assert isinstance(new_fields(reading(T0, {"a": True}), {"a": 1}), str)
    later = reading(T0, {"a": 1})
    plan = bucket(NO_DB).plan([reading(T0, {"a": True}), later])
    assert plan.deferred == [later]  # judged once the first is stored: a conflict
    assert plan.duplicates == 0


def test_strings_count_in_the_byte_estimate() -> None:
    assert reading_bytes(reading(T0, {"s": "x" * 1000})) >= 1000


def test_timeseries_documents_hold_tags_in_meta_in_name_order_and_units_per_document() -> None:
    doc = reading_document(
        reading(T0, {"b": True, "a": "x"}, {"z": "1", "room": "k"}, {"b": "bool"})
    )
    assert list(doc["meta"]) == ["sensor_id", "room", "z"]
    assert doc["units"] == {"b": "bool"}
    assert doc["b"] is True
    assert list(reading_document(reading(T0, {"t": 1}))) == ["ts", "meta", "t"]
    assert reading_document(reading(T0, {"t": 1}, None))["meta"] == {"sensor_id": "s1"}


mixed = st.one_of(
    st.booleans(),
    st.integers(-1000, 1000),
    st.floats(-1e6, 1e6, allow_nan=False),
    st.text(max_size=8),
)


# Each example is a round trip to the store: a count of its own, not the profile's.
@settings(
    max_examples=15,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    batches=st.lists(
        st.lists(
            st.dictionaries(st.sampled_from(["a", "b"]), mixed, min_size=1), min_size=1, max_size=6
        ),
        min_size=1,
        max_size=3,
    )
)
async def test_stored_statistics_are_exact_for_mixed_kinds(db: Any, batches: Any) -> None:
    await db["buckets"].drop()
    writer = bucket(db)
    await writer.ensure_schema()
    written: list[dict[str, Any]] = []
    epoch = T0
    for values_list in batches:
        readings = []
        for values in values_list:
            epoch += 1
            readings.append(reading(epoch, values, {"site": "x"}))
            written.append(values)
        outcome = await writer.write(writer.plan(readings))
        assert outcome.written == len(readings)
    (doc,) = await db["buckets"].find({}).to_list()
    assert doc["count"] == len(written)
    assert doc["tags"] == {"site": "x"}
    for name in ("a", "b"):
        numbers = [
            int(v) if type(v) is bool else v
            for w in written
            if (v := w.get(name)) is not None and type(v) is not str
        ]
        stats = doc["stats"].get(name)
        if not numbers:
            assert stats is None
            continue
        assert stats["count"] == len(numbers)
        assert abs(stats["sum"] - sum(numbers)) <= 1e-6 * max(1.0, sum(map(abs, numbers)))
        assert stats["min"] == min(numbers)
        assert stats["max"] == max(numbers)
        assert type(stats["min"]) is not bool
    stored = [{k: v for k, v in r.items() if k != "ts"} for r in doc["readings"]]
    for got, want in zip(stored, written, strict=True):
        assert got == want
        assert all(same_value(got[k], want[k]) for k in want)


async def test_timeseries_writer_stores_any_scalar_with_meta_tags_and_units(db: Any) -> None:
    schema = Schema(
        db,
        "readings",
        rejects_collection="rejects",
        rejects_max_bytes=1 << 20,
        retention_days=None,
        span_seconds=HOUR,
    )
    writer = TimeseriesWriter(db["readings"], schema)
    await writer.ensure_schema()
    outcome = await writer.write(
        writer.plan(
            [reading(T0 + 1, {"on": True, "state": "idle", "t": 21.5}, {"room": "k"}, {"t": "Cel"})]
        )
    )
    assert outcome.written == 1
    (doc,) = await db["readings"].find({"meta.room": "k"}).to_list()
    assert doc["meta"] == {"sensor_id": "s1", "room": "k"}
    assert (doc["on"], doc["state"], doc["t"], doc["units"]) == (True, "idle", 21.5, {"t": "Cel"})


def test_readings_of_the_mapping_path_always_get_per_kind_statistics() -> None:
    from ingest.devices.decode import Limits  # noqa: PLC0415
    from ingest.devices.mapping import Mapping  # noqa: PLC0415
    from ingest.devices.rules import parse  # noqa: PLC0415

    rules = parse('[[rule]]\nname = "r"\ntopic = "z/{sensor_id}"\n', "test")
    result = Mapping(rules).decode("z/a", b'{"on": true, "mode": "eco"}', T0 + 1.0, Limits())
    (mapped,) = result.decoded.readings
    assert mapped.tags == {}  # no tags, yet not None: values may be booleans and strings
    doc = bucket(NO_DB).plan([mapped]).ops[0]["u"]
    assert doc["$min"]["stats.on.min"] == 1
    assert type(doc["$min"]["stats.on.min"]) is int
    assert "stats.mode.count" not in doc["$inc"]

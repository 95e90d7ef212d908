"""The writers' cheaper encoding paths send the same bytes as the plain ones.

Bucket operations and time-series documents carry dates as ``BsonDate`` (milliseconds)
rather than aware datetimes, time-series documents get their ``_id`` from
``object_ids`` rather than from the driver, and the default decoder's readings take a
shorter route through ``documents``. Each is checked against the plain construction,
byte for byte, for readings of every kind: floats, ints, booleans, strings, tags, units,
with and without seq, with and without the decoder's milliseconds.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections import defaultdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from unittest import mock

import bson
import pytest
from bson.datetime_ms import DatetimeMS
from bson.objectid import ObjectId
from hypothesis import given
from hypothesis import strategies as st

from ingest.model import Reading, Scalar
from ingest.store.schema import Schema
from ingest.store.writers import _bucket_py
from ingest.store.writers import bucket as bucket_mod
from ingest.store.writers._bucket_py import reading_doc
from ingest.store.writers.bucket import BsonDate, BucketWriter, bson_date
from ingest.store.writers.instants import merge_series
from ingest.store.writers.timeseries import (
    TimeseriesWriter,
    documents,
    object_ids,
    reading_document,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

HOUR = 3600
T0 = 1_790_000_000 // HOUR * HOUR
NO_DB: Any = defaultdict(lambda: None)

numbers = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(-1e300, 1e300, allow_nan=False, allow_infinity=False),
)
names = st.sampled_from(["temp", "hum", "co2", "a", "Z_1", "v-2"])
labels = st.dictionaries(
    st.sampled_from(["room", "floor", "site"]), st.text(max_size=8), max_size=3
)


@st.composite
def a_reading(draw: st.DrawFn) -> Reading:
    """A reading of the default decoder (numbers, no tags) or of the mapping path."""
    sensor = draw(st.sampled_from(["s1", "s2", "s3"]))
    epoch = T0 + draw(st.integers(-2 * HOUR, 2 * HOUR)) + draw(st.integers(0, 999)) / 1000
    ts = datetime.fromtimestamp(epoch, UTC)
    ts = ts.replace(microsecond=ts.microsecond - ts.microsecond % 1000)
    seq = draw(st.none() | st.integers(0, 2**63 - 1))
    ms = draw(st.sampled_from([True, False]))
    millis = bucket_mod.ts_key(ts) if ms else None
    if draw(st.booleans()):  # the default decoder: numbers only, no tags, no units
        numeric: dict[str, Scalar] = draw(st.dictionaries(names, numbers, min_size=1, max_size=4))
        return Reading(sensor, ts, epoch, numeric, seq, millis)
    scalars = st.one_of(numbers, st.booleans(), st.text(max_size=12))
    values = draw(st.dictionaries(names, scalars, min_size=1, max_size=4))
    units = draw(st.none() | st.dictionaries(names, st.sampled_from(["Cel", "%RH"]), max_size=2))
    return Reading(sensor, ts, epoch, values, seq, millis, draw(labels), units)


def as_datetimes(value: Any) -> Any:
    """``value`` with every BsonDate replaced by the aware datetime it stands for."""
    if isinstance(value, BsonDate):
        return value.as_datetime()
    if isinstance(value, dict):
        return {k: as_datetimes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_datetimes(v) for v in value]
    return value


def instant(value: Any) -> datetime:
    """The aware datetime of a statement's date: a BsonDate of a dict, or the datetime a
    statement written as bytes (a ``RawBSONDocument``) reads as."""
    return value.as_datetime() if isinstance(value, BsonDate) else value


def bucket_writer(max_readings: int = 3600) -> BucketWriter:
    schema = Schema(
        NO_DB,
        "buckets",
        rejects_collection="rejects",
        rejects_max_bytes=1 << 20,
        retention_days=None,
        span_seconds=HOUR,
    )
    return BucketWriter(NO_DB["buckets"], schema, HOUR, max_readings)


@given(st.lists(a_reading(), min_size=1, max_size=30), st.sampled_from([2, 5, 3600]))
def test_bucket_updates_encode_as_with_datetimes_and_push_reading_docs(
    readings: list[Reading], cap: int
) -> None:
    plan = bucket_writer(cap).plan(readings)
    assert plan.ops
    for op, chunk in zip(plan.ops, plan.groups, strict=True):
        query, update = op["q"], op["u"]
        assert bson.encode(query) == bson.encode(as_datetimes(query))
        assert bson.encode(update) == bson.encode(as_datetimes(update))
        pushed = as_datetimes(update["$push"]["readings"]["$each"])
        # The chunk's readings, one per instant (readings of one instant merged)
        entries = [r for r, _ in merge_series(chunk, bucket_mod.ms_of)[0]]
        assert bson.encode({"a": pushed}) == bson.encode({"a": [reading_doc(r) for r in entries]})
        assert as_datetimes(query["readings.ts"]["$nin"]) == [r.ts for r in entries]
        assert instant(update["$min"]["first_ts"]) == min(r.ts for r in chunk)
        assert instant(update["$max"]["last_ts"]) == max(r.ts for r in chunk)
        start = datetime.fromtimestamp(chunk[0].epoch // HOUR * HOUR, UTC)
        assert instant(query["bucket_start"]) == start
        assert next(iter(update["$min"])) == "first_ts"
        assert next(iter(update["$max"])) == "last_ts"


@contextlib.contextmanager
def general_plan() -> Iterator[None]:
    """The plan of the Python source with its single-pass path turned off: every group by
    the general path (the compiled plan, the same source, cannot be patched)."""
    with (
        mock.patch.object(_bucket_py, "_fast_update", return_value=None),
        mock.patch.object(bucket_mod, "plan_buckets", _bucket_py.plan_buckets),
    ):
        yield


@given(st.lists(a_reading(), min_size=1, max_size=30), st.sampled_from([2, 5, 3600]), st.booleans())
def test_the_single_pass_bucket_plan_sends_the_bytes_of_the_general_one(
    readings: list[Reading], cap: int, repeat: bool
) -> None:
    if repeat:  # the same millisecond twice in a group: the general path settles it
        readings = [*readings, readings[0]]
    fast = bucket_writer(cap).plan(readings)
    with general_plan():
        general = bucket_writer(cap).plan(readings)
    assert [bson.encode(op) for op in fast.ops] == [bson.encode(op) for op in general.ops]
    assert fast.groups == general.groups
    assert (fast.duplicates, fast.conflicts) == (general.duplicates, general.conflicts)


@given(
    st.lists(st.sampled_from(["temp", "hum", "co2", "v-2"]), min_size=1, max_size=4, unique=True),
    st.lists(
        st.lists(
            st.one_of(numbers, st.sampled_from([0.0, -0.0, 0, 1, 1.0])), min_size=4, max_size=4
        ),
        min_size=1,
        max_size=40,
    ),
    st.permutations(range(40)),
)
def test_a_group_of_readings_with_the_same_names_gets_the_general_plans_statistics(
    names: list[str], rows: list[list[Any]], order: list[int]
) -> None:
    # Ties of 1 and 1.0, -0.0 first, ints and floats mixed: the sum, minimum and maximum
    # (and their types) are those of the reading-by-reading path.
    readings = [
        Reading(
            "s1",
            None,
            float(T0 + second),
            dict(zip(names, row, strict=False)),
            None,
            (T0 + second) * 1000,
        )
        for second, row in zip(order, rows, strict=False)
    ]
    fast = bucket_writer().plan(readings)
    with general_plan():
        general = bucket_writer().plan(readings)
    assert len(fast.ops) == 1
    assert bson.encode(fast.ops[0]) == bson.encode(general.ops[0])


@given(st.lists(a_reading(), min_size=1, max_size=30))
def test_timeseries_documents_are_reading_documents_with_an_id_first(
    readings: list[Reading],
) -> None:
    docs = documents(readings)
    for doc, reading in zip(docs, readings, strict=True):
        assert next(iter(doc)) == "_id"
        assert isinstance(doc["_id"], ObjectId)
        plain = reading_document(reading)
        rest = {k: v for k, v in doc.items() if k != "_id"}
        assert bson.encode(rest) == bson.encode(plain)
        # what the driver sends: _id first, then the plain document
        assert bson.encode(doc) == bson.encode({"_id": doc["_id"], **plain})


def test_timeseries_plan_gives_the_driver_documents_with_ids() -> None:
    batch = [
        Reading("b", datetime.fromtimestamp(T0 + 1, UTC), T0 + 1, {"t": 1.5}, 3, (T0 + 1) * 1000),
        Reading("a", datetime.fromtimestamp(T0, UTC), float(T0), {"t": 2, "h": 40}),
    ]
    # plan() touches neither the collection nor the schema
    plan = TimeseriesWriter(None, None).plan(batch)  # type: ignore[arg-type]
    assert [d["meta"]["sensor_id"] for d in plan.ops] == ["a", "b"]
    assert len({d["_id"] for d in plan.ops}) == 2
    assert list(plan.ops[0]) == ["_id", "ts", "meta", "h", "t"]


def test_object_ids_are_unique_well_formed_and_new_per_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = int(time.time())
    ids = object_ids(3000) + object_ids(5)
    assert len(set(ids)) == len(ids)
    assert all(len(oid.binary) == 12 for oid in ids)
    assert all(before <= int(oid.generation_time.timestamp()) <= time.time() + 1 for oid in ids)
    counters = [int.from_bytes(oid.binary[9:], "big") for oid in ids]
    assert all((b - a) % (1 << 24) == 1 for a, b in itertools.pairwise(counters))
    assert len({oid.binary[4:9] for oid in ids}) == 1
    pid = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: pid + 1)
    after_fork = object_ids(1)[0]
    assert after_fork.binary[4:9] != ids[0].binary[4:9]


@pytest.mark.parametrize(
    "ms", [0, 1, -1, 999, 1_790_000_000_123, -62_135_596_800_000, 253_402_300_799_999]
)
def test_bson_date_encodes_as_datetime_ms_and_as_the_datetime(ms: int) -> None:
    date = bson_date(ms)
    assert bson.encode({"t": date}) == bson.encode({"t": DatetimeMS(ms)})
    as_dt = DatetimeMS(ms).as_datetime(bson.CodecOptions(tz_aware=True))
    assert bson.encode({"t": date}) == bson.encode({"t": as_dt})
    assert date == as_dt
    assert date.as_datetime() == as_dt
    assert date.timestamp() == as_dt.timestamp()
    assert bson.decode(bson.encode({"t": date}))["t"] == as_dt.replace(tzinfo=None)


def test_bson_dates_order_and_compare() -> None:
    a, b = bson_date(5), bson_date(7)
    assert a < b
    assert b > a
    assert min([b, a]) is a
    assert max([a, b]) is b
    assert a == bson_date(5)
    assert a == DatetimeMS(5)
    assert a != b
    assert hash(a) == hash(bson_date(5))

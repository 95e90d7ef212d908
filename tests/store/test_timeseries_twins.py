"""Time-series documents: the Python functions and their compiled twins agree.

``batch_documents`` (a batch's documents, each sensor's run of times, whether two
readings of a sensor share a millisecond) and ``reading_document`` run on the same
generated readings, hostile ones included, must give identical results. The compiled
``batch_documents`` writes a document's BSON bytes itself (a ``RawBSONDocument``): they
must be the bytes pymongo's encoder writes for the Python twin's dict, and it must do so
for every document of the shapes it claims (``written_as_bytes``); any other document is
the Python twin's dict (same key order, value types, ``meta`` objects shared the same
way), which the driver then encodes or refuses alike. Where one twin raises, the other
raises the same exception (type and text).
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import math
import time
import types
from collections import OrderedDict
from datetime import UTC, datetime
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import bson
import pytest
from bson.codec_options import CodecOptions
from bson.errors import InvalidDocument
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument
from hypothesis import given
from hypothesis import strategies as st

from ingest.model import Reading, Scalar
from ingest.store.writers import _timeseries_py as py_mod
from ingest.store.writers import timeseries as ts_mod
from ingest.store.writers.bucket import BsonDate, bson_date
from ingest.store.writers.claims import claim_ids
from tests.support.twins import compiled

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

T0 = 1_790_000_000_000  # ms
# What the daemon's client encodes with (ingest.pipeline.app): tz_aware, no type registry.
CLIENT_OPTIONS: CodecOptions[Any] = CodecOptions(tz_aware=True)
# A document's own fields: a value of that name overwrites one (see the compiled twin).
OWN = {"_id", "ts", "meta", "seq", "units", "info"}
# A Reading built with fields of other types than its annotations, on purpose: the twins
# must handle, or refuse, such a reading alike.
any_reading: Callable[..., Reading] = Reading


@pytest.fixture(scope="module")
def twin() -> ModuleType:
    return compiled("ingest.store.writers._timeseries_c")


class SubReading(Reading):
    """A Reading of a subclass: read through its attributes, not by index."""

    __slots__ = ()


def fresh(text: str) -> str:
    """An equal string that is another object (the twins must not rely on identity)."""
    return "".join(list(text))


texts = st.sampled_from(["s1", "s2", "s3", "Ω-ü", "😀", "a" * 128]).map(fresh)
sensors = st.one_of(texts, st.sampled_from(["s1", "s2"]), st.text(max_size=4))
odd_sensors = st.sampled_from([5, None, math.nan, ("t",), b"s1", "s\udc80"])
names = st.one_of(
    st.sampled_from(["temp", "hum", "co2", "a", "Z_1", "v-2", "é", "😀", "B"]),
    st.sampled_from(["ts", "_id", "meta", "seq", "units", "info"]),  # what the decoders refuse
    st.sampled_from(["a\x00b", "x\ud800", "sensor_id"]),  # a NUL, a lone surrogate
    st.text(max_size=3),
)
edges = [
    0,
    1,
    1.0,
    -0.0,
    math.inf,
    -math.inf,
    math.nan,
    None,
    2**31 - 1,
    2**31,
    -(2**31),
    -(2**31) - 1,
    2**63 - 1,
    2**63,
    -(2**63),
    -(2**63) - 1,
    "",
    "a\x00b",
    "x\ud800",
    "é😀",
    [1, [2]],
    {"x": 1},
    b"x",
    ObjectId(bytes(12)),
]
scalars = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.booleans(),
    st.text(max_size=6),
    st.sampled_from(edges),
)


@st.composite
def value_maps(draw: st.DrawFn, hostile: bool) -> Any:
    kind = draw(st.integers(0, 19 if hostile else 16))
    if kind <= 14:
        return draw(st.dictionaries(names, scalars, min_size=1, max_size=6))
    if kind == 15:  # more names than the compiled twin sorts on its stack
        count = draw(st.sampled_from([32, 33, 40]))
        return {f"n{(i * 7919) % count:03d}": i for i in range(count)}
    if kind == 16:
        return OrderedDict(draw(st.dictionaries(names, scalars, min_size=1, max_size=4)))
    if kind == 17:  # names that are not all str
        return draw(
            st.dictionaries(st.one_of(names, st.integers(0, 3)), scalars, min_size=1, max_size=3)
        )
    return draw(st.sampled_from([["b", "a"], ("a",), [("b", 1), ("a", 2)], 5, None, "ab"]))


naive = st.datetimes(
    min_value=datetime(1970, 1, 2),  # noqa: DTZ001 - what a client may give
    max_value=datetime(2100, 1, 1),  # noqa: DTZ001
)
aware = st.datetimes(
    min_value=datetime(1, 1, 2),  # noqa: DTZ001
    max_value=datetime(9999, 12, 30),  # noqa: DTZ001
    timezones=st.just(UTC),
)
labels: st.SearchStrategy[dict[str, str] | None] = st.one_of(
    st.none(),
    st.just({}),
    st.dictionaries(
        st.one_of(names, st.sampled_from(["site", "room"])), st.text(max_size=4), max_size=3
    ),
)


@st.composite
def a_reading(draw: st.DrawFn, hostile: bool = False) -> Any:
    """A reading of the default decoder or of the mapping path; or something hostile."""
    kind = draw(st.integers(0, 40)) if hostile else 40
    if kind == 0:
        return draw(st.sampled_from([object(), 5, None, ("s",)]))
    if kind == 1:  # a Reading with too few fields
        return tuple.__new__(Reading, draw(st.lists(st.just("s"), max_size=8)))
    if hostile:
        ms = draw(
            st.one_of(
                st.none(),
                st.integers(T0 - 5, T0 + 5),
                st.integers(-(2**70), 2**70),
                st.sampled_from([1.5, math.nan, -0.0, True]),
            )
        )
        when = draw(st.one_of(st.none(), aware, naive, st.just("x")))
        sensor = draw(st.one_of(sensors, odd_sensors))
    else:  # the time as the decoders give it: milliseconds, or an aware datetime
        ms = draw(st.one_of(st.integers(T0 - 5, T0 + 5), st.integers(-(2**62), 2**62), st.none()))
        when = draw(aware) if ms is None else None
        sensor = draw(sensors)
    epoch = float(ms) / 1000 if type(ms) is int and abs(ms) < 2**60 else 0.0
    seq = draw(st.one_of(st.none(), st.integers(-(2**70), 2**70), st.sampled_from(["7", 1.5])))
    fields = (sensor, when, epoch, draw(value_maps(hostile)), seq, ms)
    if draw(st.booleans()):  # the default decoder: no tags, units or info
        reading = any_reading(*fields)
    else:
        units: object = draw(
            st.one_of(st.none(), st.dictionaries(names, st.sampled_from(["Cel", "%"]), max_size=2))
        )
        info = draw(st.one_of(st.none(), st.dictionaries(names, st.text(max_size=3), max_size=2)))
        tags: object = draw(labels)
        if hostile:
            units = draw(st.one_of(st.just(units), st.just(5)))
            tags = draw(st.one_of(st.just(tags), st.sampled_from([["b", "a"], "x", 0])))
        reading = any_reading(*fields, tags, units, info)
    return SubReading(*reading) if kind == 2 else reading


@st.composite
def batches(draw: st.DrawFn, *, sort: bool) -> list[Any]:
    """Up to 25 readings, a few of them hostile in one batch of four."""
    hostile = draw(st.integers(0, 3)) == 0
    readings = draw(st.lists(st.one_of(a_reading(), a_reading(hostile)), max_size=25))
    if sort:
        with contextlib.suppress(TypeError, AttributeError, IndexError):
            readings = sorted(readings, key=attrgetter("sensor_id", "epoch"))
    return readings


# Ids as _reserve_ids gives them, and (one time in ten) what it never gives.
prefixes = st.one_of(
    st.binary(min_size=9, max_size=9),
    st.binary(max_size=12),
    st.sampled_from(["123456789", bytearray(9), None]),
)
starts = st.one_of(
    st.integers(0, 0xFFFFFF),
    st.sampled_from([0xFFFFFF, 0xFFFFFE]),
    st.integers(-(2**70), 2**70),
    st.sampled_from([True, 1.0, "1", None]),
)
ids = st.integers(0, 9).flatmap(
    lambda n: (
        st.tuples(prefixes, starts)
        if n == 0
        else st.tuples(
            st.binary(min_size=9, max_size=9),
            st.one_of(st.integers(0, 0xFFFFFF), st.sampled_from([0xFFFFFF, 0xFFFFFE])),
        )
    )
)


def same(a: Any, b: Any) -> bool:
    """Equal, of the same types all the way down, dict keys in the same order; NaN is NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, ObjectId | BsonDate | float):
        return repr(a) == repr(b)  # an id's bytes, a date's milliseconds, -0.0 and NaN
    return bool(a == b)


def outcome(fn: Any, *args: Any) -> tuple[Any, ...]:
    try:
        return ("returned", fn(*args))
    except Exception as exc:  # noqa: BLE001 - the twins must raise the same, whatever it is
        return ("raised", type(exc), str(exc))


def encoded(doc: dict[str, Any]) -> bytes | tuple[type, str]:
    try:
        return bson.encode(doc, codec_options=CLIENT_OPTIONS)
    except Exception as exc:  # noqa: BLE001 - the same refusal from both
        return type(exc), str(exc)


def sharing(docs: list[dict[str, Any]]) -> list[int]:
    """For each document, the first document with the very same ``meta`` object."""
    first: dict[int, int] = {}
    return [first.setdefault(id(doc["meta"]), i) for i, doc in enumerate(docs)]


def written_as_bytes(reading: Any, doc: dict[str, Any]) -> bool:
    """Whether the compiled twin must write ``doc`` (the Python twin's) as bytes.

    Its rule: an exact ``Reading`` whose document the driver encodes, whose leaves are
    bool, int, float, str or None, no value named as a document field; with tags, units
    or info, also no ``when``, tags, units and info exact dicts and no tag named
    ``sensor_id``.
    """
    if (
        type(reading) is not Reading
        or len(reading) != len(Reading._fields)
        or not isinstance(encoded(doc), bytes)
        or type(reading.values) is not dict
        or any(name in OWN for name in reading.values)
    ):
        return False
    if reading.tags or reading.units is not None or reading.info is not None:
        parts = [reading.values, reading.tags or {}, reading.units or {}, reading.info or {}]
        if (
            reading.when is not None
            or any(type(p) is not dict for p in parts)
            or "sensor_id" in (reading.tags or {})
        ):
            return False
    elif type(doc["ts"].ms) is not int:
        return False
    leaves = [
        *doc["meta"].values(),
        *doc.get("units", {}).values(),
        *doc.get("info", {}).values(),
        *(v for k, v in doc.items() if k not in {"_id", "ts", "meta", "units", "info"}),
    ]
    return all(type(v) in {bool, int, float, str, type(None)} for v in leaves)


def check_batch(twin: ModuleType, readings: list[Any], prefix: bytes, start: int) -> None:
    expected = outcome(py_mod.batch_documents, readings, prefix, start)
    got = outcome(twin.batch_documents, readings, prefix, start)
    if expected[0] == "raised" or got[0] == "raised":
        assert got == expected
        return
    (docs, runs, collided), (cdocs, cruns, ccollided) = expected[1], got[1]
    assert len(cdocs) == len(docs)
    for cdoc, doc, reading in zip(cdocs, docs, readings, strict=True):
        if written_as_bytes(reading, doc):
            assert isinstance(cdoc, RawBSONDocument)
            assert cdoc.raw == bson.encode(doc, codec_options=CLIENT_OPTIONS)
            # read as the lookup before an insert reads a document
            assert same(ts_mod._doc_instant(cdoc), ts_mod._doc_instant(doc))
        else:
            assert same(cdoc, doc)
    dicts = [i for i, cdoc in enumerate(cdocs) if type(cdoc) is dict]
    assert sharing([cdocs[i] for i in dicts]) == sharing([docs[i] for i in dicts])
    assert same(cruns, runs)
    assert ccollided is collided
    assert [encoded(d) for d in cdocs] == [encoded(d) for d in docs]
    assert [encoded({"t": t}) for _, times in cruns for t in times] == [
        encoded({"t": t}) for _, times in runs for t in times
    ]


@given(batches(sort=True), ids)
def test_sorted_batches_give_identical_documents_and_runs(
    twin: ModuleType, readings: list[Any], first: tuple[bytes, int]
) -> None:
    check_batch(twin, readings, *first)


@given(batches(sort=False), ids)
def test_batches_in_any_order_give_identical_documents_and_runs(
    twin: ModuleType, readings: list[Any], first: tuple[bytes, int]
) -> None:
    check_batch(twin, readings, *first)


clean_names = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), min_size=1, max_size=8
).filter(lambda name: name not in OWN)
decoded_values: st.SearchStrategy[Scalar] = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(),
    st.booleans(),
    st.text(max_size=8),
    st.sampled_from([2**31 - 1, 2**31, -(2**31), -(2**31) - 1, -0.0, math.nan, "é😀\x00"]),
)


@st.composite
def decoded(draw: st.DrawFn) -> Reading:
    """A reading as the decoders make it: the default decoder's, or a mapping rule's."""
    sensor = draw(st.text(min_size=1, max_size=8))
    ms = draw(
        st.one_of(
            st.integers(T0 - 5, T0 + 5), st.integers(-62_135_596_800_000, 253_402_300_799_999)
        )
    )
    values = draw(st.dictionaries(clean_names, decoded_values, min_size=1, max_size=8))
    seq = draw(st.none() | st.integers(0, 2**63 - 1))
    if draw(st.booleans()):
        return Reading(sensor, None, ms / 1000, values, seq, ms)
    labels = st.dictionaries(clean_names, st.text(max_size=6), max_size=4)
    tags = draw(labels.map(lambda tags: {k: v for k, v in tags.items() if k != "sensor_id"}))
    units = draw(st.none() | labels)
    info = draw(st.none() | labels)
    return Reading(sensor, None, ms / 1000, values, seq, ms, tags, units, info)


@given(
    st.lists(decoded(), max_size=20), st.binary(min_size=9, max_size=9), st.integers(0, 0xFFFFFF)
)
def test_readings_of_the_decoders_become_the_bytes_of_the_python_twins_documents(
    twin: ModuleType, readings: list[Reading], prefix: bytes, start: int
) -> None:
    readings = py_mod.sorted_readings(readings)
    docs, runs, collided = py_mod.batch_documents(readings, prefix, start)
    cdocs, cruns, ccollided = twin.batch_documents(readings, prefix, start)
    assert all(isinstance(doc, RawBSONDocument) for doc in cdocs)
    assert [doc.raw for doc in cdocs] == [
        bson.encode(doc, codec_options=CLIENT_OPTIONS) for doc in docs
    ]
    assert same(cruns, runs)
    assert ccollided is collided


def test_a_document_the_driver_refuses_is_the_python_twins_dict_refused_alike(
    twin: ModuleType,
) -> None:
    hostile: list[tuple[dict[str, Any], type[Exception]]] = [
        ({"v": 2**63}, OverflowError),
        ({"v": -(2**63) - 1}, OverflowError),
        ({"v": "x\ud800"}, UnicodeEncodeError),
        ({"a\x00b": 1.0}, InvalidDocument),
        ({"v": object()}, InvalidDocument),
    ]
    for values, error in hostile:
        for tags in (None, {"room": "k"}):
            reading = Reading("s", None, T0 / 1000, values, None, T0, tags)
            py_doc = py_mod.batch_documents([reading], bytes(9), 0)[0][0]
            doc = twin.batch_documents([reading], bytes(9), 0)[0][0]
            assert same(doc, py_doc)
            with pytest.raises(error) as raised:
                bson.encode(doc, codec_options=CLIENT_OPTIONS)
            assert encoded(py_doc) == (error, str(raised.value))


def test_a_document_written_as_bytes_reads_as_the_python_twins(twin: ModuleType) -> None:
    reading = Reading(
        "s1",
        None,
        T0 / 1000,
        {"temp": 21.5, "on": True, "n": 7, "text": "é"},
        3,
        T0,
        {"room": "k"},
        {"temp": "Cel"},
        {"model": "x"},
    )
    py_doc = py_mod.batch_documents([reading], bytes(9), 0)[0][0]
    doc = twin.batch_documents([reading], bytes(9), 0)[0][0]
    assert isinstance(doc, RawBSONDocument)
    assert (
        list(doc)
        == list(py_doc)
        == ["_id", "ts", "meta", "seq", "units", "info", "n", "on", "temp", "text"]
    )
    assert doc["_id"] == py_doc["_id"]
    assert doc["ts"] == py_doc["ts"] == reading.ts
    assert doc["ts"].tzinfo is UTC
    assert dict(doc["meta"]) == py_doc["meta"] == {"sensor_id": "s1", "room": "k"}
    assert [
        (k, type(v), v) for k, v in doc.items() if k not in {"_id", "ts", "meta", "units", "info"}
    ] == [
        (k, type(v), v)
        for k, v in py_doc.items()
        if k not in {"_id", "ts", "meta", "units", "info"}
    ]
    assert ts_mod._doc_instant(doc) == ts_mod._doc_instant(py_doc)
    # the driver reads the bytes of each document it sends from a slot, not through
    # RawBSONDocument's Python property
    assert type(inspect.getattr_static(doc, "raw")) is types.MemberDescriptorType
    assert doc.raw == bson.encode(py_doc, codec_options=CLIENT_OPTIONS)


@given(st.one_of(a_reading(), a_reading(hostile=True)))
def test_one_readings_document_is_identical(twin: ModuleType, reading: Any) -> None:
    expected = outcome(py_mod.reading_document, reading)
    got = outcome(twin.reading_document, reading)
    assert got[0] == expected[0]
    if got[0] == "raised":
        assert got == expected
    else:
        assert same(got[1], expected[1])
        assert encoded(got[1]) == encoded(expected[1])


def test_a_sensors_readings_share_an_instant_only_when_their_milliseconds_are_equal(
    twin: ModuleType,
) -> None:
    nan = math.nan
    cases: list[tuple[list[tuple[str, float]], bool]] = [
        ([("a", T0), ("a", T0 + 1), ("b", T0 + 1)], False),
        ([("a", T0), ("a", T0), ("b", T0)], True),
        ([("a", T0), ("b", T0), ("b", T0)], True),
        ([("a", nan), ("a", nan)], False),  # compared as operator.eq does: NaN is not NaN
        ([("a", 1.0), ("a", 1)], True),
    ]
    for pairs, collided in cases:
        readings = [any_reading(sensor, None, 0.0, {"v": 1}, None, ms) for sensor, ms in pairs]
        for fn in (py_mod.batch_documents, twin.batch_documents):
            _, runs, got = fn(readings, bytes(9), 0)
            assert got is collided
            assert [(s, len(t)) for s, t in runs] == [
                (s, sum(1 for p, _ in pairs if p == s)) for s in dict.fromkeys(p for p, _ in pairs)
            ]


def test_ids_are_the_prefix_and_a_wrapping_counter_in_both_twins(twin: ModuleType) -> None:
    readings = [Reading("s", None, 0.0, {"v": i}, None, T0 + i) for i in range(4)]
    prefix = bytes(range(1, 10))
    for fn in (py_mod.batch_documents, twin.batch_documents):
        docs, _, _ = fn(readings, prefix, 0xFFFFFE)
        assert [d["_id"].binary for d in docs] == [
            prefix + c.to_bytes(3, "big") for c in (0xFFFFFE, 0xFFFFFF, 0, 1)
        ]


@pytest.mark.parametrize("compiled_twin", [False, True])
def test_documents_take_new_ids_counting_on_from_the_last_batch(
    twin: ModuleType, compiled_twin: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        ts_mod,
        "batch_documents",
        twin.batch_documents if compiled_twin else py_mod.batch_documents,
    )
    before = int(time.time())
    readings = [Reading(f"s{i % 3}", None, 0.0, {"v": i}, None, T0 + i) for i in range(50)]
    ids = [d["_id"] for d in ts_mod.documents(readings)]
    ids += [d["_id"] for d in ts_mod.documents(readings[:7])] + ts_mod.object_ids(2)
    assert len(set(ids)) == len(ids)
    assert len({oid.binary[4:9] for oid in ids}) == 1  # the process's random bytes
    counters = [int.from_bytes(oid.binary[9:], "big") for oid in ids]
    assert all((b - a) % (1 << 24) == 1 for a, b in itertools.pairwise(counters))
    assert all(before <= int(oid.generation_time.timestamp()) <= time.time() + 1 for oid in ids)


@given(st.lists(a_reading(), max_size=20))
def test_a_plan_is_the_same_with_either_twin(twin: ModuleType, readings: list[Any]) -> None:
    # Readings of the decoders only (a plan sorts them, which hostile ones would stop).
    readings = [
        r
        for r in readings
        if type(r) is Reading
        and len(r) == len(Reading._fields)
        and type(r.sensor_id) is str
        and type(r.ms) is int
    ]
    plans = []
    for fn in (py_mod.batch_documents, twin.batch_documents):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ts_mod, "batch_documents", fn)
            patch.setattr(ts_mod, "_reserve_ids", lambda _count: (bytes(9), 7))
            plans.append(
                outcome(
                    # plan() touches neither the collection nor the schema
                    ts_mod.TimeseriesWriter(None, None).plan,  # type: ignore[arg-type]
                    readings,
                )
            )
    assert plans[1][0] == plans[0][0]
    if plans[0][0] == "raised":
        assert plans[1] == plans[0]
        return
    py, compiled_plan = plans[0][1], plans[1][1]
    assert [encoded(d) for d in compiled_plan.ops] == [encoded(d) for d in py.ops]
    assert same(compiled_plan.lookup, py.lookup)
    assert list(compiled_plan.groups) == list(py.groups)
    assert compiled_plan.deferred == py.deferred


epochs = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 1.5, 2.0, -1.0, math.inf, -math.inf]),
    st.floats(allow_nan=False),
    st.floats(),
)
order_keys = st.tuples(st.sampled_from(["b", "a", "c", "é", ""]).map(fresh) | sensors, epochs)


@st.composite
def to_sort(draw: st.DrawFn) -> list[Any]:
    """Readings in arrival order, reversed or shuffled; now and then something else."""
    keys = draw(st.lists(order_keys, max_size=60))
    readings: list[Any] = [Reading(s, None, e, {"v": i}, None, i) for i, (s, e) in enumerate(keys)]
    if draw(st.integers(0, 4)) == 0 and readings:  # an odd one: int time, NaN, not str...
        odd = draw(
            st.one_of(
                st.builds(
                    lambda s, e: Reading(s, None, e, {}),
                    sensors | odd_sensors,
                    st.sampled_from([1, math.nan, True, None, "1"]),
                ),
                st.sampled_from([object(), 5]),
                st.builds(lambda: tuple.__new__(Reading, ("s",))),
                st.builds(lambda s: SubReading(s, None, 1.0, {}), sensors),
            )
        )
        readings.insert(draw(st.integers(0, len(readings))), odd)
    return readings


@given(to_sort())
def test_a_batch_is_put_in_the_same_order_by_both_twins(
    twin: ModuleType, readings: list[Any]
) -> None:
    expected = outcome(py_mod.sorted_readings, readings)
    got = outcome(twin.sorted_readings, readings)
    if expected[0] == "raised":
        assert got == expected
        return
    assert got[0] == "returned"
    assert [id(r) for r in got[1]] == [id(r) for r in expected[1]]  # the very same objects
    assert type(got[1]) is list
    assert got[1] is not readings


def test_many_readings_of_one_sensor_out_of_order_are_sorted_by_time(twin: ModuleType) -> None:
    readings = [
        Reading(f"s{i % 3}", None, float((i * 7919) % 1000 // 2), {"v": i}) for i in range(3000)
    ]
    python_sorted: Callable[..., list[Reading]] = py_mod.sorted_readings  # given a tuple too
    for data in (readings, readings[::-1], tuple(readings)):
        assert twin.sorted_readings(data) == python_sorted(data)


@st.composite
def lookup_runs(draw: st.DrawFn) -> list[tuple[Any, list[Any]]]:
    """Sensors and their times as a plan's lookup holds them (BSON dates in order), with
    now and then what the kernel must leave to the driver: a sensor id that is no UTF-8
    (a lone surrogate), a time of another type, a run longer than the kernel names."""
    instants = st.integers(-62_135_596_800_000, 253_402_300_799_999)
    runs: list[tuple[Any, list[Any]]] = []
    for sensor in draw(st.lists(st.text(max_size=8), max_size=8)):
        times: list[Any] = [bson_date(ms) for ms in sorted(draw(st.lists(instants, min_size=1)))]
        odd = draw(st.integers(0, 9))
        if odd == 0:
            times[-1] = datetime.fromtimestamp(0, UTC)
        elif odd == 1:
            times = [bson_date(T0 + k) for k in range(draw(st.sampled_from([4096, 4097])))]
        runs.append((sensor, times))
    return runs


@given(lookup_runs())
def test_a_lookups_clauses_are_the_bytes_of_the_python_twins_dicts(
    twin: ModuleType, runs: list[tuple[Any, list[Any]]]
) -> None:
    """The lookup before an insert: each clause the kernel writes is exactly the bytes
    the driver writes for the Python twin's dict; what it is not sure of stays that dict
    (a sensor id that is no UTF-8, a time not a BsonDate, more than 4,096 times)."""
    clauses = py_mod.lookup_clauses(runs)
    cclauses = twin.lookup_clauses(runs)
    assert all(type(clause) is dict for clause in clauses)
    assert len(cclauses) == len(runs)
    for (sensor, times), clause, cclause in zip(runs, clauses, cclauses, strict=True):
        sure = (
            not any("\ud800" <= c <= "\udfff" for c in sensor)
            and all(type(t) is BsonDate for t in times)
            and len(times) <= 4096
        )
        if sure:
            assert isinstance(cclause, RawBSONDocument)
            assert cclause.raw == bson.encode(clause, codec_options=CLIENT_OPTIONS)
        else:
            assert type(cclause) is dict
            assert encoded(cclause) == encoded(clause)


owners = st.sampled_from(["writer-0123abcd", "daemon-1", "é😀"])


@given(st.lists(decoded(), max_size=20), st.integers(-(2**63), 2**63 - 1), owners)
def test_claims_of_the_decoders_readings_are_the_bytes_of_the_python_twins_dicts(
    twin: ModuleType, readings: list[Reading], at: int, owner: str
) -> None:
    """The claims of single readings (the usual claim insert) are written as bytes, exactly
    the bytes the driver writes for the Python twin's dicts."""
    ids = claim_ids(readings)
    docs = py_mod.claim_documents(ids, readings, at, owner)
    cdocs = twin.claim_documents(ids, readings, at, owner)
    assert all(isinstance(doc, RawBSONDocument) for doc in cdocs)
    assert [doc.raw for doc in cdocs] == [
        bson.encode(doc, codec_options=CLIENT_OPTIONS) for doc in docs
    ]
    assert [doc["_id"] for doc in cdocs] == ids


@given(
    st.text(max_size=8),
    st.lists(st.tuples(st.text(max_size=4), st.text(max_size=4)), max_size=3).map(tuple),
    # compiled, an int64 is written in place and a larger one by Python: both ranges
    st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**80), 2**80)),
)
def test_a_claim_id_is_the_python_twins(
    twin: ModuleType, sensor: str, tags: tuple[tuple[str, str], ...], ms: int
) -> None:
    """An instant's claim ``_id``, with tags or without: the same from both twins."""
    instant = (sensor, tags, ms)
    assert twin.claim_id(instant) == py_mod.claim_id(instant)


@given(st.lists(st.one_of(a_reading(), a_reading(hostile=True)), max_size=12))
def test_claim_ids_are_the_python_twins(twin: ModuleType, readings: list[Any]) -> None:
    """A claim's id names its series and instant: the compiled ids are the Python
    twin's, for any reading (another kind's ids come from the function passed)."""

    def other(reading: Any) -> str:
        return f"other {reading!r}"

    assert outcome(twin.claim_ids, readings, other) == outcome(py_mod.claim_ids, readings, other)


@given(
    st.lists(st.one_of(a_reading(), a_reading(hostile=True)), max_size=8),
    st.lists(st.one_of(texts, st.sampled_from(["x\ud800", 5])), max_size=9),
    st.one_of(st.integers(-(2**64), 2**64), st.sampled_from([1.5, None])),
    st.one_of(owners, st.sampled_from(["x\ud800", None])),
)
def test_claims_of_any_reading_are_the_python_twins_or_its_bytes(
    twin: ModuleType, readings: list[Any], ids: list[Any], at: Any, owner: Any
) -> None:
    """Whatever the readings, ids, time and owner: both twins raise alike, or each claim
    is the Python twin's dict, or the bytes the driver writes for it."""
    expected = outcome(py_mod.claim_documents, ids, readings, at, owner)
    got = outcome(twin.claim_documents, ids, readings, at, owner)
    if expected[0] == "raised" or got[0] == "raised":
        assert got == expected
        return
    for doc, py_doc in zip(got[1], expected[1], strict=True):
        if isinstance(doc, RawBSONDocument):
            assert doc.raw == encoded(py_doc)
        else:
            assert same(doc, py_doc)

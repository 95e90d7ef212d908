"""Bucket mode's plan: compiled, ``_bucket_py`` builds exactly the statements it builds as Python.

Both twins (the module run as Python, and the same source compiled as ``_bucket_c``) plan
the same generated batches (many series, tags shared and not, units, info, seq, readings
at one instant, ints at the 64-bit limits, floats up to ±1e300 and -0.0, readings around
span boundaries and a size cap that splits groups) and must give the same plan: the same
statements (dicts, key order, value types, the bits of every float), the same BSON bytes,
the same readings carried by each statement and deferred, or the same exception.
"""

from __future__ import annotations

import json
import math
import struct
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import bson
import pytest
from bson.raw_bson import RawBSONDocument
from hypothesis import given
from hypothesis import strategies as st

from ingest.devices.decode import Limits, decode
from ingest.model import Reading
from ingest.store.writers import _bucket_py as python
from ingest.store.writers import bucket
from tests.support.twins import compiled

if TYPE_CHECKING:
    from ingest.model import Scalar
    from ingest.store.writers import Plan

twin = compiled("ingest.store.writers._bucket_c")

HOUR = 3600
T0 = 1_790_000_000 // HOUR * HOUR
INT64 = (-(2**63), 2**63 - 1)


def kind(value: object) -> type:
    """The type of ``value``, each twin's ``BsonDate`` class being the same type."""
    return python.BsonDate if isinstance(value, twin.BsonDate) else type(value)


def same(a: object, b: object, where: str = "") -> None:
    """``a`` and ``b`` are the same value: types, key order, float bits, date instants."""
    assert kind(a) is kind(b), (where, a, b)
    if isinstance(a, dict):
        assert isinstance(b, dict)
        assert list(a) == list(b), where
        for key in a:
            same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list)
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert isinstance(b, float)
        assert struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b)), (
            where,
            a,
            b,
        )
    elif isinstance(a, python.BsonDate):
        assert isinstance(b, twin.BsonDate)
        same(a.ms, b.ms, f"{where}.ms")
    else:
        assert a == b, (where, a, b)


def encoded(op: dict[str, Any]) -> bytes | str:
    try:
        return bson.encode(op)
    except Exception as exc:  # noqa: BLE001 - the twins must fail alike
        return f"{type(exc).__name__}: {exc}"


def decoded(op: Any) -> Any:
    """A statement as dicts, written as bytes or not (an int64 read back is an int)."""
    if isinstance(op, RawBSONDocument):
        op = bson.decode(op.raw)
    if isinstance(op, dict):
        return {key: decoded(value) for key, value in op.items()}
    if isinstance(op, list):
        return [decoded(value) for value in op]
    return int(op) if isinstance(op, bson.Int64) else op


def same_plan(want: Plan, got: Plan) -> None:
    assert len(want.ops) == len(got.ops)
    for i, (op, other) in enumerate(zip(want.ops, got.ops, strict=True)):
        if isinstance(other, RawBSONDocument):  # written by the kernel: the driver's bytes
            assert other.raw == bson.encode(op), f"ops[{i}]"
        else:
            same(op, other, f"ops[{i}]")
    assert [encoded(op) for op in want.ops] == [encoded(op) for op in got.ops]
    assert [[id(r) for r in group] for group in want.groups] == [
        [id(r) for r in group] for group in got.groups
    ]
    assert [id(r) for r in want.deferred] == [id(r) for r in got.deferred]
    assert (want.duplicates, want.conflicts, want.lookup) == (
        got.duplicates,
        got.conflicts,
        got.lookup,
    )


def both(
    readings: list[Reading], span: int = HOUR, limit: int = 3600, size: int | None = None
) -> Plan | None:
    """Plan with both twins; the plans (or exceptions) must agree. The Python plan."""
    cap = python.MAX_BUCKET_BYTES if size is None else size
    try:
        want = python.plan_buckets(readings, span, limit, cap)
    except Exception as exc:  # noqa: BLE001
        failed: Exception | None = exc
    else:
        failed = None
    if failed is not None:
        with pytest.raises(type(failed)) as caught:
            twin.plan_buckets(readings, span, limit, cap)
        assert str(caught.value) == str(failed)
        return None
    got = twin.plan_buckets(readings, span, limit, cap)
    same_plan(want, got)
    return want


# --- generated batches ---------------------------------------------------------------

SHARED_TAGS = [{"path": "/"}, {"host": "h", "cpu": "cpu0"}, {}]
names = st.sampled_from(["t", "h", "v", "temp", "Влажность", "x" * 40])
ints = st.sampled_from([0, 1, -1, 7, 2**31, 2**53, 2**53 + 1, -(2**53) - 1, *INT64])
floats = st.sampled_from([0.0, -0.0, 1e300, -1e300, 1.5, -2.25, 5e-324, 2.0**53 + 2]) | st.floats(
    allow_nan=False, allow_infinity=False, width=64
)
numbers = ints | floats


@st.composite
def a_series(draw: st.DrawFn) -> tuple[str, dict[str, str] | None]:
    sensor = draw(st.sampled_from(["s1", "s2", "Кухня", "s" * 64]))
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return sensor, None  # the default decoder's reading
    if kind == 1:
        return sensor, draw(st.sampled_from(SHARED_TAGS))  # one dict, shared as topics share
    return sensor, draw(
        st.dictionaries(st.sampled_from(["host", "path"]), st.sampled_from(["a", "b"]), max_size=2)
    )


@st.composite
def a_reading(draw: st.DrawFn, span: int = HOUR) -> Reading:
    sensor, tags = draw(a_series())
    # around span boundaries: the instant's ms, and an epoch a few ms either side of it
    ms = T0 * 1000 + draw(
        st.sampled_from([0, 1, 2, 999, span * 1000 - 1, span * 1000, -1, 2 * span * 1000 + 7])
    )
    mapping = tags is not None
    kinds = numbers | st.booleans() | st.text(max_size=5) if mapping else numbers
    values = draw(st.dictionaries(names, kinds, min_size=1, max_size=4))
    seq = draw(st.none() | st.integers(0, 2**63 - 1))
    units = info = None
    if mapping:
        units = (
            draw(
                st.none() | st.dictionaries(names, st.sampled_from(["Cel", "%", "°C"]), max_size=2)
            )
            or None
        )
        info = (
            draw(
                st.none()
                | st.dictionaries(
                    st.sampled_from(["model", "room"]), st.text(max_size=4), max_size=2
                )
            )
            or None
        )
    if draw(st.integers(0, 5)) == 0:  # timed by a datetime, as some callers build them
        return Reading(
            sensor,
            datetime.fromtimestamp(ms / 1000, UTC),
            ms / 1000,
            values,
            seq,
            None,
            tags,
            units,
            info,
        )
    return Reading(sensor, None, ms / 1000, values, seq, ms, tags, units, info)


@st.composite
def a_busy_batch(draw: st.DrawFn) -> list[Reading]:
    """Many readings of few series, mostly of one shape: groups to coalesce and split."""
    series = draw(st.lists(a_series(), min_size=1, max_size=2))
    shapes = draw(
        st.lists(st.lists(names, min_size=1, max_size=3, unique=True), min_size=1, max_size=2)
    )
    out = []
    for _ in range(draw(st.integers(1, 60))):
        sensor, tags = draw(st.sampled_from(series))
        ms = T0 * 1000 + draw(st.integers(-3, 4000)) * draw(st.sampled_from([1, 1000]))
        kinds = numbers | st.booleans() | st.text(max_size=3) if tags is not None else numbers
        values = {name: draw(kinds) for name in draw(st.sampled_from(shapes))}
        out.append(
            Reading(sensor, None, ms / 1000, values, draw(st.none() | st.integers(0, 9)), ms, tags)
        )
    return out


batches = st.lists(a_reading(), max_size=40) | a_busy_batch()


@given(
    batch=batches,
    limit=st.sampled_from([1, 2, 3, 3600]),
    size=st.none() | st.integers(100, 3000),
    span=st.sampled_from([60, HOUR]),
)
def test_the_twins_plan_the_same_statements(
    batch: list[Reading], limit: int, size: int | None, span: int
) -> None:
    both(batch, span, limit, size)


@given(batch=batches, span=st.sampled_from([60, HOUR]))
def test_both_twins_group_readings_by_series_and_span_in_arrival_order(
    batch: list[Reading], span: int
) -> None:
    # The plain definition: one group per (sensor, tags, start of span), in the order of
    # its first reading, its readings in arrival order (series interleaved, a sensor's
    # readings over two spans, tags shared and not).
    expected: dict[tuple[object, ...], list[Reading]] = {}
    for reading in batch:
        start = reading.epoch // span * span
        tags = tuple(sorted((reading.tags or {}).items()))
        expected.setdefault((reading.sensor_id, tags, start), []).append(reading)
    for grouped in (python.group_readings(batch, span), twin.group_readings(batch, span)):
        assert [(sensor, tuple(sorted(tags)), start) for sensor, tags, start, _ in grouped] == list(
            expected
        )
        assert [[id(r) for r in group] for *_, group in grouped] == [
            [id(r) for r in group] for group in expected.values()
        ]


@st.composite
def a_default_batch(draw: st.DrawFn) -> list[Reading]:
    """What the default decoder makes: readings of messages, one or many per message."""
    out: list[Reading] = []
    for _ in range(draw(st.integers(1, 12))):
        sensor = draw(st.sampled_from(["a", "b", "c"]))
        items = [
            {
                "ts": T0 + draw(st.integers(-5, 3 * HOUR)) + draw(st.integers(0, 999)) / 1000,
                "seq": draw(st.none() | st.integers(0, 10)),
                **draw(
                    st.dictionaries(
                        st.sampled_from(["t", "h", "temp"]), numbers, min_size=1, max_size=3
                    )
                ),
            }
            for _ in range(draw(st.integers(1, 5)))
        ]
        for item in items:
            if item["seq"] is None:
                del item["seq"]
        payload = json.dumps({"readings": items}).encode()
        decoded = decode(
            f"sensors/{sensor}/readings",
            payload,
            T0 + HOUR,
            Limits(max_past_seconds=10 * HOUR, max_future_seconds=10 * HOUR),
        )
        out.extend(decoded.readings)
    return out


@given(batch=a_default_batch(), limit=st.sampled_from([2, 3600]))
def test_the_twins_plan_the_decoders_readings_alike(batch: list[Reading], limit: int) -> None:
    assert both(batch, HOUR, limit) is not None


# Values of one BSON type each: a shape's readings keep their types.
OF_TYPE: dict[str, list[Scalar]] = {
    "int32": [0, -1, 7, 2**31 - 1, -(2**31)],
    "int64": [2**31, -(2**31) - 1, *INT64],
    "double": [0.5, -0.0, 1e300, -2.25],
}


@given(
    shapes=st.lists(
        st.tuples(
            st.dictionaries(
                st.sampled_from(["tpl_a", "tpl_b", "tpl_ü"]),
                st.sampled_from(sorted(OF_TYPE)),
                min_size=1,
                max_size=3,
            ),
            st.sampled_from([None, 5, 2**40]),
        ),
        min_size=1,
        max_size=3,
    ),
    picks=st.lists(st.integers(0, 4), min_size=30, max_size=30),
)
def test_single_readings_fill_their_shapes_templates_as_the_writer_writes_them(
    shapes: list[tuple[dict[str, str], int | None]], picks: list[int]
) -> None:
    """Compiled, a single reading's statement (one sensor, one reading in the batch: a
    large fleet's) is written once per shape (names in order, each value's and the seq's
    BSON type) and filled in for the next readings of that shape: other sensor ids, of any
    length (ASCII; another one is written whole), other times, seqs and numbers. The
    bytes are the Python twin's, and most statements come from a template."""
    readings: list[Reading] = []
    for i in range(30):
        types, seq = shapes[i % len(shapes)]
        values = {
            name: OF_TYPE[kind][(picks[i] + k) % len(OF_TYPE[kind])]
            for k, (name, kind) in enumerate(types.items())
        }
        sensor = ("Кухня" if i == 7 else "s" * (1 + i * 7 % 90)) + str(i)  # each its own
        ms = T0 * 1000 + i * 1_234_567
        readings.append(
            Reading(sensor, None, ms / 1000, values, None if seq is None else seq + i, ms)
        )
    filled = twin.templates_filled()
    both(readings, HOUR, 3600)
    # Every reading but the first of each shape (twice, should the templates held be
    # dropped at their bound meanwhile), and the one of a non-ASCII sensor id.
    assert twin.templates_filled() - filled >= len(readings) - 2 * len(shapes) - 1
    assert python.templates_filled() == 0  # as Python, every statement is a dict


def test_a_template_fills_every_slot_it_recorded() -> None:
    """The second reading of a shape fills the first one's template: its own sensor id
    (longer and shorter), time, seq and values, none left from the first."""
    first = Reading("s1", None, T0 + 1.0, {"tpl_x": 1, "tpl_y": 2.5}, 7, T0 * 1000 + 1000)
    filled = twin.templates_filled()
    for sensor in ("s" * 70, "s"):
        second = Reading(sensor, None, T0 + 2.0, {"tpl_x": 3, "tpl_y": -4.5}, 8, T0 * 1000 + 2000)
        plan = both([first, second, first._replace(sensor_id="t" + sensor)], HOUR, 3600)
        assert plan is not None
    assert twin.templates_filled() - filled >= 4
    op = twin.plan_buckets([second], HOUR, 3600).ops[0]
    doc = bson.decode(bson.encode(op))
    at = datetime.fromtimestamp(T0 + 2, UTC).replace(tzinfo=None)  # as bson.decode gives it
    assert doc["q"]["sensor_id"] == "s"
    assert doc["q"]["readings.ts"]["$nin"] == [at]
    assert doc["u"]["$push"]["readings"]["$each"] == [
        {"ts": at, "seq": 8, "tpl_x": 3, "tpl_y": -4.5}
    ]
    assert doc["u"]["$inc"]["stats.tpl_x.sum"] == 3.0
    assert doc["u"]["$min"] == {"first_ts": at, "stats.tpl_x.min": 3, "stats.tpl_y.min": -4.5}
    assert doc["u"]["$max"] == {"last_ts": at, "stats.tpl_x.max": 3, "stats.tpl_y.max": -4.5}


# --- hostile input: the same plan, or the same exception ---------------------------------


def r(
    sensor: Any = "s",
    epoch: Any = T0 + 0.5,
    values: Any = None,
    ms: Any = T0 * 1000 + 500,
    tags: Any = None,
    **rest: Any,
) -> Reading:
    return Reading(
        sensor,
        None,
        epoch,
        {"v": 1.0} if values is None else values,
        rest.get("seq"),
        ms,
        tags,
        rest.get("units"),
        rest.get("info"),
    )


class Odd(Reading):
    """A subclass of Reading: not the decoders' own tuples."""


HOSTILE: list[tuple[str, Any, Any, Any]] = [
    ("an int epoch", [r(epoch=T0), r(epoch=T0 + 1, ms=T0 * 1000 + 1000)], HOUR, 3600),
    ("a NaN epoch", [r(epoch=math.nan)], HOUR, 3600),
    ("an infinite epoch", [r(epoch=-math.inf)], HOUR, 3600),
    ("an epoch of 1e300", [r(epoch=1e300)], HOUR, 3600),
    ("a float ms", [r(ms=1.5), r(ms=2.5)], HOUR, 3600),
    ("an ms beyond 64 bits", [r(ms=2**70), r(ms=2**70 + 1)], HOUR, 3600),
    ("no time at all", [r(ms=None)], HOUR, 3600),
    ("a string value without tags", [r(values={"v": "1.5"})], HOUR, 3600),
    (
        "a bool value without tags",
        [r(values={"v": True}), r(values={"v": False}, ms=1)],
        HOUR,
        3600,
    ),
    ("a None value", [r(values={"v": None}, tags={})], HOUR, 3600),
    ("an int too large for a float", [r(values={"v": 10**400})], HOUR, 3600),
    (
        "ints too large for a float",
        [r(values={"v": 10**400}), r(values={"v": 1}, ms=1)],
        HOUR,
        3600,
    ),
    ("a list of values", [r(values=[("v", 1.0)])], HOUR, 3600),
    ("a name that is not a string", [r(values={1: 1.0})], HOUR, 3600),
    ("a sensor that is not a string", [r(sensor=5), r(sensor=None)], HOUR, 3600),
    ("tags that are not a dict", [r(tags=[("a", "b")])], HOUR, 3600),
    ("tags that do not sort", [r(tags={1: "a", "b": "x"})], HOUR, 3600),
    ("units that are not strings", [r(tags={}, units={"v": 5})], HOUR, 3600),
    ("info that is not a dict", [r(tags={}, info="room")], HOUR, 3600),
    ("a short Reading", [tuple.__new__(Reading, ("s", None))], HOUR, 3600),
    ("a subclass of Reading", [Odd(*r())], HOUR, 3600),
    ("not a Reading", [("s", None, T0 + 0.5, {"v": 1.0}, None, 1, None, None, None)], HOUR, 3600),
    ("a span of zero", [r()], 0, 3600),
    ("a float span", [r()], 60.0, 3600),
    ("a negative cap", [r(), r(ms=T0 * 1000 + 501)], HOUR, -1),
    ("a cap beyond 64 bits", [r(), r(ms=T0 * 1000 + 501)], HOUR, 2**64),
    (
        "ts and seq among the values",
        [r(values={"ts": 1, "seq": 2.5}, seq=3), r(values={"ts": 2, "seq": 2.5}, ms=T0 * 1000 + 9)],
        HOUR,
        3600,
    ),
    (
        "a reading larger than a document",
        [r(values={f"n{i}": 1.0 for i in range(200)})],
        HOUR,
        3600,
    ),
]


@pytest.mark.parametrize(
    ("readings", "span", "limit"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE]
)
def test_hostile_batches_get_the_same_plan_or_the_same_exception(
    readings: list[Any], span: int, limit: int
) -> None:
    both(readings, span, limit, 4000)


def test_a_batch_that_is_not_a_list_is_planned_alike() -> None:
    both((r(), r(ms=T0 * 1000 + 501)))  # type: ignore[arg-type]  # a tuple on purpose


# --- examples worth keeping --------------------------------------------------------------

LIMITS = [
    [
        r(values={"v": 2**63 - 1}),
        r(values={"v": -(2**63)}, ms=T0 * 1000 + 501),
        r(values={"v": 2**53 + 1}, ms=T0 * 1000 + 502),
    ],
    [
        r(values={"v": 0.0}),
        r(values={"v": -0.0}, ms=T0 * 1000 + 501),
        r(values={"v": 0}, ms=T0 * 1000 + 502),
    ],
    [
        r(values={"v": 1e300}),
        r(values={"v": 1e300}, ms=T0 * 1000 + 501),
        r(values={"v": -1e300}, ms=T0 * 1000 + 502),
    ],
    [r(values={"v": 1e308}), r(values={"v": 1e308}, ms=T0 * 1000 + 501)],
    [
        r(values={"v": 2**53}),
        r(values={"v": float(2**53)}, ms=T0 * 1000 + 501),
        r(values={"v": 2**53 + 1}, ms=T0 * 1000 + 502),
    ],
    [
        r(values={"v": 2**80}),
        r(values={"v": 2.0**80}, ms=T0 * 1000 + 501),
        r(values={"v": 2**80 + 1}, ms=T0 * 1000 + 502),
        r(values={"v": 2**80}, ms=T0 * 1000 + 3),
    ],
    [
        r(epoch=-0.0, ms=0),
        r(epoch=0.0, ms=1),
        r(epoch=-0.5, ms=-500),
        r(epoch=-3600.0, ms=-3600_000),
    ],
    [
        r(epoch=T0 - 0.001, ms=T0 * 1000 - 1),
        r(epoch=float(T0), ms=T0 * 1000),
        r(epoch=T0 + HOUR - 0.001, ms=(T0 + HOUR) * 1000 - 1),
    ],
    [
        r(ms=T0 * 1000 + 3),
        r(ms=T0 * 1000 + 1),
        r(ms=T0 * 1000 + 2),
        r(ms=T0 * 1000 + 1, values={"w": 2.0}),
    ],
]


@pytest.mark.parametrize(
    "batch",
    LIMITS,
    ids=[
        "int64 limits",
        "signed zeros",
        "1e300",
        "a sum beyond the largest float",
        "2**53 and around",
        "ints beyond 64 bits",
        "around the epoch",
        "span boundaries",
        "out of order and merged",
    ],
)
def test_limits_of_numbers_and_spans_are_planned_alike(batch: list[Reading]) -> None:
    assert both(batch) is not None
    assert both(batch, 60, 2) is not None


def test_the_daemon_plans_and_dates_with_the_compiled_twin() -> None:
    assert bucket.plan_buckets is twin.plan_buckets
    assert bucket.BsonDate is twin.BsonDate
    assert type(bucket.bson_date(1)) is twin.BsonDate


def test_the_compiled_twin_writes_the_statements_of_lone_readings_and_groups_as_bytes() -> None:
    """A sensor-hour of one reading (a large fleet's usual group), of the default decoder
    or of the mapping path (tags, a string, a boolean, units, info), and a group of the
    default decoder's readings are written as bytes; a reading the kernel is not sure of
    (a measurement named like a pushed field, an int beyond 64 bits) stays a dict."""
    at = T0 * 1000
    single = Reading("a", None, T0, {"t": 1.5, "n": 2}, 7, at)
    group = [Reading("b", None, T0 + i, {"t": float(i)}, None, at + i * 1000) for i in range(3)]
    values: dict[str, Scalar] = {"t": 1.5, "on": True, "state": "ok"}
    mapped = Reading("c", None, T0, values, None, at, {"room": "k"}, {"t": "°C"}, {"fw": "1"})
    strings = Reading("e", None, T0, {"state": "ok"}, None, at, {})
    named_seq = Reading("d", None, T0, {"seq": 1.5}, None, at)
    huge = Reading("f", None, T0, {"n": 2**64}, None, at)
    for batch in ([single], group, [mapped], [strings], [named_seq], [huge]):
        assert both(batch) is not None
    raw = [
        isinstance(twin.plan_buckets(batch, HOUR, 3600).ops[0], RawBSONDocument)
        for batch in ([single], group, [mapped], [strings], [named_seq], [huge])
    ]
    assert raw == [True] * 4 + [False] * 2


@given(ms=st.integers() | st.floats(allow_nan=False))
def test_int_of_a_date_is_its_milliseconds_in_both_twins(ms: float) -> None:
    for module in (python, twin):
        date = module.bson_date(ms)  # any value, as the slot takes it
        assert module.BsonDate.__int__(date) is ms


def test_int_of_a_date_without_milliseconds_fails_alike() -> None:
    for module in (python, twin):
        empty = object.__new__(module.BsonDate)
        with pytest.raises(AttributeError, match="has no attribute 'ms'"):
            int(empty)


@st.composite
def a_shuffled_group(draw: st.DrawFn) -> list[Reading]:
    """One sensor-hour of the default decoder's readings, their names in varying order."""
    out: list[Reading] = []
    count = draw(st.integers(2, 30))
    stamps = draw(st.lists(st.integers(0, HOUR * 1000 - 1), min_size=count, max_size=count))
    for i, offset in enumerate(dict.fromkeys(stamps)):  # each its own millisecond
        names_here = draw(st.lists(names, min_size=1, max_size=4, unique=True))
        values: dict[str, Scalar] = {name: draw(numbers) for name in names_here}
        ms = T0 * 1000 + offset
        out.append(Reading("s", None, ms / 1000, values, i, ms))
    return out


def plain_statistics(group: list[Reading]) -> dict[str, tuple[int, float, object, object]]:
    """count, the float sum in reading order, and the first minimum and maximum of each name."""
    columns: dict[str, list[Any]] = {}
    for reading in group:
        for name, value in reading.values.items():
            columns.setdefault(name, []).append(value)
    out = {}
    for name, column in columns.items():
        total = float(column[0])
        for value in column[1:]:
            total += value
        out[name] = (len(column), total, min(column), max(column))
    return out


@given(group=a_shuffled_group())
def test_statistics_do_not_depend_on_the_order_of_a_readings_names(group: list[Reading]) -> None:
    # The planner finds a measurement's statistics by its position among a reading's
    # names before looking its name up: names in another order must count the same.
    want = plain_statistics(group)
    for module in (python, twin):
        (op,) = module.plan_buckets(group, HOUR, 3600).ops
        update = decoded(op)["u"]
        assert update["$inc"]["count"] == len(group)
        assert update["$inc"]["bytes"] == sum(python.reading_bytes(r) for r in group)
        for name, (count, total, low, high) in want.items():
            assert update["$inc"][f"stats.{name}.count"] == count
            same(update["$inc"][f"stats.{name}.sum"], total, name)
            same(update["$min"][f"stats.{name}.min"], low, name)
            same(update["$max"][f"stats.{name}.max"], high, name)
        assert len(update["$inc"]) == 2 + 2 * len(want)

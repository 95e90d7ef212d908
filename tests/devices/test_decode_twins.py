"""The default format's decoder: the Python function and its compiled twin agree on
every input, hostile ones included (results, types, key order, Arrivals, exceptions)."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import orjson
import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from ingest.devices._decode_py import _sensor_ok as sensor_ok_py
from ingest.devices._decode_py import decode as decode_py
from ingest.devices._decode_py import value_count as value_count_py
from ingest.devices.decode import Arrivals, Limits
from ingest.model import RESERVED_FIELDS, SENSOR_ID_PATTERN, Decoded, Rejection
from tests.support.twins import compiled

if TYPE_CHECKING:
    from collections.abc import Callable

twin = compiled("ingest.devices._decode_c")

NOW = 1_790_000_000.25
TOPIC = "sensors/abc/readings"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
WIDE = Limits(max_past_seconds=math.inf, max_future_seconds=math.inf)


def shape(out: object) -> tuple[object, ...]:
    """``out`` with the type of every part, so 1 and 1.0 (or a list and a tuple) differ,
    and with every dict as its items in order."""
    if isinstance(out, dict):
        return ("dict", [(shape(k), shape(v)) for k, v in out.items()])
    if isinstance(out, (list, tuple)):
        return (type(out).__name__, [shape(item) for item in out])
    if isinstance(out, float):  # -0.0 and NaN too
        return ("float", repr(out))
    if isinstance(out, Rejection):
        return ("Rejection", out.reason, out.detail, shape(out.index))
    return (type(out).__name__, out)


def outcome(call: Any) -> tuple[object, ...]:
    """What the call returned, with types, or the exception it raised (type and text)."""
    try:
        out = call()
    except Exception as exc:  # noqa: BLE001 - the exception is the outcome compared
        return ("raised", type(exc).__name__, str(exc))
    assert type(out) is Decoded
    assert all(type(part) is list for part in out)
    return shape(out)


def arrivals_like(state: tuple[int, int, dict[str, int]] | None) -> Arrivals | None:
    if state is None:
        return None
    slot, stride, last = state
    arrivals = Arrivals()
    arrivals.spread(slot, stride)
    arrivals._last.update(last)
    return arrivals


def agree(
    topic: object,
    payload: object,
    received_at: object,
    limits: object,
    sensor: object = None,
    state: tuple[int, int, dict[str, int]] | None = None,
) -> tuple[object, ...]:
    """Run both twins on the same input (each on its own copy of the Arrivals state):
    the same outcome and the same arrival times left behind. Returns the outcome."""
    arrivals_py, arrivals_c = arrivals_like(state), arrivals_like(state)
    # The arguments may be of any type on purpose: the twins must refuse them alike.
    decode_any: Callable[..., object] = decode_py
    expected = outcome(lambda: decode_any(topic, payload, received_at, limits, sensor, arrivals_py))
    got = outcome(lambda: twin.decode(topic, payload, received_at, limits, sensor, arrivals_c))
    assert got == expected
    if arrivals_py is not None and arrivals_c is not None:
        assert list(arrivals_c._last.items()) == list(arrivals_py._last.items())
    return expected


# --------------------------------------------------------------------------- generators

ALPHABET = "abcXYZ019_-"
NAMES = st.text(ALPHABET, min_size=1, max_size=6) | st.sampled_from(
    sorted(
        RESERVED_FIELDS
        | {"readings", "temp", "hum", "a" * 64, "a" * 65, "", "$gt", "a.b", "tëmp", "t\x00", "TS"}
    )
)
INTS = st.integers(INT64_MIN, INT64_MAX) | st.sampled_from(
    [INT64_MIN, INT64_MAX, INT64_MAX + 1, 2**64 - 1, 0, -1]
)
FLOATS = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [1e300, -1e300, 1.0000000000000002e300, 2.0**63, -(2.0**63), 5e-324, -0.0]
)
SCALARS = st.none() | st.booleans() | INTS | FLOATS | st.text(max_size=8)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3),
    max_leaves=6,
)
SENSORS = (
    st.text(ALPHABET, min_size=1, max_size=8)
    | st.text(max_size=4)  # control characters, any Unicode
    | st.sampled_from(["x" * 128, "x" * 129, "\x7f", "\x9f", "\xa0", "s/1", ""])
    | st.none()
    | st.integers(0, 9)
    | st.booleans()
)
# Epoch seconds in and around the window of NOW, as ints, floats and ISO-8601 strings.
OFFSETS = st.floats(-2 * 365 * 86400.0, 2000.0) | st.sampled_from(
    [-365 * 86400.0, 600.0, 600.0000001, -365 * 86400.0 - 1e-6, 0.0, 0.4999995, 0.0000005]
)
# Any type: a time of the wrong type is refused alike too.
TIMES: st.SearchStrategy[object] = (
    OFFSETS.map(lambda s: NOW + s)
    | OFFSETS.map(lambda s: int(NOW + s))
    | OFFSETS.map(lambda s: int(NOW + s) + 0.9999995)
    | st.integers(INT64_MIN, 2**64 - 1)
    | FLOATS
    | st.sampled_from(
        [
            "2026-09-21T14:13:20Z",
            "2026-09-21T14:13:20.123456+02:00",
            "2026-09-21T14:13:20",
            "2026-09-21",
            "yesterday",
            "",
            "9999-12-31T23:59:59Z",
            "0001-01-01T00:00:00+00:00",
        ]
    )
    | st.none()
    | st.booleans()
    | st.just([])
    | st.just({})
)
SEQS = st.none() | INTS | st.sampled_from([-1, 2**63, 2**64 - 1, 1.0, "1", True])


# What a well-formed reading holds (a valid one is more likely to reach every check).
GOOD_NAMES = st.text(ALPHABET, min_size=1, max_size=6) | st.sampled_from(
    ["_id", "tags", "units", "a" * 64]
)
GOOD_TIMES = (
    OFFSETS.map(lambda s: NOW + s)
    | OFFSETS.map(lambda s: int(NOW + s))
    | st.sampled_from(
        [
            "2026-09-21T14:13:20Z",
            "2026-09-21T16:13:20.5+02:00",
            "2026-09-21T14:13:20",
            "2026-09-21 14:13:20.000001+00:00",
        ]
    )
)


@st.composite
def readings(draw: st.DrawFn) -> object:
    """A reading object: half of them well formed, the others with any part wrong."""
    if draw(st.integers(0, 30)) == 0:
        return draw(SCALARS | st.lists(SCALARS, max_size=2))
    good = draw(st.booleans())
    item: dict[str, object] = {}
    for key, strategy in (
        ("sensor_id", st.text(ALPHABET, min_size=1) if good else SENSORS),
        ("ts", GOOD_TIMES if good else TIMES),
        ("seq", st.integers(0, INT64_MAX) if good else SEQS),
    ):
        if draw(st.booleans()):
            item[key] = draw(strategy)
    item.update(
        draw(
            st.dictionaries(GOOD_NAMES, INTS | FLOATS, min_size=1, max_size=4)
            if good
            else st.dictionaries(NAMES, INTS | FLOATS | VALUES, max_size=5)
        )
    )
    # The reserved keys anywhere in the order, not only first.
    keys = draw(st.permutations(list(item)))
    return {key: item[key] for key in keys}


@st.composite
def documents(draw: st.DrawFn) -> object:
    """A message's JSON: one reading, an array, an envelope, or something else."""
    kind = draw(st.sampled_from(["one", "one", "array", "envelope", "other"]))
    if kind == "one":
        return draw(readings())
    if kind == "array":
        return draw(st.lists(readings(), max_size=5))
    if kind == "other":
        return draw(VALUES)
    envelope: dict[str, object] = {"readings": draw(st.lists(readings(), max_size=5) | VALUES)}
    if draw(st.booleans()):
        envelope["sensor_id"] = draw(SENSORS)
    for key in draw(st.lists(NAMES, max_size=7)):
        envelope.setdefault(key, 1)
    return envelope


def serialised(doc: object) -> bytes:
    return orjson.dumps(doc)


# Raw bytes: JSON spellings orjson refuses or reads differently, non-UTF-8, deep nesting.
HOSTILE = st.sampled_from(
    [
        b"",
        b"{",
        b"[",
        b"null",
        b"NaN",
        b'{"t": NaN}',
        b'{"t": Infinity}',
        b'{"t": 1e400}',
        b'{"t": -1e400}',
        b'{"t": 1e-400}',
        b'{"t": 18446744073709551616}',
        b'{"t": -9223372036854775809}',
        b'{"t": 1, "t": 2.5}',
        b'{"ts": 1, "ts": "x", "t": 1}',
        b'{"t": "\xff"}',
        b"\xff\xfe",
        b'{"t": "\\ud800"}',
        b'{"t\x00": 1}',
        b"[" * 2000,
        b'{"a":' * 1100 + b"1" + b"}" * 1100,
        b"[]",
        b"{}",
        b'{"readings": []}',
        b'{"readings": {}}',
        b'{"readings": null}',
        b'{"readings": [[]]}',
        b"[{}, [], 1]",
        b'\xef\xbb\xbf{"t": 1}',
        b' {"t": 1} ',
        b'{"t": 1} x',
        b'"text"',
        b"1",
        b"true",
    ]
)


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(HOSTILE)
    if kind == 1:
        return draw(st.binary(max_size=40))
    data = serialised(draw(documents()))
    if kind == 2 and data:  # cut short, or one byte replaced
        at = draw(st.integers(0, len(data) - 1))
        return data[:at] if draw(st.booleans()) else data[:at] + b"\xc3" + data[at + 1 :]
    return data


TOPICS = st.sampled_from(
    [
        TOPIC,
        "sensors/s1/readings",
        "sensors/s1",
        "sensors",
        "",
        "/",
        "sensors//readings",
        "/abc",
        "a/\x01/b",
        "a/é/b",
        "a/b/c/d",
        "a/" + "x" * 129,
    ]
) | st.text(max_size=12)
RECEIVED = st.sampled_from(
    [NOW, NOW + 0.0005, 1_700_000_000.9999995, 0.0, -1.5, 1e15, 1e16, math.nan, math.inf]
) | st.floats(0, 4e9)
LIMITS = st.builds(
    Limits,
    max_message_bytes=st.sampled_from([1024 * 1024, 0, 10, 60]),
    max_readings=st.sampled_from([10_000, 0, 1, 2, -1]),
    max_past_seconds=st.sampled_from([365 * 86400.0, 0.0, 1.0, math.inf, 1e300, 3600]),
    max_future_seconds=st.sampled_from([600.0, 0.0, math.inf, math.nan, 2**60]),
) | st.just(Limits())
STATES = st.none() | st.tuples(
    st.integers(0, 3),
    st.sampled_from([1, 1, 2, 4]),
    st.dictionaries(
        st.sampled_from(["abc", "s1", "x"]),
        st.integers(int(NOW * 1000) - 5, int(NOW * 1000) + 5),
        max_size=2,
    ),
)


# --------------------------------------------------------------------------- properties


@given(
    topic=TOPICS,
    payload=payloads(),
    received_at=RECEIVED,
    limits=LIMITS,
    sensor=st.none() | SENSORS,
    state=STATES,
)
def test_the_twins_agree_on_any_message(
    topic: str,
    payload: bytes,
    received_at: float,
    limits: Limits,
    sensor: object,
    state: tuple[int, int, dict[str, int]] | None,
) -> None:
    agree(topic, payload, received_at, limits, sensor, state)


@given(doc=documents(), state=STATES)
@example(doc=[{"t": 1}, {"t": 2}, {"ts": 5, "t": 3}], state=(0, 1, {}))
def test_the_twins_agree_on_the_daemon_s_arguments(
    doc: object, state: tuple[int, int, dict[str, int]] | None
) -> None:
    agree(TOPIC, serialised(doc), NOW, Limits(), None, state)


@given(
    st.floats(allow_nan=False)
    | st.integers(-(2**64), 2**64)
    | st.integers(int(NOW) - 86400, int(NOW)).map(lambda s: s + 0.9999995)
    | st.integers(-(10**12), 10**12).map(lambda k: k / 1e4 + 0.00000049)
    # Fractions that round to a half or a whole second in microseconds, either side.
    | st.tuples(
        st.integers(-(10**10), 10**10),
        st.sampled_from(
            [0.5000004, 0.4999996, 0.9999996, 0.0000004, 0.5000005, 0.0000005, 0.9999995]
        ),
    ).map(sum)
    | st.sampled_from(
        [
            -62135596800.0,
            -62135596800.5,
            253402300799.0,
            253402300799.9999996,
            2.5e11,
            -2.5e11,
            2.5e11 - 0.5,
            1e20,
            -1e20,
            0.5,
            -0.5,
            -0.0000005,
        ]
    )
)
def test_the_twins_store_the_same_millisecond_for_any_time(epoch: float) -> None:
    """Every time a window lets through, year 1 to 9999 and beyond (where both raise)."""
    text = repr(epoch) if isinstance(epoch, float) else str(epoch)
    agree(TOPIC, b'{"ts": %s, "t": 1}' % text.encode(), NOW, WIDE)


# --------------------------------------------------------------------------- examples


@pytest.mark.parametrize(
    "payload",
    [
        b'{"ts": 1790000000, "temp": 21.5, "hum": 40}',
        b'{"temp": 21.5, "hum": 40, "seq": 3}',
        b'{"ts": 1790000000.123456, "temp": 21.5, "seq": 9223372036854775807}',
        b'{"ts": 1790000000, "temp": 9223372036854775808, "big": 18446744073709551615}',
        b'{"ts": 1790000000, "units": {"t": "C"}, "temp": 1, "tags": 3, "_id": "x"}',
        b'{"ts": 1790000000, "meta": 1, "info": null}',
        b'{"ts": "2026-09-21T14:13:20.5+00:00", "t": 1e300, "u": -1e300}',
        b'{"ts": "2026-09-21T16:13:20.000001+02:00", "t": 1}',
        b'{"ts": "2026-09-21T14:13:20", "t": 1}',
        b'{"ts": 1790000000, "t": 1.0000000000000002e300}',
        b'{"ts": 1790000000, "t": true}',
        b'{"ts": 1790000000, "seq": -1, "t": 1}',
        b'{"ts": 1790000000, "seq": 9223372036854775808, "t": 1}',
        b'{"sensor_id": "' + b"x" * 129 + b'", "t": 1}',
        b'{"sensor_id": "\\u007f", "t": 1}',
        b'{"ts": 1758464000, "t": 1}',  # 365 days back: the edge
        b'{"ts": 1790000600.25, "t": 1}',  # 600 s ahead: the edge
        b'{"ts": 1790000600.2500002, "t": 1}',
        b'{"readings": [{"t": 1}, {"t": "x"}, 3, {"ts": 1, "t": 1}], "sensor_id": "env"}',
        b'{"readings": [{"t": 1}], "a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "sensor_id": 1}',
        b'{"readings": [{"t": 1}], "' + b"k" * 100 + b'": 0}',
        b'{"readings": "many"}',
        b"[]",
        b"[" + b",".join(b'{"t": %d}' % i for i in range(10_001)) + b"]",
        b'{"readings": [' + b",".join(b'{"t": %d}' % i for i in range(300)) + b"]}",
    ],
)
@pytest.mark.parametrize("arrivals", [False, True])
def test_the_twins_agree_on_these(payload: bytes, arrivals: bool) -> None:
    agree(
        TOPIC, payload, NOW, Limits(), None, (0, 1, {"abc": int(NOW * 1000)}) if arrivals else None
    )


@pytest.mark.parametrize(
    "limits",
    [
        Limits(max_readings=0),
        Limits(max_readings=-3),
        Limits(max_message_bytes=5),
        Limits(10, 2, 1.0, 0.0),
        Limits(2**70),
        Limits(max_readings=2**64),
        Limits(max_past_seconds=2**60),
        Limits(max_future_seconds=2**53 + 1),
        Limits(max_past_seconds="x"),  # type: ignore[arg-type]  # ill-typed on purpose
        Limits(max_readings=1.5),  # type: ignore[arg-type]  # ill-typed on purpose
        Limits(max_message_bytes=True),  # a bool is an int to the type checker
    ],
)
def test_the_twins_agree_on_unusual_limits(limits: Limits) -> None:
    for payload in (
        b'{"t": 1}',
        b'[{"t": 1}, {"t": 2}, {"t": 3}]',
        b'{"readings": [{"t": 1}]}',
        b'{"ts": 1790000000.5, "t": 1}',
    ):
        agree(TOPIC, payload, NOW, limits)


@pytest.mark.parametrize(
    ("topic", "payload", "received_at"),
    [
        (b"sensors/abc/readings", b'{"t": 1}', NOW),  # a bytes topic
        (None, b'{"t": 1}', NOW),
        (TOPIC, '{"t": 1}', NOW),  # str, bytearray and memoryview payloads
        (TOPIC, bytearray(b'{"t": 1}'), NOW),
        (TOPIC, memoryview(b'{"t": 1}'), NOW),
        (TOPIC, "{", NOW),
        (TOPIC, 1, NOW),
        (TOPIC, b'{"t": 1}', 1_790_000_000),  # an int arrival time
        (TOPIC, b'{"t": 1}', True),
        (TOPIC, b'{"t": 1}', None),
        (TOPIC, b'{"t": 1}', math.nan),
        (TOPIC, b'{"t": 1}', -math.inf),
    ],
)
@pytest.mark.parametrize("arrivals", [False, True])
def test_the_twins_agree_on_arguments_of_other_types(
    topic: object, payload: object, received_at: object, arrivals: bool
) -> None:
    agree(topic, payload, received_at, Limits(), None, (1, 2, {}) if arrivals else None)


def test_a_limits_that_is_not_one_is_refused_alike() -> None:
    assert agree(TOPIC, b'{"t": 1}', NOW, object())[0] == "raised"


def test_the_arrival_times_are_given_in_the_same_order() -> None:
    payload = (
        b'[{"sensor_id": "a", "t": 1}, {"sensor_id": "b", "t": 1}, {"sensor_id": "a", '
        b'"t": 1}, {"sensor_id": "a", "seq": -1, "t": 1}, {"sensor_id": "a", "t": 2}]'
    )
    state = (1, 3, {"b": int(NOW * 1000) + 7})
    agree(TOPIC, payload, NOW, Limits(), None, state)
    out = twin.decode(TOPIC, payload, NOW, Limits(), None, arrivals_like(state))
    times = [r.ms for r in out.readings if r.sensor_id == "a"]
    # The rejected reading (bad seq) took its millisecond too, as decode_py's does.
    assert times == [1_790_000_000_251, 1_790_000_000_254, 1_790_000_000_260]
    assert [r.reason for r in out.rejections] == ["bad_seq"]


@given(st.lists(payloads(), max_size=8))
def test_the_twins_count_the_same_measurements(payloads: list[bytes]) -> None:
    """What a taken message holds is estimated from its readings' measurements: both
    count them alike, for any readings the decoder makes."""
    window = Limits(max_past_seconds=3e9, max_future_seconds=3e9)  # ts within 95 years
    readings = [r for p in payloads for r in decode_py(TOPIC, p, NOW, window).readings]
    assert twin.value_count(readings) == value_count_py(readings)
    assert value_count_py(readings) == sum(len(reading.values) for reading in readings)
    event(f"readings: {min(len(readings), 3)}+")


@given(
    st.text(max_size=130)
    | st.sampled_from(
        ["x" * 128, "x" * 129, "\x1f", " ", "~", "\x7f", "\x9f", "\xa0", "\U0001f600" * 128]
    )
)
def test_a_sensor_id_is_valid_by_its_characters_as_by_its_pattern(text: str) -> None:
    """A sensor id not cached is checked character by character first (compiled, in C):
    exactly the ids the rule's pattern matches."""
    expected = re.fullmatch(SENSOR_ID_PATTERN, text) is not None
    assert sensor_ok_py(text) is expected
    assert twin._sensor_ok(text) is expected

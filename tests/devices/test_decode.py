"""Unit tests of the pure decoder: topic + payload bytes -> readings and rejections."""

from __future__ import annotations

import math
import re
import string
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest import caches
from ingest.devices.decode import (
    IDENTITY_REASONS,
    MAPPING_REASONS,
    REASONS,
    WRITE_REASONS,
    Arrivals,
    Limits,
    decode,
    sensor_from_topic,
)
from ingest.model import (
    NAME_PATTERN,
    RESERVED_FIELDS,
    SENSOR_ID_PATTERN,
    Decoded,
    Reading,
    Rejection,
)


def to_millisecond(ts: datetime) -> datetime:
    """The instant as a BSON date holds it (milliseconds, truncated)."""
    return ts.replace(microsecond=ts.microsecond // 1000 * 1000)


# A fixed, recent arrival time: 2026-09-21T14:13:20Z.
NOW = 1_790_000_000.0
NOW_DT = datetime(2026, 9, 21, 14, 13, 20, tzinfo=UTC)
LIMITS = Limits()
TOPIC = "sensors/abc/readings"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def run(payload: object, topic: str = TOPIC, limits: Limits = LIMITS) -> Decoded:
    """Decode ``payload``: bytes as they are, anything else serialised with orjson."""
    data = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    return decode(topic, data, NOW, limits)


def reasons(out: Decoded) -> list[str]:
    return [rejection.reason for rejection in out.rejections]


def rejected(out: Decoded) -> Rejection:
    """The single rejection of a message that produced nothing else."""
    assert out.readings == []
    assert len(out.rejections) == 1, out.rejections
    return out.rejections[0]


def accepted(out: Decoded) -> Reading:
    """The single reading of a message that produced nothing else."""
    assert out.rejections == [], out.rejections
    assert len(out.readings) == 1
    return out.readings[0]


def typed(values: dict[str, Any]) -> dict[str, tuple[type, Any]]:
    """Values with their types, so ``1`` and ``1.0`` compare as different."""
    return {key: (type(value), value) for key, value in values.items()}


# --------------------------------------------------------------------------- shapes


def test_single_object_is_one_reading() -> None:
    reading = accepted(run({"sensor_id": "s1", "ts": NOW - 10, "temp": 21.5, "hum": 40}))
    assert reading.sensor_id == "s1"
    assert typed(reading.values) == {"temp": (float, 21.5), "hum": (int, 40)}
    assert reading.epoch == NOW - 10
    assert reading.seq is None


def test_array_of_objects_keeps_order() -> None:
    out = run([{"sensor_id": "a", "v": 1}, {"sensor_id": "b", "v": 2}, {"sensor_id": "c", "v": 3}])
    assert out.rejections == []
    assert [(r.sensor_id, r.values) for r in out.readings] == [
        ("a", {"v": 1}),
        ("b", {"v": 2}),
        ("c", {"v": 3}),
    ]


def test_envelope_sensor_id_applies_to_every_reading_and_beats_the_topic() -> None:
    out = run({"sensor_id": "s1", "readings": [{"ts": NOW - 1, "t": 1}, {"t": 2}]})
    assert out.rejections == []
    assert [(r.sensor_id, r.values, r.epoch) for r in out.readings] == [
        ("s1", {"t": 1}, NOW - 1),
        ("s1", {"t": 2}, NOW),
    ]


def test_envelope_without_sensor_id_falls_back_to_the_topic() -> None:
    out = run({"readings": [{"t": 1}, {"sensor_id": "inner", "t": 2}]})
    assert [r.sensor_id for r in out.readings] == ["abc", "inner"]


def test_reading_sensor_id_beats_the_envelope() -> None:
    out = run({"sensor_id": "outer", "readings": [{"sensor_id": "inner", "t": 1}, {"t": 2}]})
    assert [r.sensor_id for r in out.readings] == ["inner", "outer"]


def test_sensor_id_from_payload_beats_the_topic() -> None:
    assert accepted(run({"sensor_id": "s1", "t": 1})).sensor_id == "s1"


def test_sensor_id_from_the_topic() -> None:
    assert accepted(run({"t": 1}, topic="sensors/abc/readings")).sensor_id == "abc"


def test_inner_sensor_id_in_an_array_overrides_the_topic() -> None:
    out = run([{"sensor_id": "inner", "t": 1}, {"t": 2}], topic="sensors/abc/readings")
    assert out.rejections == []
    assert [r.sensor_id for r in out.readings] == ["inner", "abc"]


@pytest.mark.parametrize(
    ("topic", "sensor"),
    [
        ("sensors/abc/readings", "abc"),
        ("sensors/abc", "abc"),
        ("sensors/abc/x/y/z", "abc"),
        ("sensors", None),
        ("sensors/", None),
        ("sensors//readings", None),
        ("", None),
    ],
)
def test_sensor_from_topic(topic: str, sensor: str | None) -> None:
    assert sensor_from_topic(topic) == sensor


@pytest.mark.parametrize("topic", ["sensors", "sensors/", ""])
def test_topic_without_a_sensor_level_gives_no_sensor_id(topic: str) -> None:
    assert rejected(run({"t": 1}, topic=topic)).reason == "no_sensor_id"


def test_a_field_called_readings_turns_a_lone_object_into_an_envelope() -> None:
    """Documents the rule: any top-level object with a "readings" key is an envelope.

    So a measurement named ``readings`` is refused in a lone object, but accepted when
    the same reading is sent inside an array.
    """
    assert rejected(run({"readings": 5})).reason == "bad_shape"
    assert rejected(run({"readings": 5, "t": 1})).reason == "bad_shape"
    assert accepted(run([{"readings": 5}])).values == {"readings": 5}


# --------------------------------------------------------------------------- timestamps


def test_int_epoch_seconds() -> None:
    reading = accepted(run({"ts": 1_789_999_940, "t": 1}))
    assert reading.ts == datetime(2026, 9, 21, 14, 12, 20, tzinfo=UTC)
    assert reading.epoch == 1_789_999_940.0
    assert type(reading.epoch) is float


def test_float_epoch_seconds() -> None:
    reading = accepted(run({"ts": 1_789_999_999.25, "t": 1}))
    assert reading.ts == datetime(2026, 9, 21, 14, 13, 19, 250_000, tzinfo=UTC)
    assert reading.epoch == 1_789_999_999.25


@pytest.mark.parametrize(
    "text",
    [
        "2026-09-21T14:00:00Z",
        "2026-09-21T14:00:00+00:00",
        "2026-09-21T16:00:00+02:00",
        "2026-09-21T09:30:00-04:30",
    ],
)
def test_iso_8601_with_an_offset_is_the_right_utc_instant(text: str) -> None:
    reading = accepted(run({"ts": text, "t": 1}))
    assert reading.ts == datetime(2026, 9, 21, 14, 0, tzinfo=UTC)
    assert reading.ts.utcoffset() == timedelta(0)
    assert reading.ts.hour == 14  # expressed in UTC, not in the sender's offset
    assert reading.epoch == NOW - 800
    assert reading.epoch == reading.ts.timestamp()


def test_ts_is_kept_to_the_millisecond_as_bson_stores_it() -> None:
    reading = accepted(run({"ts": "2026-09-21T16:00:00.123956+02:00", "t": 1}))
    assert reading.ts == datetime(2026, 9, 21, 14, 0, 0, 123_000, tzinfo=UTC)
    assert accepted(run({"ts": NOW - 0.0001, "t": 1})).ts.microsecond == 999_000
    assert reading.epoch == pytest.approx(NOW - 800 + 0.123956, abs=1e-6)


@given(st.integers(int(NOW) - 86400 * 300, int(NOW) + 500))
def test_whole_second_ts_is_the_same_reading_as_the_equal_float(epoch: int) -> None:
    whole = accepted(run({"ts": epoch, "t": 1}))
    as_float = accepted(run({"ts": float(epoch), "t": 1}))
    assert whole == as_float
    assert type(whole.epoch) is float
    assert whole.ms == epoch * 1000
    assert whole.ts == datetime.fromtimestamp(epoch, UTC)


@pytest.mark.parametrize("payload", [{"t": 1}, {"ts": None, "t": 1}])
def test_absent_or_null_ts_is_the_arrival_time(payload: dict[str, Any]) -> None:
    reading = accepted(run(payload))
    assert reading.epoch == NOW
    assert reading.ts == NOW_DT


@pytest.mark.parametrize(
    "ts",
    [
        "2026-09-21T14:00:00",  # naive: no offset
        "2026-09-21",  # a date, also naive
        "yesterday",
        "",
        "1790000000",  # epoch as a string is not a number
        True,
        False,
        [NOW],
        {"epoch": NOW},
    ],
)
def test_bad_timestamp(ts: object) -> None:
    assert rejected(run({"ts": ts, "t": 1})).reason == "bad_timestamp"


@pytest.mark.parametrize(
    "ts",
    [
        0,
        1.5,
        "1970-01-01T00:00:00Z",
        4_102_444_800,
        "2100-01-01T00:00:00Z",
        "2100-01-01T02:00:00+02:00",
        -1,
        1e300,
    ],
)
def test_ts_out_of_window(ts: object) -> None:
    assert rejected(run({"ts": ts, "t": 1})).reason == "ts_out_of_window"


def test_window_edges_are_inclusive() -> None:
    oldest = NOW - LIMITS.max_past_seconds
    newest = NOW + LIMITS.max_future_seconds
    assert accepted(run({"ts": oldest, "t": 1})).epoch == oldest
    assert accepted(run({"ts": newest, "t": 1})).epoch == newest
    assert rejected(run({"ts": oldest - 1, "t": 1})).reason == "ts_out_of_window"
    assert rejected(run({"ts": newest + 1, "t": 1})).reason == "ts_out_of_window"


def test_window_follows_the_limits() -> None:
    narrow = Limits(max_past_seconds=60.0, max_future_seconds=5.0)
    assert accepted(run({"ts": NOW - 60, "t": 1}, limits=narrow)).epoch == NOW - 60
    assert rejected(run({"ts": NOW - 61, "t": 1}, limits=narrow)).reason == "ts_out_of_window"
    assert rejected(run({"ts": NOW + 6, "t": 1}, limits=narrow)).reason == "ts_out_of_window"


# --------------------------------------------------------------------------- one test per reason

TEN_MB = 10 * 1024 * 1024
NESTED_5000 = b"[" * 5000 + b"]" * 5000

# (reason, payload, topic, limits): every reason decode can produce (not WRITE_REASONS).
REASON_CASES: list[tuple[str, object, str, Limits]] = [
    ("too_large", b"\xff" * TEN_MB, TOPIC, LIMITS),
    ("invalid_utf8", b"\xff\xfe{", TOPIC, LIMITS),
    ("invalid_json", b'{"t": 1', TOPIC, LIMITS),
    ("bad_shape", "a string", TOPIC, LIMITS),
    ("no_readings", [], TOPIC, LIMITS),
    ("too_many_readings", [{"t": i} for i in range(4)], TOPIC, Limits(max_readings=3)),
    ("no_sensor_id", {"t": 1}, "sensors", LIMITS),
    ("bad_sensor_id", {"sensor_id": "a\nb", "t": 1}, TOPIC, LIMITS),
    ("bad_field_name", {"$set": 1}, TOPIC, LIMITS),
    ("bad_value", {"t": "22.5"}, TOPIC, LIMITS),
    ("bad_timestamp", {"ts": "2026-09-21T14:00:00", "t": 1}, TOPIC, LIMITS),
    ("ts_out_of_window", {"ts": 0, "t": 1}, TOPIC, LIMITS),
    ("bad_seq", {"seq": -1, "t": 1}, TOPIC, LIMITS),
    ("no_measurements", {"ts": NOW}, TOPIC, LIMITS),
]


@pytest.mark.parametrize(
    ("reason", "payload", "topic", "limits"), REASON_CASES, ids=[case[0] for case in REASON_CASES]
)
def test_each_reason(reason: str, payload: object, topic: str, limits: Limits) -> None:
    rejection = rejected(run(payload, topic=topic, limits=limits))
    assert rejection.reason == reason
    assert rejection.index is None
    assert rejection.detail


def test_reason_cases_cover_every_decoder_reason() -> None:
    expected = set(REASONS) - set(WRITE_REASONS) - set(MAPPING_REASONS) - set(IDENTITY_REASONS)
    assert {case[0] for case in REASON_CASES} == expected
    assert len(REASONS) == len(set(REASONS))


def test_too_large_is_refused_before_parsing() -> None:
    # Not UTF-8 and not JSON, yet the size check answers first.
    rejection = rejected(run(b"\xff" * TEN_MB))
    assert rejection.reason == "too_large"
    assert str(TEN_MB) in rejection.detail


def test_message_size_limit_is_inclusive() -> None:
    payload = orjson.dumps({"t": 1})
    exact = Limits(max_message_bytes=len(payload))
    assert accepted(run(payload, limits=exact)).values == {"t": 1}
    smaller = Limits(max_message_bytes=len(payload) - 1)
    assert rejected(run(payload, limits=smaller)).reason == "too_large"


@pytest.mark.parametrize("payload", [b"\xff\xfe{", b'{"t": "\xff"}', b'{"\xc3": 1}'])
def test_invalid_utf8(payload: bytes) -> None:
    assert rejected(run(payload)).reason == "invalid_utf8"


@pytest.mark.parametrize(
    "payload",
    [
        b'{"t": 1',  # truncated
        b'[{"t": 1}, {"t": 2}',
        b"",
        b"   ",
        b'{"t": 1}{"t": 2}',  # two documents
        b"{'t': 1}",  # single quotes
        b'\xef\xbb\xbf{"t": 1}',  # UTF-8 BOM
        b'{"t": "\\ud800"}',  # lone surrogate escape
        NESTED_5000,
        b'{"a":' * 5000 + b"1" + b"}" * 5000,
    ],
    ids=[
        "truncated",
        "truncated-array",
        "empty",
        "blank",
        "two-documents",
        "single-quotes",
        "bom",
        "lone-surrogate",
        "array-nested-5000",
        "object-nested-5000",
    ],
)
def test_invalid_json(payload: bytes) -> None:
    rejection = rejected(run(payload))
    assert rejection.reason == "invalid_json"
    assert len(rejection.detail) <= 200
    assert "\n" not in rejection.detail


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400"])
def test_non_finite_numbers_cannot_reach_a_value(literal: bytes) -> None:
    """orjson refuses NaN/Infinity literals and overflowing floats: the whole message is
    invalid_json, so no non-finite number can ever become a measurement (or a ts)."""
    assert rejected(run(b'{"t": ' + literal + b"}")).reason == "invalid_json"
    assert rejected(run(b'{"ts": ' + literal + b', "t": 1}')).reason == "invalid_json"


@pytest.mark.parametrize("number", [2**63, 2**64 - 1, 2**64, 2**70, -(2**63) - 1])
def test_integer_beyond_the_signed_64_bit_range_is_stored_as_a_double(number: int) -> None:
    """Documented rule: BSON has no wider integer and orjson reads integers past 2**64 as
    doubles, so every integer outside the signed 64-bit range becomes a double."""
    out = run(b'{"t": %d}' % number)
    assert out.rejections == []
    value = out.readings[0].values["t"]
    assert type(value) is float
    assert value == float(number)


@pytest.mark.parametrize("payload", ["x", 1, 1.5, True, None], ids=repr)
def test_bad_shape_top_level_scalar(payload: object) -> None:
    assert rejected(run(payload)).reason == "bad_shape"


def test_bad_shape_array_containing_a_string() -> None:
    out = run([{"t": 1}, "x"])
    assert [r.values for r in out.readings] == [{"t": 1}]
    assert [(r.reason, r.index) for r in out.rejections] == [("bad_shape", 1)]


@pytest.mark.parametrize("payload", [["x"], [1], [None], [[{"t": 1}]]], ids=repr)
def test_bad_shape_array_item_that_is_not_an_object(payload: list[object]) -> None:
    assert rejected(run(payload)).reason == "bad_shape"


@pytest.mark.parametrize("readings", ["x", 1, None, {"t": 1}], ids=repr)
def test_bad_shape_envelope_readings_not_a_list(readings: object) -> None:
    assert rejected(run({"sensor_id": "s1", "readings": readings})).reason == "bad_shape"


def test_bad_shape_envelope_with_extra_keys() -> None:
    rejection = rejected(run({"sensor_id": "s1", "readings": [{"t": 1}], "site": "x"}))
    assert rejection.reason == "bad_shape"
    assert "site" in rejection.detail


@pytest.mark.parametrize(
    "payload", [[], {"readings": []}, {"sensor_id": "s1", "readings": []}], ids=repr
)
def test_no_readings(payload: object) -> None:
    assert rejected(run(payload)).reason == "no_readings"


def test_too_many_readings_limit_is_inclusive() -> None:
    three = Limits(max_readings=3)
    assert len(run([{"t": i} for i in range(3)], limits=three).readings) == 3
    envelope = {"readings": [{"t": i} for i in range(4)]}
    assert rejected(run(envelope, limits=three)).reason == "too_many_readings"


def test_hundred_thousand_readings_is_one_rejection() -> None:
    payload = b"[" + b",".join([b'{"t":1}'] * 100_000) + b"]"
    assert len(payload) <= LIMITS.max_message_bytes  # so the size check is not what answers
    rejection = rejected(run(payload))
    assert rejection.reason == "too_many_readings"
    assert rejection.index is None


def test_null_sensor_id_does_not_fall_back_to_the_topic() -> None:
    """Documents the rule: an explicit ``"sensor_id": null`` means "no sensor", unlike
    ``"ts": null`` which means "arrival time"."""
    assert rejected(run({"sensor_id": None, "t": 1})).reason == "no_sensor_id"
    out = run({"sensor_id": None, "readings": [{"t": 1}]})
    assert rejected(out).reason == "no_sensor_id"


@pytest.mark.parametrize(
    "sensor",
    [
        "",
        "x" * 129,
        "x" * 200,
        42,
        4.2,
        True,
        ["a"],
        {"id": "a"},
        "a\n",
        "\x00",
        "a\x7f",
        "\x85",
    ],
    ids=repr,
)
def test_bad_sensor_id(sensor: object) -> None:
    assert rejected(run({"sensor_id": sensor, "t": 1})).reason == "bad_sensor_id"


def test_bad_sensor_id_in_envelope_and_topic() -> None:
    assert rejected(run({"sensor_id": 42, "readings": [{"t": 1}]})).reason == "bad_sensor_id"
    assert rejected(run({"t": 1}, topic="sensors/a\tb/readings")).reason == "bad_sensor_id"


@pytest.mark.parametrize(
    "sensor",
    [
        "a",
        "A-b_9",
        "x" * 128,
        "a/b",
        "$x",
        "a.b",
        "Living Room",
        "Küche",
        "Кухня",
        "客厅",
        "ü" * 128,
    ],
)
def test_good_sensor_ids_are_kept_exactly(sensor: str) -> None:
    assert accepted(run({"sensor_id": sensor, "t": 1})).sensor_id == sensor
    assert accepted(run({"t": 1}, topic=f"sensors/{sensor.replace('/', '_')}/x")).sensor_id == (
        sensor.replace("/", "_")
    )


def test_device_names_that_differ_stay_different_sensors() -> None:
    names = ["Кухня", "Спальня", "客厅", "Küche", "Kèche", "Living Room", "Living_Room"]
    assert [accepted(run({"t": 1}, topic=f"sensors/{n}/x")).sensor_id for n in names] == names


@pytest.mark.parametrize(
    "name",
    [
        "$set",
        "a.b",
        "x" * 10_000,
        "x" * 65,
        "",
        "a b",
        "tëmp",
        "a$",
        "\x00",
    ],
    ids=lambda name: repr(name[:20]),
)
def test_bad_field_name(name: str) -> None:
    rejection = rejected(run({name: 1}))
    assert rejection.reason == "bad_field_name"
    assert len(rejection.detail) < 200  # a huge key is not copied into the detail


def test_longest_field_name_is_accepted() -> None:
    assert accepted(run({"x" * 64: 1})).values == {"x" * 64: 1}


@pytest.mark.parametrize(
    "value",
    [
        "22.5",
        "",
        True,
        False,
        None,
        {"x": 1},
        [1],
        [],
    ],
    ids=repr,
)
def test_bad_value(value: object) -> None:
    assert rejected(run({"t": value})).reason == "bad_value"


@pytest.mark.parametrize("value", [INT64_MIN, INT64_MAX, 0, -1, 0.0, -0.0, 1e300, -1e300, 5e-324])
def test_int64_and_finite_float_values_are_kept_exactly(value: float) -> None:
    values = accepted(run({"t": value})).values
    assert typed(values) == {"t": (type(value), value)}


@pytest.mark.parametrize("seq", [-1, 1.5, 1.0, "1", True, False, [1], 2**63, 2**64 - 1], ids=repr)
def test_bad_seq(seq: object) -> None:
    assert rejected(run({"seq": seq, "t": 1})).reason == "bad_seq"


@pytest.mark.parametrize(("payload_seq", "seq"), [(0, 0), (INT64_MAX, INT64_MAX), (None, None)])
def test_good_seq(payload_seq: int | None, seq: int | None) -> None:
    reading = accepted(run({"seq": payload_seq, "t": 1}))
    assert reading.seq == seq
    assert reading.values == {"t": 1}


@pytest.mark.parametrize(
    "payload",
    [
        {"ts": NOW},
        {},
        {"sensor_id": "s1", "seq": 1, "ts": NOW},
        {"_id": 1, "meta": 2},
    ],
    ids=repr,
)
def test_no_measurements(payload: dict[str, Any]) -> None:
    assert rejected(run(payload)).reason == "no_measurements"


def test_ts_window_is_checked_before_measurements() -> None:
    """``{"ts": 1}`` alone is out of the window first; with a wide enough window the
    missing measurements are what is reported."""
    assert rejected(run({"ts": 1})).reason == "ts_out_of_window"
    wide = Limits(max_past_seconds=NOW)
    assert rejected(run({"ts": 1}, limits=wide)).reason == "no_measurements"


# --------------------------------------------------------------------------- per reading


def test_one_bad_reading_among_three() -> None:
    out = run([{"t": 1}, {"t": "bad"}, {"t": 3}])
    assert [r.values for r in out.readings] == [{"t": 1}, {"t": 3}]
    assert len(out.rejections) == 1
    assert out.rejections[0].reason == "bad_value"
    assert out.rejections[0].index == 1


def test_rejection_indexes_in_an_envelope() -> None:
    out = run({"sensor_id": "s1", "readings": [{"t": "x"}, {"t": 2}, {"seq": -1, "t": 3}]})
    assert [r.values for r in out.readings] == [{"t": 2}]
    assert [(r.reason, r.index) for r in out.rejections] == [("bad_value", 0), ("bad_seq", 2)]


def test_index_is_none_for_a_message_of_one_reading() -> None:
    assert rejected(run([{"t": "x"}])).index is None
    assert rejected(run({"readings": [{"t": "x"}]})).index is None


def test_reading_with_one_good_and_one_bad_measurement_is_rejected_whole() -> None:
    rejection = rejected(run({"good": 1, "bad": "x"}))
    assert rejection.reason == "bad_value"
    assert "bad" in rejection.detail


def test_reserved_keys_are_not_measurements() -> None:
    payload = {"ts": NOW - 5, "seq": 7, "sensor_id": "s1", "_id": "x", "meta": {"a": 1}, "t": 1}
    reading = accepted(run(payload))
    assert reading.values == {"t": 1}
    assert (reading.sensor_id, reading.seq, reading.epoch) == ("s1", 7, NOW - 5)


@pytest.mark.parametrize("key", ["_id", "meta", "units", "info", "tags"])
def test_numeric_id_and_meta_are_not_measurements_either(key: str) -> None:
    assert accepted(run({key: 5, "t": 1})).values == {"t": 1}


def test_duplicate_keys_last_one_wins() -> None:
    """orjson keeps the last of duplicate keys; decode sees only that one."""
    assert accepted(run(b'{"temp": 1, "temp": 2}')).values == {"temp": 2}
    # An earlier bad duplicate is invisible, a later bad one rejects the reading.
    assert accepted(run(b'{"temp": "x", "temp": 2}')).values == {"temp": 2}
    assert rejected(run(b'{"temp": 1, "temp": "x"}')).reason == "bad_value"
    reading = accepted(
        run(b'{"ts": 0, "ts": %d, "sensor_id": "a/b", "sensor_id": "ok", "t": 1}' % int(NOW))
    )
    assert (reading.epoch, reading.sensor_id) == (NOW, "ok")


# --------------------------------------------------------------------------- properties

_SENSOR_ID = re.compile(SENSOR_ID_PATTERN)
_NAME = re.compile(NAME_PATTERN)


def assert_well_formed(out: Decoded, limits: Limits = LIMITS) -> None:
    """What any decode result must look like, whatever the input."""
    assert isinstance(out, Decoded)
    for rejection in out.rejections:
        assert isinstance(rejection, Rejection)
        assert rejection.reason in REASONS
        assert rejection.reason not in WRITE_REASONS
        assert isinstance(rejection.detail, str)
        assert rejection.detail
    indexes = [r.index for r in out.rejections]
    if None in indexes:  # a whole-message rejection, or the only reading of a message
        assert indexes == [None]
        assert out.readings == []
    else:
        ints = [i for i in indexes if i is not None]
        assert ints == sorted(set(ints))
        assert all(type(i) is int and i >= 0 for i in ints)
    for reading in out.readings:
        assert isinstance(reading, Reading)
        assert _SENSOR_ID.fullmatch(reading.sensor_id)
        assert NOW - limits.max_past_seconds <= reading.epoch <= NOW + limits.max_future_seconds
        assert reading.ts == to_millisecond(datetime.fromtimestamp(reading.epoch, UTC))
        assert reading.seq is None or (type(reading.seq) is int and 0 <= reading.seq <= INT64_MAX)
        assert reading.values
        for name, value in reading.values.items():
            assert _NAME.fullmatch(name)
            assert name not in RESERVED_FIELDS
            if type(value) is int:
                assert INT64_MIN <= value <= INT64_MAX
            else:
                assert type(value) is float
                assert math.isfinite(value)


topics = st.sampled_from(["sensors/abc/readings", "sensors", "sensors/", ""]) | st.text(max_size=40)


@given(payload=st.binary(max_size=512), topic=topics)
def test_decode_never_raises_on_arbitrary_bytes(payload: bytes, topic: str) -> None:
    assert_well_formed(decode(topic, payload, NOW, LIMITS))


@given(
    prefix=st.sampled_from([b"{", b"[", b'{"t":', b'[{"ts":', b'{"readings":[']),
    body=st.binary(max_size=64),
    topic=topics,
)
def test_decode_never_raises_on_almost_json_bytes(prefix: bytes, body: bytes, topic: str) -> None:
    assert_well_formed(decode(topic, prefix + body, NOW, LIMITS))


KEYS = st.sampled_from(
    [*sorted(RESERVED_FIELDS), "readings", "t", "temp", "$set", "a.b", ""]
) | st.text(max_size=8)
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=INT64_MIN, max_value=2**64 - 1)  # what orjson can serialise
    | st.floats()
    | st.floats(min_value=NOW - 2 * LIMITS.max_past_seconds, max_value=NOW + 1000)
    | st.text(max_size=12)
    | st.sampled_from(["abc", "2026-09-21T14:00:00Z", "2026-09-21T14:00:00", "sënsor"])
)
JSON = st.recursive(
    LEAVES,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(KEYS, children, max_size=6),
    max_leaves=25,
)


@given(value=JSON, topic=topics)
def test_decode_never_raises_on_arbitrary_json(value: object, topic: str) -> None:
    assert_well_formed(decode(topic, orjson.dumps(value), NOW, LIMITS))


ALPHABET = string.ascii_letters + string.digits + "_-"
SENSOR_IDS = st.text(ALPHABET, min_size=1, max_size=128)
# "readings" is excluded too: in a lone object it would make the object an envelope
# (see test_a_field_called_readings_turns_a_lone_object_into_an_envelope).
FIELD_NAMES = st.text(ALPHABET, min_size=1, max_size=64).filter(
    lambda name: name not in RESERVED_FIELDS and name != "readings"
)
NUMBERS = st.integers(INT64_MIN, INT64_MAX) | st.floats(-1e300, 1e300)  # beyond: refused
EPOCHS = st.integers(
    int(NOW - LIMITS.max_past_seconds) + 1, int(NOW + LIMITS.max_future_seconds)
) | st.floats(NOW - LIMITS.max_past_seconds, NOW + LIMITS.max_future_seconds)


@dataclass(frozen=True)
class Spec:
    """One valid reading to encode."""

    values: dict[str, int | float]
    sensor_id: str
    ts: int | float | None
    seq: int | None


READINGS = st.builds(
    Spec,
    values=st.dictionaries(FIELD_NAMES, NUMBERS, min_size=1, max_size=6),
    sensor_id=SENSOR_IDS,
    ts=st.none() | EPOCHS,
    seq=st.none() | st.integers(0, INT64_MAX),
)


@given(data=st.data())
def test_valid_readings_round_trip(data: st.DataObject) -> None:
    shape = data.draw(st.sampled_from(["single", "array", "envelope"]), label="shape")
    size = 1 if shape == "single" else data.draw(st.integers(1, 12), label="size")
    specs = data.draw(st.lists(READINGS, min_size=size, max_size=size), label="readings")
    where = data.draw(
        st.sampled_from(
            ["reading", "topic", "envelope"] if shape == "envelope" else ["reading", "topic"]
        ),
        label="sensor_id in",
    )
    shared = data.draw(SENSOR_IDS, label="shared sensor_id")
    topic = f"sensors/{shared}/readings" if where == "topic" else "sensors"

    items: list[dict[str, Any]] = []
    for spec in specs:
        item: dict[str, Any] = dict(spec.values)
        if where == "reading":
            item["sensor_id"] = spec.sensor_id
        if spec.ts is not None:
            item["ts"] = spec.ts
        if spec.seq is not None:
            item["seq"] = spec.seq
        items.append(item)
    document: object
    if shape == "single":
        document = items[0]
    elif shape == "array":
        document = items
    else:
        document = {"readings": items} | ({"sensor_id": shared} if where == "envelope" else {})

    out = decode(topic, orjson.dumps(document), NOW, LIMITS)

    assert out.rejections == []
    assert len(out.readings) == len(specs)
    for reading, spec in zip(out.readings, specs, strict=True):
        assert reading.sensor_id == (spec.sensor_id if where == "reading" else shared)
        assert typed(reading.values) == typed(spec.values)
        assert reading.seq == spec.seq
        assert reading.epoch == (NOW if spec.ts is None else float(spec.ts))
        assert reading.ts == to_millisecond(datetime.fromtimestamp(reading.epoch, UTC))
        assert reading.ts.tzinfo is UTC
    assert_well_formed(out)


@given(
    st.floats(NOW - 86400, NOW + 500)
    | st.integers(int(NOW) - 86400, int(NOW)).map(lambda s: s + 0.9999995)
    | st.integers(0, 864_000_000).map(lambda k: NOW - 86400 + k / 1e4)
)
def test_the_millisecond_key_is_the_stored_timestamp(epoch: float) -> None:
    """``Reading.ms`` (bucket mode's identity of a reading, computed cheaply in the
    decoder) is exactly the millisecond BSON stores for ``ts``, carries included."""
    reading = accepted(run({"ts": epoch, "t": 1}))
    stored = reading.ts - datetime(1970, 1, 1, tzinfo=UTC)
    assert reading.ms == stored // timedelta(milliseconds=1)
    assert reading.ts.microsecond % 1000 == 0


@given(
    calls=st.lists(
        st.tuples(st.integers(0, 30), st.integers(0, 3), st.integers(1, 5)), max_size=300
    ),
    bound=st.integers(1, 8),
)
def test_arrival_times_past_the_cache_bound_are_those_of_an_unbounded_cache(
    calls: list[tuple[int, int, int]], bound: int
) -> None:
    """(sensor, clock step, readings): each reading its sensor's next millisecond, as if
    every sensor's last time were remembered, however few the cache holds."""
    saved = caches.limit
    caches.limit = bound
    try:
        arrivals, last = Arrivals(), dict[str, int]()
        ms = 1_000
        for sensor, step, readings in calls:
            ms += step
            for _ in range(readings):
                key = f"s{sensor}"
                last[key] = max(ms, last.get(key, 0) + 1)
                assert arrivals.next(key, ms) == last[key]
    finally:
        caches.limit = saved


def test_arrival_times_stay_at_the_bound_while_the_clock_moves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(caches, "limit", 100)
    arrivals = Arrivals()
    for i in range(10_000):
        arrivals.next(f"s{i}", 1_000 + i)
        assert arrivals.held() <= 100

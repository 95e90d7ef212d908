"""Mapping rules: loading and validation, the topic matcher, every format, values, time."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from ingest.devices.decode import Limits
from ingest.devices.mapping import Mapping, Result
from ingest.devices.rules import parse, preset_names
from ingest.errors import ConfigError
from ingest.model import MAX_TAG_BYTES, MAX_TAGS, Rejection

NOW = time.time()
LIMITS = Limits()
Z2M = """
[[rule]]
name = "z2m-bridge"
topic = "zigbee2mqtt/bridge/#"
ignore = true

[[rule]]
name = "zigbee2mqtt"
topic = "zigbee2mqtt/{sensor_id}"
format = "json"
drop = ["update_*", "last_seen"]
[rule.values]
ON = true
OFF = false
[rule.tags]
site = "home"
"""


def mapping(text: str) -> Mapping:
    return Mapping(parse(text, "--mapping test.toml"))


def run(m: Mapping, topic: str, payload: Any, now: float = NOW, limits: Limits = LIMITS) -> Result:
    raw = (
        payload
        if isinstance(payload, bytes)
        else (payload.encode() if isinstance(payload, str) else orjson.dumps(payload))
    )
    return m.decode(topic, raw, now, limits)


def reasons(result: Result) -> list[str]:
    return [r.reason for r in result.decoded.rejections]


def rule_error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        mapping(text)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- loading and validation -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[[rule]]\nname = "a b"\ntopic = "x"', "rule #1: name must match"),
        ('[[rule]]\nname = "r"', "rule 'r': topic is required"),
        ('[[rule]]\nname = "r"\ntopic = "a/#/b"\nsensor_id = "x"', "'#' must be the last level"),
        ('[[rule]]\nname = "r"\ntopic = "a/x{id}"\nsensor_id = "x"', "must fill a whole level"),
        ('[[rule]]\nname = "r"\ntopic = "a/{id}/{id}"', "capture {id} used twice"),
        ('[[rule]]\nname = "r"\ntopic = "a/b"\nformat = "xml"', "format must be one of"),
        ('[[rule]]\nname = "r"\ntopic = "a/b"', "no sensor id"),
        (
            (
                '[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\nformat = "value"\nsensor_id = "{dev}"'  # noqa: E501
                '\nmeasurement = "x"'
            ),
            "{dev} is not a capture",
        ),
        (
            '[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\nformat = "value"',
            "needs a measurement name",
        ),
        ('[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\nflatten = "."', "flatten must be"),
        ('[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\nstrings = "maybe"', "strings must be"),
        (
            '[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\n[rule.time]\nformat = "local"',
            "needs time.zone",
        ),
        (
            (
                '[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\n[rule.time]\nformat = "local"\n'
                'zone = "Mars/Olympus"'
            ),
            "unknown time zone",
        ),
        ('[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\ncolour = 1', "unknown option(s) colour"),
        (
            '[[rule]]\nname = "r"\ntopic = "a/b"\nignore = true\nformat = "json"',
            "ignore = true takes no other options",
        ),
        (
            '[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\n[rule.tags]\nsensor_id = "x"',
            "tag names",
        ),
        (
            (
                '[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\n[[rule]]\nname = "r"\ntopic = "b/#"\n'  # noqa: E501
                "ignore = true"
            ),
            "used twice",
        ),
        ("rule = 1", "no [[rule]] tables"),
        ('[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\nmax_string_bytes = 0', "max_string_bytes"),
        ("[[rule]\n", "not valid TOML"),
        ('[[rule]]\nname = "r"\ntopic = "a/{units}/{sensor_id}"', "capture {units} would be a tag"),
        ('[[rule]]\nname = "r"\ntopic = "a/{_id}/{sensor_id}"', "capture {_id} would be a tag"),
        (
            '[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\n[rule.types]\nnumeric = ["t"]',
            "types.numeric: not a kind (number, boolean, string)",
        ),
        (
            '[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\n[rule.types]\nnumber = "t"',
            "types.number must be a list",
        ),
        (
            (
                '[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\nformat = "ingest"\n[rule.types]\n'
                'number = ["t"]'
            ),
            "types does not apply to the ingest format",
        ),
    ],
)
def test_a_bad_rule_is_one_line_naming_the_source_rule_and_problem(
    text: str, expected: str
) -> None:
    message = rule_error(text)
    assert message.startswith("--mapping test.toml: ")
    assert expected in message


def test_shipped_presets_load_and_every_one_is_a_valid_mapping() -> None:
    names = preset_names()
    assert {"senml", "influx"} <= set(names)
    m = Mapping.load(None, names)
    assert m.subscriptions()


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"--preset nope: unknown preset \(known: .*senml"):
        Mapping.load(None, ["nope"])


def test_subscriptions_replace_captures_with_plus_and_never_overlap() -> None:
    m = mapping(Z2M + '[[rule]]\nname = "z2"\ntopic = "zigbee2mqtt/{x}"\nsensor_id = "{x}"\n')
    # zigbee2mqtt/bridge matches both filters: a broker would deliver it twice.
    assert m.subscriptions() == ("zigbee2mqtt/+/#",)
    assert reasons(run(m, "zigbee2mqtt/a/b/c", {"x": 1})) == ["no_rule"]
    two = mapping(
        '[[rule]]\nname = "a"\ntopic = "tele/{sensor_id}/SENSOR"\n'
        '[[rule]]\nname = "b"\ntopic = "tele/{sensor_id}/STATE"\n'
        '[[rule]]\nname = "c"\ntopic = "shellies/#"\nignore = true\n'
        '[[rule]]\nname = "d"\ntopic = "shellies/{sensor_id}/relay/{measurement}"\n'
        'format = "value"\n'
    )
    assert two.subscriptions() == ("tele/+/SENSOR", "tele/+/STATE", "shellies/#")


def test_readings_timed_at_arrival_get_distinct_milliseconds_per_sensor() -> None:
    m = mapping(
        '[[rule]]\nname = "r"\ntopic = "shellies/{sensor_id}/relay/0/{measurement}"\n'
        'format = "value"\n'
    )
    at = math.floor(NOW) + 0.1234
    times = [
        run(m, f"shellies/{sensor}/relay/0/{name}", b"1", now=at).decoded.readings[0].ms
        for sensor, name in (("a", "power"), ("a", "energy"), ("b", "power"), ("a", "x"))
    ]
    base = math.floor(at * 1000)
    assert times == [base, base + 1, base, base + 2]


# --- matcher ------------------------------------------------------------------------------


def test_first_matching_rule_wins_and_ignored_topics_are_ignored() -> None:
    m = mapping(Z2M)
    ignored = run(m, "zigbee2mqtt/bridge/state", b"online")
    assert ignored.ignored
    assert ignored.rule is not None
    assert ignored.rule.name == "z2m-bridge"
    assert run(m, "zigbee2mqtt/bridge", b"x").ignored  # '#' also matches the parent level
    taken = run(m, "zigbee2mqtt/kitchen", {"temperature": 21.7})
    assert taken.rule is not None
    assert taken.rule.name == "zigbee2mqtt"


def test_no_rule_is_a_counted_rejection() -> None:
    result = run(mapping(Z2M), "tele/x/SENSOR", {"a": 1})
    assert result.rule is None
    assert reasons(result) == ["no_rule"]


def test_wildcards_do_not_match_dollar_topics_and_plus_is_one_level() -> None:
    m = mapping('[[rule]]\nname = "r"\ntopic = "{sensor_id}/{measurement}"\nformat = "value"\n')
    assert reasons(run(m, "$SYS/uptime", b"1")) == ["no_rule"]
    assert reasons(run(m, "a/b/c", b"1")) == ["no_rule"]
    assert run(m, "a/b", b"1").decoded.readings[0].values == {"b": 1}


def test_captures_become_tags_and_unsafe_ids_are_made_safe() -> None:
    m = mapping('[[rule]]\nname = "r"\ntopic = "home/{room}/{sensor_id}"\n')
    reading = run(m, "home/Living Room/Door Sensor", {"contact": False}).decoded.readings[0]
    assert reading.sensor_id == "Door Sensor"
    assert reading.tags == {"room": "Living Room"}


def test_payload_tags_beyond_the_limits_name_the_first_in_the_readings_tag_order() -> None:
    """Tags from payload fields: the first too long (in the reading's order, topic tags
    first) is named; too many is refused; within both, the topic's tags are kept as they are."""
    m = mapping("""
[[rule]]
name = "gw"
topic = "gw/{site}/{sensor_id}"
format = "json"
info = ["b"]
[rule.tags]
b = "{dev.b}"
a = "{dev.a}"
site = "{dev.site}"
""")
    long = "é" * (MAX_TAG_BYTES // 2 + 1)
    result = run(m, "gw/s1/x", {"t": 1, "dev": {"a": long, "b": long, "site": long}})
    assert [(r.reason, r.detail) for r in result.decoded.rejections] == [
        ("bad_value", f"tag site: longer than {MAX_TAG_BYTES} bytes")
    ]
    result = run(m, "gw/s1/x", {"t": 1, "dev": {"a": long, "b": long}})
    assert [r.detail for r in result.decoded.rejections] == [
        f"tag b: longer than {MAX_TAG_BYTES} bytes"
    ]
    [first] = run(m, "gw/s1/x", {"t": 1, "dev": {"b": "B"}}).decoded.readings
    [second] = run(m, "gw/s1/x", {"t": 2, "dev": {"b": "C"}}).decoded.readings
    assert (first.tags, first.info, second.info) == ({"site": "s1"}, {"b": "B"}, {"b": "C"})
    many = "\n".join(f'k{i} = "{{dev.k{i}}}"' for i in range(MAX_TAGS))
    m = mapping(f"""
[[rule]]
name = "gw"
topic = "gw/{{site}}/{{sensor_id}}"
format = "json"
[rule.tags]
{many}
""")
    fields = {f"k{i}": "v" for i in range(MAX_TAGS)}
    assert reasons(run(m, "gw/s1/x", {"t": 1, "dev": fields})) == ["bad_value"]
    del fields["k0"]
    [reading] = run(m, "gw/s1/x", {"t": 1, "dev": fields}).decoded.readings
    assert len(reading.tags or {}) == MAX_TAGS


def test_a_topic_that_makes_no_valid_sensor_id_is_rejected() -> None:
    m = mapping('[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\n')
    assert reasons(run(m, "a/", {"x": 1})) == ["bad_sensor_id"]
    assert reasons(run(m, "a/" + "x" * 200, {"x": 1})) == ["bad_sensor_id"]


# --- json ---------------------------------------------------------------------------------


def test_zigbee2mqtt_payload_is_one_reading_with_booleans_strings_and_nested_fields() -> None:
    m = mapping(Z2M)
    payload = {
        "battery": 100,
        "battery_low": False,
        "occupancy": True,
        "temperature": 21.7,
        "linkquality": 134,
        "update": {"state": "idle"},
        "action": "single",
        "state": "ON",
        "last_seen": "2026-01-01T00:00:00Z",
        "nothing": None,
    }
    result = run(m, "zigbee2mqtt/Living Room", payload)
    assert result.decoded.rejections == []
    (reading,) = result.decoded.readings
    assert reading.sensor_id == "Living Room"
    assert reading.values == {
        "battery": 100,
        "battery_low": False,
        "occupancy": True,
        "temperature": 21.7,
        "linkquality": 134,
        "action": "single",
        "state": True,
    }
    assert type(reading.values["battery_low"]) is bool
    assert reading.tags == {"site": "home"}
    assert reading.units is None
    assert abs(reading.epoch - NOW) < 0.002  # no [rule.time]: arrival time


def test_nested_objects_flatten_with_the_separator_and_arrays_are_refused_by_field() -> None:
    m = mapping('[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\nflatten = "__"\n')
    result = run(
        m, "a/s", {"AM2301": {"Temperature": 22.5, "Humidity": 40.1}, "list": [1, 2], "ok": 1}
    )
    (reading,) = result.decoded.readings
    assert reading.values == {"AM2301__Temperature": 22.5, "AM2301__Humidity": 40.1, "ok": 1}
    assert [(r.reason, "list" in r.detail) for r in result.decoded.rejections] == [
        ("bad_value", True)
    ]


def test_keep_and_drop_globs_and_reserved_or_colliding_names() -> None:
    m = mapping(
        '[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\nkeep = ["t*", "x y", '
        '"x_y"]\ndrop = ["tz"]\n'
    )
    result = run(m, "a/s", {"temp": 1, "tz": 2, "hum": 3, "x y": 4, "x_y": 5, "ts": 6})
    (reading,) = result.decoded.readings
    assert reading.values == {"temp": 1, "x_y": 4}
    assert sorted(reasons(result)) == ["bad_field_name", "bad_field_name"]  # ts, x_y again


def test_strings_keep_drop_reject_and_the_size_bound() -> None:
    base = '[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\nmax_string_bytes = 8\n'
    payload = {"n": 1, "s": "short", "long": "x" * 9, "euro": "€€€"}
    kept = run(mapping(base), "a/s", payload)
    assert kept.decoded.readings[0].values == {"n": 1, "s": "short"}
    assert [r.detail for r in kept.decoded.rejections] == [
        "long: string longer than 8 bytes",
        "euro: string longer than 8 bytes",
    ]
    dropped = run(mapping(base + 'strings = "drop"\n'), "a/s", payload)
    assert dropped.decoded.readings[0].values == {"n": 1}
    assert dropped.decoded.rejections == []
    refused = run(mapping(base + 'strings = "reject"\n'), "a/s", payload)
    assert refused.decoded.readings[0].values == {"n": 1}
    assert reasons(refused) == ["bad_value"] * 3


def test_values_map_strings_before_the_strings_policy() -> None:
    m = mapping(
        '[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\nstrings = "reject"\n'
        '[rule.values]\nON = 1\nOFF = 0\nidle = "waiting"\n'
    )
    reading = run(m, "a/s", {"a": "ON", "b": "OFF", "c": "idle"}).decoded.readings[0]
    assert reading.values == {"a": 1, "b": 0, "c": "waiting"}


def test_a_reading_with_nothing_storable_is_no_measurements_and_arrays_are_readings() -> None:
    m = mapping('[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\n')
    assert reasons(run(m, "a/s", {"x": None})) == ["no_measurements"]
    result = run(m, "a/s", [{"x": 1}, {"x": [1]}, 3])
    assert len(result.decoded.readings) == 1
    assert sorted((r.reason, r.index) for r in result.decoded.rejections) == [
        ("bad_shape", 2),
        ("bad_value", 1),
        ("no_measurements", 1),
    ]
    assert reasons(run(m, "a/s", b"{")) == ["invalid_json"]
    assert reasons(run(m, "a/s", b"\xff")) == ["invalid_utf8"]
    assert reasons(run(m, "a/s", "1")) == ["bad_shape"]
    assert reasons(run(m, "a/s", [{"x": 1}] * 4, limits=Limits(max_readings=3))) == [
        "too_many_readings"
    ]
    assert reasons(run(m, "a/s", b"x" * 100, limits=Limits(max_message_bytes=99))) == ["too_large"]


def test_non_finite_and_huge_numbers() -> None:
    m = mapping('[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\n')
    result = run(m, "a/s", b'{"big": 99999999999999999999, "ok": 1}')
    assert result.decoded.readings[0].values == {"big": 1e20, "ok": 1}
    # The default format's bound (a bucket's running sum stays finite) holds here too.
    result = run(m, "a/s", b'{"v": 1e300, "w": -1.7e308, "x": 1.7e308, "ok": 1}')
    assert result.decoded.readings[0].values == {"v": 1e300, "ok": 1}
    assert [r.detail for r in result.decoded.rejections] == [
        "w: not a finite number within ±1e300",
        "x: not a finite number within ±1e300",
    ]
    values = mapping(
        '[[rule]]\nname = "r"\ntopic = "v/{sensor_id}/{m}"\nformat = "value"\nmeasurement = "{m}"\n'
    )
    for text in ("1" + "0" * 400, "-" + "9" * 301, "1.7e308"):  # the first: no double holds it
        assert reasons(run(values, "v/s/t", text)) == ["bad_value", "no_measurements"]


# --- time ---------------------------------------------------------------------------------

EPOCH = 1795251600  # 2026-11-21T09:00:00Z
AT = EPOCH + 600.0


@pytest.mark.parametrize(
    ("fmt", "raw", "expected_ms"),
    [
        ("auto", EPOCH, EPOCH * 1000),
        ("auto", EPOCH + 0.25, EPOCH * 1000 + 250),
        ("auto", EPOCH * 1000 + 500, EPOCH * 1000 + 500),
        ("auto", (EPOCH * 1000 + 500) * 1000 + 7, EPOCH * 1000 + 500),
        ("auto", (EPOCH * 1000 + 500) * 1_000_000 + 999, EPOCH * 1000 + 500),
        ("auto", str(EPOCH * 1000 + 500), EPOCH * 1000 + 500),
        ("auto", "2026-11-21T10:00:00.123+01:00", EPOCH * 1000 + 123),
        ("epoch_s", EPOCH, EPOCH * 1000),
        ("epoch_ms", EPOCH * 1000 + 500, EPOCH * 1000 + 500),
        ("epoch_us", EPOCH * 1_000_000 + 1500, EPOCH * 1000 + 1),
        ("epoch_ns", EPOCH * 10**9 + 2_000_000, EPOCH * 1000 + 2),
        ("iso", "2026-11-21T09:00:00Z", EPOCH * 1000),
    ],
)
def test_time_formats(fmt: str, raw: object, expected_ms: int) -> None:
    m = mapping(
        f'[[rule]]\nname = "r"\ntopic = "a/{{sensor_id}}"\n[rule.time]\n'
        f'field = "t"\nformat = "{fmt}"\n'
    )
    result = run(m, "a/s", {"t": raw, "x": 1}, now=AT)
    (reading,) = result.decoded.readings
    assert reading.ms == expected_ms
    assert reading.ts == datetime.fromtimestamp(expected_ms / 1000, UTC)
    assert "t" not in reading.values


def test_local_time_in_a_named_zone_and_what_is_not_a_time() -> None:
    m = mapping(
        '[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\n[rule.time]\nfield = "Time"\n'
        'format = "local"\nzone = "Europe/Berlin"\n'
    )
    reading = run(m, "a/s", {"Time": "2026-11-21T10:00:00", "x": 1}, now=AT).decoded.readings[0]
    assert reading.ms == EPOCH * 1000  # CET is UTC+1 in November
    iso = mapping(
        '[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\n[rule.time]\nfield = "t"\nformat = "iso"\n'
    )
    for bad in ("2026-11-22T08:00:00", "yesterday", "x" * 100, True, [1]):
        assert reasons(run(iso, "a/s", {"t": bad, "x": 1}, now=AT)) == ["bad_timestamp"]
    assert reasons(run(iso, "a/s", {"t": "2020-01-01T00:00:00Z", "x": 1}, now=AT)) == [
        "ts_out_of_window"
    ]


# --- value --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b"22.5", 22.5),
        (b"-3", -3),
        (b" 7\n", 7),
        (b"true", True),
        (b"OFF", False),
        (b"on", "on"),
        (b'"quoted"', "quoted"),
        (b"1_000", "1_000"),
        (b"nan", "nan"),
        (b"1e999", "1e999"),
    ],
)
def test_value_format_parses_plain_values(payload: bytes, expected: object) -> None:
    m = mapping(
        '[[rule]]\nname = "r"\ntopic = "shellies/{sensor_id}/sensor/{measurement}"\n'
        'format = "value"\n[rule.values]\nOFF = false\n'
    )
    reading = run(m, "shellies/sh1/sensor/temperature", payload).decoded.readings[0]
    assert reading.values == {"temperature": expected}
    assert type(reading.values["temperature"]) is type(expected)


def test_value_format_measurement_template_and_refusals() -> None:
    m = mapping(
        '[[rule]]\nname = "r"\ntopic = "shellies/{sensor_id}/relay/{channel}"\n'
        'format = "value"\nmeasurement = "relay_{channel}"\n'
    )
    reading = run(m, "shellies/sh1/relay/0", b"on").decoded.readings[0]
    assert reading.values == {"relay_0": "on"}
    assert reading.tags == {}  # a capture that builds the measurement name is not a tag
    assert reasons(run(m, "shellies/sh1/relay/0", b'{"a": 1}')) == ["bad_shape"]
    assert reasons(run(m, "shellies/sh1/relay/0", b"null")) == ["no_measurements"]


# --- senml --------------------------------------------------------------------------------


def test_senml_pack_resolves_base_fields_units_and_groups_by_time() -> None:
    m = Mapping.load(None, ["senml"])
    pack = [
        {"bn": "urn:dev:mac:0024befffe804ff1:", "bt": EPOCH, "bu": "Cel", "n": "temp", "v": 22.5},
        {"n": "hum", "u": "%RH", "v": 40},
        {"n": "door", "vb": False},
        {"n": "state", "vs": "idle"},
        {"n": "energy", "u": "J", "s": 100},
        {"n": "temp", "t": 60, "v": 23.0},
        {"n": "blob", "vd": "aGk"},
        {"n": "x", "v": "22"},
        {"n": "ext", "v": 1, "future_": 1},
    ]
    result = run(m, "senml/gw1", pack, now=AT)
    first, second = result.decoded.readings
    assert first.sensor_id == "urn:dev:mac:0024befffe804ff1"
    assert first.ms == EPOCH * 1000
    assert first.values == {
        "temp": 22.5,
        "hum": 40,
        "door": False,
        "state": "idle",
        "energy_sum": 100,
    }
    assert first.units == {
        "temp": "Cel",
        "hum": "%RH",
        "door": "Cel",
        "state": "Cel",
        "energy_sum": "J",
    }  # bu applies to every record after it
    assert second.ms == (EPOCH + 60) * 1000
    assert second.values == {"temp": 23.0}
    assert sorted(reasons(result)) == ["bad_shape", "bad_value", "bad_value"]


def test_senml_relative_time_and_sensor_from_the_topic() -> None:
    m = mapping('[[rule]]\nname = "r"\ntopic = "senml/{sensor_id}"\nformat = "senml"\n')
    (reading,) = run(m, "senml/dev1", [{"n": "temp", "v": 1, "t": -5}], now=AT).decoded.readings
    assert reading.sensor_id == "dev1"
    assert reading.ms == int((AT - 5) * 1000)
    # A base name in the payload wins over the capture; an explicit template over both.
    (named,) = run(m, "senml/dev1", [{"bn": "gw7/", "n": "t", "v": 1}]).decoded.readings
    assert named.sensor_id == "gw7"
    explicit = mapping(
        '[[rule]]\nname = "r"\ntopic = "senml/{dev}"\nformat = "senml"\nsensor_id = "{dev}"\n'
    )
    (fixed,) = run(explicit, "senml/dev1", [{"bn": "gw7/", "n": "t", "v": 1}]).decoded.readings
    assert fixed.sensor_id == "dev1"


def test_senml_time_in_milliseconds_is_refused_saying_what_is_wrong() -> None:
    m = Mapping.load(None, ["senml"])
    result = run(m, "senml/gw1", [{"bn": "dev:", "bt": EPOCH * 1000, "n": "temp", "v": 1}], now=AT)
    assert result.decoded.readings == []
    detail = (
        "SenML time (bt + t) 1.79525e+12 s is beyond ±60,000,000,000 s of the epoch "
        "(SenML times are seconds; bt in milliseconds?)"
    )
    assert [(r.reason, r.detail) for r in result.decoded.rejections] == [("bad_timestamp", detail)]


# --- influx -------------------------------------------------------------------------------


def test_line_protocol_lines_tags_types_and_escaping() -> None:
    m = mapping(
        '[[rule]]\nname = "r"\ntopic = "influx/{site}"\nformat = "influx"\n'
        'sensor_id = "{tag.room}"\nmeasurement = "{measurement}_{field}"\n'
    )
    text = (
        f'climate,room=kitchen temp=22.5,hum=40i,ok=t,state="a \\"q\\"" {EPOCH}000000000\n'
        f"# a comment\n"
        f"climate,room=living\\ room temp=21 \n"
        f"not line protocol\n"
        f"climate temp=1\n"
    )
    result = run(m, "influx/home", text, now=AT)
    kitchen, living = result.decoded.readings
    assert kitchen.sensor_id == "kitchen"
    assert kitchen.ms == EPOCH * 1000
    assert kitchen.values == {
        "climate_temp": 22.5,
        "climate_hum": 40,
        "climate_ok": True,
        "climate_state": 'a "q"',
    }
    assert kitchen.tags == {"site": "home"}  # room is the sensor id, not also a tag
    assert living.sensor_id == "living room"
    assert living.tags == {"site": "home"}
    assert abs(living.epoch - AT) < 0.002
    assert sorted((r.reason, r.index) for r in result.decoded.rejections) == [
        ("bad_shape", 2),
        ("no_sensor_id", 3),
    ]


def test_line_protocol_defaults_name_each_field_by_its_measurement_and_take_the_host_tag() -> None:
    """Without sensor_id and measurement: the host tag is the sensor id (the topic's
    {sensor_id} without one), the other tags stay, fields are <measurement>_<field> and a
    field named value takes the measurement's name, as Telegraf's Prometheus output."""
    m = mapping(
        '[[rule]]\nname = "r"\ntopic = "lp/{sensor_id}"\nformat = "influx"\n'
        '[[rule]]\nname = "nocapture"\ntopic = "lp2/+"\nformat = "influx"\n'
    )
    text = (
        f"mem,host=h1 free=100i,used=5i {EPOCH}000000000\n"
        f"disk,host=h1,path=/boot free=300i,used=9i {EPOCH}000000000\n"
        f"temperature,room=hall value=21.5,battery=90i {EPOCH}000000000\n"
    )
    result = run(m, "lp/topic-id", text, now=AT)
    assert result.decoded.rejections == []
    mem, disk, temperature = result.decoded.readings
    assert (mem.sensor_id, mem.values, mem.tags) == ("h1", {"mem_free": 100, "mem_used": 5}, {})
    assert (disk.sensor_id, disk.values, disk.tags) == (
        "h1",
        {"disk_free": 300, "disk_used": 9},
        {"path": "/boot"},
    )
    assert (temperature.sensor_id, temperature.values, temperature.tags) == (
        "topic-id",
        {"temperature": 21.5, "temperature_battery": 90},
        {"room": "hall"},
    )
    # No host tag and nothing captured: that line is refused, the other one kept.
    result = run(m, "lp2/x", f"cpu usage=1\ncpu,host=h2 usage=2 {EPOCH}000000000", now=AT)
    assert [(r.sensor_id, r.values) for r in result.decoded.readings] == [
        ("h2", {"cpu_usage": 2.0})
    ]
    assert [(r.reason, r.index) for r in result.decoded.rejections] == [("no_sensor_id", 0)]


def test_a_line_tag_that_builds_the_sensor_id_or_a_name_is_not_also_a_tag() -> None:
    m = mapping(
        '[[rule]]\nname = "by-tag"\ntopic = "a/+"\nformat = "influx"\n'
        'sensor_id = "{tag.host}-{tag.cpu}"\nmeasurement = "{tag.core}_{field}"\n'
        '[[rule]]\nname = "by-topic"\ntopic = "b/{sensor_id}"\nformat = "influx"\n'
        'sensor_id = "{sensor_id}"\n'
    )
    line = "cpu,host=h1,cpu=cpu0,core=c1,dc=west usage=1"
    (reading,) = run(m, "a/x", line).decoded.readings
    assert (reading.sensor_id, reading.values, reading.tags) == (
        "h1-cpu0",
        {"c1_usage": 1.0},
        {"dc": "west"},
    )
    # The sensor id taken from the topic: the host tag is one more tag.
    (reading,) = run(m, "b/dev", line).decoded.readings
    assert (reading.sensor_id, reading.values, reading.tags) == (
        "dev",
        {"cpu_usage": 1.0},
        {"host": "h1", "cpu": "cpu0", "core": "c1", "dc": "west"},
    )


def test_line_protocol_timestamps_in_another_precision() -> None:
    m = mapping(
        '[[rule]]\nname = "r"\ntopic = "influx/{sensor_id}"\nformat = "influx"\n'
        '[rule.time]\nformat = "epoch_ms"\n'
    )
    (reading,) = run(m, "influx/a", f"m v=1 {EPOCH}500", now=AT).decoded.readings
    assert reading.ms == EPOCH * 1000 + 500


# --- the ingest format in a rule ------------------------------------------------------------


def test_ingest_format_rule_takes_the_sensor_from_the_capture_and_adds_tags() -> None:
    m = mapping('[[rule]]\nname = "r"\ntopic = "plant/{line}/{sensor_id}"\nformat = "ingest"\n')
    (reading,) = run(m, "plant/l1/s9", {"ts": AT, "temp": 1}, now=AT).decoded.readings
    assert reading.sensor_id == "s9"
    assert reading.tags == {"line": "l1"}
    assert reasons(run(m, "plant/l1/s9", {"temp": True})) == ["bad_value"]


def test_field_refusals_name_the_field_and_keep_the_rest() -> None:
    m = mapping('[[rule]]\nname = "r"\ntopic = "a/{sensor_id}"\n')
    result = run(m, "a/s", b'{"good": 1, "bad": [1], "$set": 2}')
    assert result.decoded.readings[0].values == {"good": 1, "_set": 2}
    assert result.decoded.rejections == [
        Rejection("bad_value", "bad: an array (leave it out with drop)")
    ]


def test_the_benchmark_stream_is_fully_decoded_by_its_rule() -> None:
    from bench.mapping import RULE, zigbee2mqtt  # noqa: PLC0415

    lines, topics = zigbee2mqtt(20, 7)
    m = mapping(RULE)
    results = [m.decode(t, p, NOW, LIMITS) for p, t in zip(lines, topics, strict=True)]
    assert all(r.decoded.rejections == [] for r in results)
    readings = [reading for r in results for reading in r.decoded.readings]
    assert len(readings) == 20
    assert len({r.sensor_id for r in readings}) == 7
    assert all(len(r.values) == 6 and r.values["update_state"] == "idle" for r in readings)

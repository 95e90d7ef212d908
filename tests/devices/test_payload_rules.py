"""Rules that read identity, time, units and names from the payload (docs/mapping.md).

Payload variables in ``sensor_id``, ``[rule.tags]`` and ``[rule.units]``; ``sensor_id``
alternatives; ``root`` and ``each``; ``[rule.rename]``; ``[rule.units]``; a dotted time
field. Each test decodes messages shaped as their vendors publish them through the real
mapping engine.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.devices.test_mapping import NOW, mapping, reasons, rule_error, run

RTL_433 = """
[[rule]]
name = "rtl_433"
topic = "rtl_433/{host}/events"
sensor_id = ["{model}-{channel}-{id}", "{model}-{id}", "{model}"]
info = ["host"]
drop = ["mic", "time"]
[rule.units]
temperature_C = "°C"
humidity = "%"
"""


def test_the_sensor_id_comes_from_payload_fields_and_they_are_not_measurements() -> None:
    result = run(
        mapping(RTL_433),
        "rtl_433/pi/events",
        {
            "time": "2026-11-26 19:00:00",
            "model": "Acurite-Tower",
            "id": 1234,
            "channel": "A",
            "battery_ok": 1,
            "temperature_C": 21.5,
            "humidity": 40,
            "mic": "CHECKSUM",
        },
    )
    [reading] = result.decoded.readings
    assert reading.sensor_id == "Acurite-Tower-A-1234"
    assert reading.values == {"battery_ok": 1, "temperature_C": 21.5, "humidity": 40}
    assert reading.units == {"temperature_C": "°C", "humidity": "%"}
    assert reading.info == {"host": "pi"}
    assert reading.tags == {}


def test_sensor_id_alternatives_are_tried_in_order() -> None:
    m = mapping(RTL_433)
    ids = [
        run(m, "rtl_433/pi/events", payload).decoded.readings[0].sensor_id
        for payload in (
            {"model": "Nexus-TH", "id": 7, "temperature_C": 20.1},
            {"model": "Oregon-THGR122N", "channel": 1, "id": 44, "temperature_C": 19},
            {"model": "Generic-Remote", "cmd": 3},
        )
    ]
    assert ids == ["Nexus-TH-7", "Oregon-THGR122N-1-44", "Generic-Remote"]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "no_sensor_id"),  # missing
        (3.5, "no_sensor_id"),
        (True, "no_sensor_id"),
        ({"$gt": ""}, "no_sensor_id"),
        ([1], "no_sensor_id"),
        ("x" * 129, "bad_sensor_id"),
        ("a\x00b", "bad_sensor_id"),
    ],
)
def test_a_payload_device_id_that_is_missing_huge_or_not_text_is_a_counted_rejection(
    value: object, reason: str
) -> None:
    m = mapping('[[rule]]\nname = "gw"\ntopic = "gw/+"\nsensor_id = "{dev}"\n')
    payload = {"t": 1} if value is None else {"dev": value, "t": 1}
    result = run(m, "gw/x", payload)
    assert result.decoded.readings == []
    assert reasons(result) == [reason]
    assert "dev" in result.decoded.rejections[0].detail or reason == "bad_sensor_id"


def test_a_payload_device_id_is_text_never_an_operator_or_a_path() -> None:
    m = mapping(
        '[[rule]]\nname = "gw"\ntopic = "gw/+"\nsensor_id = "{dev}"\n[rule.tags]\nroom = "{room}"\n'
    )
    [reading] = run(m, "gw/x", {"dev": "$set.a", "room": "$where", "t": 1}).decoded.readings
    assert reading.sensor_id == "$set.a"
    assert reading.tags == {"room": "$where"}
    assert reading.values == {"t": 1}


TTN = """
[[rule]]
name = "ttn"
topic = "v3/{app}/devices/{sensor_id}/up"
root = "uplink_message.decoded_payload"
info = ["dev_eui", "app"]
[rule.tags]
dev_eui = "{end_device_ids.dev_eui}"
[rule.time]
field = "received_at"
[rule.units]
temperature = "°C"
"""
UPLINK = {
    "end_device_ids": {
        "device_id": "eui-0004a30b001c0530",
        "dev_eui": "0004A30B001C0530",
        "application_ids": {"application_id": "weather"},
    },
    "received_at": "2026-11-26T19:00:01.530339525Z",
    "uplink_message": {
        "f_port": 1,
        "f_cnt": 12,
        "frm_payload": "AQID",
        "decoded_payload": {"temperature": 21.5, "humidity": 40},
        "rx_metadata": [{"gateway_ids": {"gateway_id": "gw"}, "rssi": -42}],
    },
}


def test_root_takes_the_measurements_from_one_object_and_the_rest_as_variables() -> None:
    [reading] = run(
        mapping(TTN), "v3/weather@ttn/devices/eui-0004a30b001c0530/up", UPLINK
    ).decoded.readings
    assert reading.sensor_id == "eui-0004a30b001c0530"
    assert reading.values == {"temperature": 21.5, "humidity": 40}
    assert reading.units == {"temperature": "°C"}
    assert reading.info == {"dev_eui": "0004A30B001C0530", "app": "weather@ttn"}
    assert reading.ts == datetime(2026, 11, 26, 19, 0, 1, 530000, UTC)


def test_an_uplink_without_its_decoded_object_is_a_counted_rejection() -> None:
    uplink = {**UPLINK, "uplink_message": {"f_port": 1, "frm_payload": "AQID"}}
    result = run(mapping(TTN), "v3/weather@ttn/devices/d/up", uplink)
    assert reasons(result) == ["no_measurements"]
    assert "uplink_message.decoded_payload" in result.decoded.rejections[0].detail


ZB = """
[[rule]]
name = "tasmota"
topic = "tele/{bridge}/SENSOR"
each = "ZbReceived"
sensor_id = ["{Name}", "{_key}", "{bridge}"]
drop = ["Time", "Device"]
[rule.units]
Temperature = "°C"
"""


def test_each_member_of_an_object_is_a_reading_named_by_its_key_or_a_field() -> None:
    result = run(
        mapping(ZB),
        "tele/zbbridge/SENSOR",
        {
            "ZbReceived": {
                "0x8F20": {
                    "Device": "0x8F20",
                    "Name": "Kitchen",
                    "Temperature": 21.5,
                    "Endpoint": 1,
                },
                "0x1234": {"Device": "0x1234", "Power": 1, "Endpoint": 1},
            }
        },
    )
    assert [(r.sensor_id, r.values, r.units) for r in result.decoded.readings] == [
        ("Kitchen", {"Temperature": 21.5, "Endpoint": 1}, {"Temperature": "°C"}),
        ("0x1234", {"Power": 1, "Endpoint": 1}, None),
    ]


def test_each_falls_back_to_the_whole_payload_when_its_path_is_absent() -> None:
    [reading] = run(
        mapping(ZB), "tele/plug/SENSOR", {"Time": "2026-11-26T20:00:00", "ENERGY": {"Power": 3}}
    ).decoded.readings
    assert (reading.sensor_id, reading.values) == ("plug", {"ENERGY_Power": 3})


def test_each_element_of_an_array_is_a_reading_with_the_message_time() -> None:
    m = mapping(
        '[[rule]]\nname = "gw"\ntopic = "gw/{gw}"\neach = "devices"\n'
        'sensor_id = "{mac}"\n[rule.time]\nfield = "ts"\n'
    )
    result = run(
        m,
        "gw/g1",
        {
            "ts": int(NOW) * 1000,
            "devices": [
                {"mac": "AA:BB", "temp": 20},
                {"mac": "CC:DD", "temp": 21, "ts": int(NOW - 5) * 1000},
                "junk",
            ],
        },
    )
    assert [(r.sensor_id, r.values, r.ms) for r in result.decoded.readings] == [
        ("AA:BB", {"temp": 20}, int(NOW) * 1000),
        ("CC:DD", {"temp": 21}, int(NOW - 5) * 1000),
    ]
    assert [(r.reason, r.index) for r in result.decoded.rejections] == [("bad_shape", 2)]


def test_rename_stores_a_reserved_name_under_another() -> None:
    m = mapping(
        '[[rule]]\nname = "omg"\ntopic = "home/+/BTtoMQTT/{sensor_id}"\n'
        '[rule.rename]\nseq = "ruuvi_seq"\ntempc = "temperature"\n'
    )
    [reading] = run(m, "home/OMG/BTtoMQTT/AABBCC", {"tempc": 21.5, "seq": 9}).decoded.readings
    assert reading.values == {"temperature": 21.5, "ruuvi_seq": 9}


def test_drop_and_keep_see_a_renamed_field_under_both_names() -> None:
    m = mapping(
        '[[rule]]\nname = "omg"\ntopic = "home/+/BTtoMQTT/{sensor_id}"\n'
        'keep = ["temp*", "rssi"]\ndrop = ["ruuvi_*"]\n'
        '[rule.rename]\nseq = "ruuvi_seq"\ntempc = "temperature"\nvolt = "voltage"\n'
    )
    [reading] = run(
        m, "home/OMG/BTtoMQTT/AABBCC", {"tempc": 21.5, "seq": 9, "volt": 3.1, "rssi": -70}
    ).decoded.readings
    assert reading.values == {"temperature": 21.5, "rssi": -70}


def test_units_from_a_sibling_field_and_for_the_value_format() -> None:
    m = mapping(
        '[[rule]]\nname = "j"\ntopic = "j/{sensor_id}"\n'
        '[rule.units]\nvalue = "{unit}"\n\n'
        '[[rule]]\nname = "v"\ntopic = "v/{sensor_id}/{measurement}/{unit}"\n'
        'format = "value"\n[rule.units]\ntemperature = "{unit}"\n'
    )
    [j] = run(m, "j/d1", {"value": 3.3, "unit": "V"}).decoded.readings
    assert (j.values, j.units) == ({"value": 3.3}, {"value": "V"})
    [v] = run(m, "v/d2/temperature/C", b"21.5").decoded.readings
    assert (v.values, v.units, v.tags) == ({"temperature": 21.5}, {"temperature": "C"}, {})


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('root = "a"\neach = "b"', "root and each exclude each other"),
        ('sensor_id = "{_key}"', "{_key} needs each"),
        ('[rule.rename]\nx = "seq"', "rename.x: 'seq' is not a valid measurement name"),
        ('root = "a..b"', "root must be a path of keys"),
        ("sensor_id = []", "sensor_id must be a string or a list of 1 to 8 strings"),
        ('[rule.units]\nx = ""', "units.x: must be a string of 1 to 64 characters"),
    ],
)
def test_a_wrong_payload_option_is_one_line_naming_it(text: str, problem: str) -> None:
    message = rule_error(f'[[rule]]\nname = "r"\ntopic = "t/{{sensor_id}}"\n{text}\n')
    assert problem in message
    assert "rule 'r'" in message


def test_payload_variables_belong_to_the_json_format() -> None:
    message = rule_error(
        '[[rule]]\nname = "r"\ntopic = "t/{sensor_id}/{measurement}"\n'
        'format = "value"\n[rule.tags]\nroom = "{room}"\n'
    )
    assert "{room} is not a capture of the topic" in message

"""The LoRaWAN presets (``ttn``, ``chirpstack``) against what their servers can send that
the vendors' examples do not show: uplinks without a decoded payload, identities that are
not strings or are too long, times that are not times, ChirpStack's protobuf marshaler.

The documented messages themselves (every value with its sensor, type, tags, info and
time, through the engine and through the daemon in both modes) are fixtures of
tests/devices/test_presets.py (tests/fixtures/devices/ttn.json, chirpstack.json).
"""

from __future__ import annotations

import re
import time
from typing import Any

import orjson
import pytest

from ingest.devices.decode import Limits
from ingest.devices.mapping import Mapping, Result
from ingest.devices.rules import parse
from ingest.model import MAX_TAG_BYTES
from tests.support.devices import base_time, load
from tests.support.procs import ROOT

TTN_TOPIC = "v3/app1@ttn/devices/dev1/up"
CS_TOPIC = "application/17c82e96-be03-4f38-aef3-f83d48582d97/device/0101010101010101/event/up"


def _documented(preset: str, rule: str) -> dict[str, Any]:
    """The first documented uplink of a preset's fixtures that gives a reading, as a dict."""
    t = base_time(time.time())
    msg = next(
        m for m in load(preset, t) if m.rule == rule and m.readings and m.readings[0].ts == "T"
    )
    doc: dict[str, Any] = orjson.loads(msg.payload)
    return doc


def _decode(preset: str, topic: str, payload: bytes | dict[str, Any]) -> Result:
    body = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    return Mapping.load(None, [preset]).decode(topic, body, time.time(), Limits())


def _reasons(result: Result) -> list[str]:
    return [r.reason for r in result.decoded.rejections]


@pytest.mark.parametrize("decoded", [None, "gkHe", [1, 2], 21.5, {}])
def test_ttn_uplink_without_a_decoded_object_is_a_counted_rejection(decoded: object) -> None:
    """No formatter (absent), a formatter's output that is not an object, or nothing in
    it: refused with a reason, never stored empty."""
    doc = _documented("ttn", "ttn-up")
    if decoded is None:
        del doc["uplink_message"]["decoded_payload"]
    else:
        doc["uplink_message"]["decoded_payload"] = decoded
    result = _decode("ttn", TTN_TOPIC, doc)
    assert result.decoded.readings == []
    assert _reasons(result) == ["no_measurements"]


@pytest.mark.parametrize("decoded", [None, "qg==", [], {}])
def test_chirpstack_uplink_without_an_object_is_a_counted_rejection(decoded: object) -> None:
    doc = _documented("chirpstack", "chirpstack-up")
    if decoded is None:
        del doc["object"]
    else:
        doc["object"] = decoded
    result = _decode("chirpstack", CS_TOPIC, doc)
    assert result.decoded.readings == []
    assert _reasons(result) == ["no_measurements"]


# (preset, topic, path to the descriptive field, its info name)
IDENTITY = [
    ("ttn", TTN_TOPIC, ("end_device_ids", "dev_eui"), "dev_eui"),
    ("chirpstack", CS_TOPIC, ("deviceInfo", "deviceName"), "device_name"),
]


@pytest.mark.parametrize(("preset", "topic", "path", "name"), IDENTITY)
@pytest.mark.parametrize("value", [None, 3.5, True, {"x": "y"}, ["a"]])
def test_descriptive_ids_that_are_not_strings_are_left_out(
    preset: str, topic: str, path: tuple[str, str], name: str, value: object
) -> None:
    """A DevEUI or device name that is null, a float, a boolean, an object or an array is
    absent: the reading is stored without it, under the topic's sensor id."""
    doc = _documented(preset, f"{preset}-up")
    doc[path[0]][path[1]] = value
    result = _decode(preset, topic, doc)
    assert _reasons(result) == []
    [reading] = result.decoded.readings
    assert name not in (reading.info or {})
    assert name not in reading.values
    assert reading.sensor_id == topic.split("/")[3]


@pytest.mark.parametrize(("preset", "topic", "path", "name"), IDENTITY)
def test_a_descriptive_id_that_is_an_integer_is_its_decimal_text(
    preset: str, topic: str, path: tuple[str, str], name: str
) -> None:
    doc = _documented(preset, f"{preset}-up")
    doc[path[0]][path[1]] = 1234
    [reading] = _decode(preset, topic, doc).decoded.readings
    assert reading.info == {name: "1234"}


@pytest.mark.parametrize(("preset", "topic", "path", "name"), IDENTITY)
def test_a_descriptive_id_beyond_the_tag_limit_refuses_the_reading(
    preset: str, topic: str, path: tuple[str, str], name: str
) -> None:
    """A DevEUI or device name longer than a tag may be (ChirpStack's names are at most
    100 characters, DevEUIs 16): refused with a counted reason, never cut or stored."""
    doc = _documented(preset, f"{preset}-up")
    doc[path[0]][path[1]] = "é" * (MAX_TAG_BYTES // 2 + 1)
    result = _decode(preset, topic, doc)
    assert result.decoded.readings == []
    assert [(r.reason, name in r.detail) for r in result.decoded.rejections] == [
        ("bad_value", True)
    ]
    doc[path[0]][path[1]] = "é" * (MAX_TAG_BYTES // 2)
    [reading] = _decode(preset, topic, doc).decoded.readings
    assert reading.info == {name: "é" * (MAX_TAG_BYTES // 2)}


@pytest.mark.parametrize(
    ("preset", "topic"),
    [
        ("ttn", "v3/app1@ttn/devices/{}/up"),
        ("chirpstack", "application/17c82e96-be03-4f38-aef3-f83d48582d97/device/{}/event/up"),
    ],
)
def test_a_device_level_too_long_for_a_sensor_id_is_refused(preset: str, topic: str) -> None:
    doc = _documented(preset, f"{preset}-up")
    result = _decode(preset, topic.format("d" * 129), doc)
    assert result.decoded.readings == []
    assert _reasons(result) == ["bad_sensor_id"]
    [reading] = _decode(preset, topic.format("d" * 128), doc).decoded.readings
    assert reading.sensor_id == "d" * 128


@pytest.mark.parametrize("when", ["yesterday", "2026-13-01T00:00:00Z", "", True, [1]])
def test_ttn_uplink_with_a_reception_time_that_is_no_time_is_refused(when: object) -> None:
    doc = _documented("ttn", "ttn-up")
    doc["uplink_message"]["received_at"] = when
    result = _decode("ttn", TTN_TOPIC, doc)
    assert result.decoded.readings == []
    assert _reasons(result) == ["bad_timestamp"]


def test_chirpstack_time_in_whole_seconds_and_with_an_offset() -> None:
    """chrono's to_rfc3339 writes no fraction for a whole second, and any offset."""
    doc = _documented("chirpstack", "chirpstack-up")
    t = int(base_time(time.time()))
    for text in (
        time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(t)),
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t + 7200)) + "+02:00",
    ):
        doc["time"] = text
        [reading] = _decode("chirpstack", CS_TOPIC, doc).decoded.readings
        assert reading.epoch == t


def test_chirpstack_protobuf_marshaler_is_refused_as_not_json() -> None:
    """``json = false``: an UplinkEvent in the protobuf binary encoding (deduplication_id,
    time, f_port, object) is counted as invalid, not read."""
    seconds = int(time.time())
    varint = bytearray()
    while True:
        byte, seconds = seconds & 0x7F, seconds >> 7
        varint.append(byte | (0x80 if seconds else 0))
        if not seconds:
            break
    timestamp = b"\x08" + bytes(varint) + b"\x10\x95\x9a\xef\x3a"
    payload = (
        b"\x0a\x243ac7e3c4-4401-4b8d-9386-a5c902f9202d"
        b"\x12" + bytes([len(timestamp)]) + timestamp + b"\x40\x01"
    )
    result = _decode("chirpstack", CS_TOPIC, payload)
    assert result.decoded.readings == []
    assert _reasons(result) in (["invalid_utf8"], ["invalid_json"])


def test_chirpstack_codec_fields_named_like_the_event_stay_measurements() -> None:
    """A codec may return fields named as the event's own (``devEui``, ``fPort``): inside
    ``object`` they are measurements, and the sensor is still the topic's."""
    doc = _documented("chirpstack", "chirpstack-up")
    doc["object"] = {"temperature": 21.0, "devEui": "not-the-sensor", "fPort": 9.0}
    [reading] = _decode("chirpstack", CS_TOPIC, doc).decoded.readings
    assert reading.sensor_id == "0101010101010101"
    assert reading.values == {"temperature": 21.0, "devEui": "not-the-sensor", "fPort": 9.0}
    assert reading.info == {"device_name": "Test device"}


def test_chirpstack_codec_time_dates_the_reading_and_a_bad_one_is_counted() -> None:
    """``time`` is looked up in ``object`` first: a codec that returns the device's own
    measurement time dates the reading with it (and it is not a measurement); one that is
    not a time refuses the uplink as ``bad_timestamp``, counted."""
    doc = _documented("chirpstack", "chirpstack-up")
    t = base_time(time.time()) - 60
    doc["object"] = {
        "temperature": 21.0,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)),
    }
    [reading] = _decode("chirpstack", CS_TOPIC, doc).decoded.readings
    assert (reading.epoch, reading.values) == (int(t), {"temperature": 21.0})
    doc["object"] = {"temperature": 21.0, "time": "12:00"}
    result = _decode("chirpstack", CS_TOPIC, doc)
    assert result.decoded.readings == []
    assert _reasons(result) == ["bad_timestamp"]


def test_the_status_rule_in_the_docs_reads_chirpstack_status_events() -> None:
    """docs/presets.md's rule for the ``status`` event, in place of the ignored one: the
    documented status example (every field, as v4 emits them) is one reading."""
    docs = (ROOT / "docs" / "presets.md").read_text()
    block = re.search(r"```toml\n(# chirpstack-status, read.*?)```", docs, re.DOTALL)
    assert block is not None
    preset = (ROOT / "ingest" / "devices" / "presets" / "chirpstack.toml").read_text()
    ignored = (
        'name = "chirpstack-status"\ntopic = "application/+/device/+/event/status"\nignore = true\n'
    )
    assert ignored in preset
    rules = parse(block.group(1), "docs") + parse(
        preset.replace("[[rule]]\n" + ignored, ""), "copy"
    )
    t = base_time(time.time())
    status = orjson.dumps(
        {
            "deduplicationId": "bf2a9746-1c8b-49be-a92e-f0b89c8534e4",
            "time": time.strftime("%Y-%m-%dT%H:%M:%S.250172638+00:00", time.gmtime(t)),
            "deviceInfo": {
                "tenantId": "52f14cd4-c6f1-4fbd-8f87-4025e1d49242",
                "applicationId": "17c82e96-be03-4f38-aef3-f83d48582d97",
                "deviceName": "Test device",
                "devEui": "0101010101010101",
                "deviceClassEnabled": "CLASS_A",
                "tags": {},
            },
            "margin": 10,
            "externalPowerSource": False,
            "batteryLevelUnavailable": False,
            "batteryLevel": 88.3,
        }
    )
    result = Mapping(rules).decode(
        CS_TOPIC.replace("/up", "/status"), status, time.time(), Limits()
    )
    assert result.decoded.rejections == []
    [reading] = result.decoded.readings
    assert (reading.sensor_id, reading.values, reading.info, reading.ms) == (
        "0101010101010101",
        {
            "margin": 10,
            "externalPowerSource": False,
            "batteryLevelUnavailable": False,
            "batteryLevel": 88.3,
        },
        {"device_name": "Test device"},
        round(t * 1000),
    )


def test_the_benchmark_uplinks_are_fully_decoded_by_the_ttn_preset() -> None:
    """bench.mapping --stream ttn measures what it says: every uplink one reading of four
    values, at its Network Server time, a millisecond apart, tagged and described."""
    from bench.mapping import ttn  # noqa: PLC0415

    lines, topics = ttn(30, 7)
    assert all(1000 <= len(line) <= 1500 for line in lines)
    mapping = Mapping.load(None, ["ttn"])
    now = time.time()
    results = [mapping.decode(t, p, now, Limits()) for p, t in zip(lines, topics, strict=True)]
    assert all(r.decoded.rejections == [] for r in results)
    readings = [reading for r in results for reading in r.decoded.readings]
    assert len(readings) == 30
    assert len({r.sensor_id for r in readings}) == 7
    assert all(
        set(r.values) == {"temperature", "humidity", "battery", "light"}
        and r.tags == {"application": "bench-app@ttn"}
        and r.info is not None
        for r in readings
    )
    assert [r.ms for r in readings] == list(range(readings[0].ms or 0, (readings[0].ms or 0) + 30))

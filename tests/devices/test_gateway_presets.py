"""Gateways that name their devices in the payload: the rtl_433, openmqttgateway and
tasmota (Zigbee bridge) presets through the real mapping engine (docs/presets.md).

Messages are shaped as rtl_433's decoders (src/devices/*.c data_make), OpenMQTTGateway
(main/ZgatewayBT.cpp, docs/use/ble.md) and Tasmota (docs/Zigbee.md) publish them; the
fixtures in tests/fixtures/devices/ go through the daemon in tests/devices/test_presets.py.
"""

from __future__ import annotations

import re
import shlex
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from ingest.devices.check import check
from ingest.devices.mapping import Mapping
from ingest.devices.rules import parse
from tests.devices.test_mapping import NOW, reasons, run
from tests.support.procs import ROOT

RTL_433 = Mapping.load(None, ["rtl_433"])
OMG = Mapping.load(None, ["openmqttgateway"])
TASMOTA = Mapping.load(None, ["tasmota"])
EVENTS = "rtl_433/raspi/events"
# rtl_433's devices topic names a device by these fields, in this order, those present
# (src/output_mqtt.c: devices[/type][/model][/subtype][/channel][/id]); `type` ("TPMS")
# only ever comes with models of its own, and is kept as info.
NAMING = ("model", "subtype", "channel", "id")


@pytest.mark.parametrize(
    "present",
    [
        ("model",),
        ("model", "id"),
        ("model", "channel"),
        ("model", "subtype"),
        ("model", "channel", "id"),
        ("model", "subtype", "id"),
        ("model", "subtype", "channel"),
        ("model", "subtype", "channel", "id"),
    ],
)
def test_an_rtl_433_device_is_named_by_the_fields_rtl_433_names_it_by(
    present: tuple[str, ...],
) -> None:
    sample: dict[str, Any] = {"model": "Prologue-TH", "subtype": 9, "channel": 1, "id": 226}
    event = {
        "time": "2024-01-01 12:00:00",
        **{k: sample[k] for k in present},
        "battery_ok": 1,
        "temperature_C": 20.1,
        "mic": "CHECKSUM",
    }
    [reading] = run(RTL_433, EVENTS, event).decoded.readings
    assert reading.sensor_id == "-".join(str(sample[k]) for k in NAMING if k in present)
    assert reading.values == {"battery_ok": 1, "temperature_C": 20.1}  # identity apart
    assert reading.tags == {"host": "raspi"}


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (None, "no_sensor_id"),  # no model: not a device event
        (3.5, "no_sensor_id"),
        (True, "no_sensor_id"),
        ({"$gt": ""}, "no_sensor_id"),
        (["Nexus-TH"], "no_sensor_id"),
        ("x" * 129, "bad_sensor_id"),
        ("Nexus\x00TH", "bad_sensor_id"),
    ],
)
def test_an_rtl_433_model_that_is_missing_huge_or_not_text_is_a_counted_rejection(
    model: object, reason: str
) -> None:
    event: dict[str, Any] = {"id": 42, "temperature_C": 20.5}
    if model is not None:
        event["model"] = model
    result = run(RTL_433, EVENTS, event)
    assert result.decoded.readings == []
    assert reasons(result) == [reason]


def test_an_rtl_433_id_too_long_is_refused_and_one_of_another_type_is_no_id() -> None:
    result = run(RTL_433, EVENTS, {"model": "Nexus-TH", "id": "7" * 200, "temperature_C": 1})
    assert reasons(result) == ["bad_sensor_id"]
    # A float id is no id (docs/mapping.md): the event is the model's, the float is not
    # stored as a measurement either.
    [reading] = run(
        RTL_433, EVENTS, {"model": "Nexus-TH", "id": 4.5, "temperature_C": 1}
    ).decoded.readings
    assert (reading.sensor_id, reading.values) == ("Nexus-TH", {"temperature_C": 1})


def test_dollars_and_dots_in_payload_identity_are_text_in_the_sensor_id() -> None:
    [reading] = run(
        RTL_433, EVENTS, {"model": "$set", "channel": "a.b", "id": "$where", "temperature_C": 2.5}
    ).decoded.readings
    assert reading.sensor_id == "$set-a.b-$where"
    assert reading.values == {"temperature_C": 2.5}
    [reading] = run(
        TASMOTA,
        "tele/zbbridge/SENSOR",
        {"ZbReceived": {"0x8F20": {"Device": "0x8F20", "Name": "$inc.x", "Temperature": 3.5}}},
    ).decoded.readings
    assert (reading.sensor_id, reading.values) == ("$inc.x", {"Temperature": 3.5})


def _with_rtl_433_time() -> Mapping:
    """The preset as its header says to copy it for rtl_433's own time."""
    text = (ROOT / "ingest" / "devices" / "presets" / "rtl_433.toml").read_text()
    old = 'drop = ["time", "mic",'
    assert old in text
    return Mapping(
        parse(
            text.replace(old, 'drop = ["mic",')
            + '\n[rule.time]\nfield = "time"\nformat = "auto"\n',
            "copy",
        )
    )


def test_rtl_433_time_options_with_a_zone_give_the_instant_as_the_header_says() -> None:
    copy = _with_rtl_433_time()
    instant = datetime.fromtimestamp(int(NOW) - 3600, UTC).replace(microsecond=123456)
    plus1 = instant.astimezone(timezone(timedelta(hours=1)))
    for option, text in (
        ("-M time:unix:usec", f"{instant.timestamp():.6f}"),
        ("-M time:iso:tz:usec", plus1.strftime("%Y-%m-%dT%H:%M:%S.%f%z")),
        ("-M time:tz", plus1.strftime("%Y-%m-%d %H:%M:%S%z")),
    ):
        event = {"time": text, "model": "Nexus-TH", "id": 42, "temperature_C": 20.5}
        [reading] = run(copy, EVENTS, event).decoded.readings
        whole = option == "-M time:tz"
        assert reading.ts == (
            instant.replace(microsecond=0) if whole else instant.replace(microsecond=123000)
        ), option
        assert reading.values == {"temperature_C": 20.5}
    # Without a zone (rtl_433's default) the copy cannot place the time: refused, which
    # is why the preset itself times readings at their arrival.
    local = {
        "time": plus1.strftime("%Y-%m-%d %H:%M:%S"),
        "model": "Nexus-TH",
        "id": 42,
        "temperature_C": 20.5,
    }
    assert reasons(run(copy, EVENTS, local)) == ["bad_timestamp"]
    [reading] = run(RTL_433, EVENTS, local).decoded.readings
    assert abs(reading.epoch - NOW) < 1


def test_openmqttgateway_reads_rtl_433_json_as_the_rtl_433_preset_does() -> None:
    """The same identity, values and units; only the receiver's rssi differs (dBm from
    rtl_433_ESP's radio, dB relative to full scale from rtl_433's -M level)."""
    [omg] = [r for r in OMG.rules if r.name == "omg-rtl_433"]
    [rtl] = [r for r in RTL_433.rules if r.name == "rtl_433"]
    assert omg.sensor_id is not None
    assert rtl.sensor_id is not None
    assert omg.sensor_id.text == rtl.sensor_id.text
    assert (omg.drop, omg.rename, omg.strings) == (rtl.drop, rtl.rename, rtl.strings)
    units = {k: u.text for k, u in rtl.units.items()}
    assert {k: u.text for k, u in omg.units.items()} == {**units, "rssi": "dBm"}


def test_a_device_heard_through_openmqttgateway_has_the_id_rtl_433_gives_it() -> None:
    event = {
        "model": "Fineoffset-WHx080",
        "subtype": 0,
        "id": 241,
        "battery_ok": 1,
        "temperature_C": 13.6,
        "mic": "CRC",
    }
    [direct] = run(RTL_433, EVENTS, event).decoded.readings
    [omg] = run(
        OMG, "home/OMG_rtl_433_ESP/RTL_433toMQTT/Fineoffset-WHx080/0/241", {**event, "rssi": -64}
    ).decoded.readings
    assert direct.sensor_id == omg.sensor_id == "Fineoffset-WHx080-0-241"
    assert omg.info == {"gateway": "OMG_rtl_433_ESP"}


def test_an_openmqttgateway_device_is_its_topic_level_whatever_the_payload_says() -> None:
    """The gateway's device topic (the MAC, or the iBeacon UUID with pubuuid4topic) is the
    identity: a payload id, model or name never changes it."""
    uuid_topic = "home/OpenMQTTGateway/BTtoMQTT/1de4b189115e45f6b44e509352269977"
    beacon = {
        "id": "7B:63:C6:82:DC:57",
        "mac_type": 1,
        "rssi": -83,
        "brand": "GENERIC",
        "model": "iBeacon",
        "model_id": "IBEACON",
        "mfid": "4c00",
        "uuid": "1de4b189115e45f6b44e509352269977",
        "major": 0,
        "minor": 0,
        "txpower": -66,
    }
    [reading] = run(OMG, uuid_topic, beacon).decoded.readings
    assert reading.sensor_id == "1de4b189115e45f6b44e509352269977"
    [reading] = run(
        OMG,
        "home/OpenMQTTGateway/BTtoMQTT/A4C138D5D498",
        {"id": "$set", "model": "$where.x", "tempc": 20},
    ).decoded.readings
    assert (reading.sensor_id, reading.values, reading.info) == (
        "A4C138D5D498",
        {"tempc": 20},
        {"gateway": "OpenMQTTGateway", "model": "$where.x"},
    )
    # An advertised name longer than a tag may be refuses the reading, never cut.
    result = run(
        OMG, "home/OpenMQTTGateway/BTtoMQTT/A4C138D5D498", {"name": "x" * 300, "tempc": 20}
    )
    assert (result.decoded.readings, reasons(result)) == ([], ["bad_value"])


def test_tasmota_zigbee_key_by_friendly_name_with_arrays_left_out_and_counted() -> None:
    """docs/Zigbee.md, SetOption83 1: the friendly name is the key; the Aqara sensor's
    arrays cannot be stored and are counted, the rest of its reading is stored."""
    result = run(
        TASMOTA,
        "tele/zbbridge/SENSOR",
        {
            "ZbReceived": {
                "Vibration_sensor": {
                    "Device": "0x128F",
                    "AqaraVibrationMode": "tilt",
                    "AqaraVibrationsOrAngle": 171,
                    "AqaraAccelerometer": [-691, 8, 136],
                    "AqaraAngles": [-78, 1, 11],
                    "LinkQuality": 153,
                }
            }
        },
    )
    [reading] = result.decoded.readings
    assert (reading.sensor_id, reading.values) == (
        "Vibration_sensor",
        {"AqaraVibrationMode": "tilt", "AqaraVibrationsOrAngle": 171, "LinkQuality": 153},
    )
    assert reasons(result) == ["bad_value", "bad_value"]


def test_tasmota_zigbee_identity_falls_back_in_order_and_the_bridge_time_is_not_a_value() -> None:
    """Name, then the key (short address or name), then the device topic; a Name that is
    not text is no name; one too long refuses the reading rather than cutting it."""

    def ids(device: dict[str, Any]) -> list[str]:
        payload = {"Time": "2026-11-26T20:00:00", "ZbReceived": {"0x8F20": device}}
        return [r.sensor_id for r in run(TASMOTA, "tele/zbbridge/SENSOR", payload).decoded.readings]

    assert ids({"Device": "0x8F20", "Name": "Kitchen", "Power": 1}) == ["Kitchen"]
    assert ids({"Device": "0x8F20", "Name": 12.5, "Power": 1}) == ["0x8F20"]
    result = run(
        TASMOTA, "tele/zbbridge/SENSOR", {"ZbReceived": {"0x8F20": {"Name": "K" * 129, "Power": 1}}}
    )
    assert reasons(result) == ["bad_sensor_id"]
    [reading] = run(
        TASMOTA,
        "tele/zbbridge/SENSOR",
        {"Time": "2026-11-26T20:00:00", "ZbReceived": {"0x8F20": {"Power": 1}}},
    ).decoded.readings
    assert reading.values == {"Power": 1}
    assert abs(reading.epoch - NOW) < 1


def _examples() -> list[tuple[list[str], list[str]]]:
    """docs/presets.md's `ingest check` examples timed at arrival (shown as "…"), each
    with the lines printed under it."""
    text = (ROOT / "docs" / "presets.md").read_text()
    found = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```$", text, re.MULTILINE | re.DOTALL):
        for command, output in re.findall(
            r"^\$ ingest check (.*)\n((?:(?!\$ ).*\n)*)", block, re.MULTILINE
        ):
            if "--mapping" in command:  # a file of the reader's own: test_api_params runs it
                continue
            lines = output.splitlines()
            if all('"ts":' not in line or '"ts":"…"' in line for line in lines):
                found.append((shlex.split(command), lines))
    return found


@pytest.mark.parametrize(("args", "lines"), _examples())
def test_each_check_example_in_the_presets_page_prints_what_it_shows(
    args: list[str], lines: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    presets = [args[i + 1] for i, a in enumerate(args) if a == "--preset"]
    topic = args[args.index("--topic-name") + 1]
    earlier = [(args[i + 1], args[i + 2]) for i, a in enumerate(args) if a == "--earlier"]
    check(Mapping.load(None, presets), topic, args[-1], earlier=earlier)
    printed = re.sub(r'"ts":"[^"]*"', '"ts":"…"', capsys.readouterr().out)
    assert printed.splitlines() == lines

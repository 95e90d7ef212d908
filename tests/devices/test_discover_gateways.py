"""``ingest discover`` and gateways whose messages list the devices they heard: an array
of device objects under a key (``each``), a payload that is such an array, an object of
objects keyed by device (Tasmota's ``ZbReceived``). The proposal makes one reading per
device under its own id, keeps the gateway's topic level as info, renames reserved field
names and gives the units the field names imply; applied unchanged, the daemon stores
that."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, TypedDict

from ingest.devices.discover.patterns import Captured
from ingest.devices.discover.proposal import rule_text
from ingest.devices.discover.propose import propose
from tests.devices.test_discover_conventions import js, readings, rejected
from tests.devices.test_presets import assert_stored
from tests.support.devices import Expected, Message
from tests.support.discover import advised, discover, send
from tests.support.procs import eventually

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from ingest.model import Scalar
    from tests.support.procs import Broker, Daemon

# A 433 MHz gateway's round: the devices it heard, one without a model; seq is a name the
# daemon keeps for itself, batt a number whose unit no name gives: millivolts, not a
# percentage (no whole number from 0 to 100) (docs/onboarding.md).
SHED = {
    "devices": [
        {"id": "a4c1381f", "model": "THB2", "temp": 21.4, "hum": 48, "batt": 2950, "seq": 112},
        {"id": "38c1a2b7", "model": "SOIL", "moisture": 37, "temp": 11.9, "batt": 3010, "seq": 9},
        {"id": "c0ffee01", "temp": 4.8, "batt": 2710, "seq": 55},
    ]
}
GREENHOUSE = {
    "devices": [
        {"id": "5e7a11c4", "model": "THB2", "temp": 24.9, "hum": 71, "batt": 2890, "seq": 4}
    ]
}


class Advert(TypedDict):
    """One advertisement in the BLE hub's array."""

    mac: str
    model: str
    temperature_C: float
    humidity: int
    battery_mV: int


# A BLE hub publishing the advertisements it heard as a JSON array (rtl_433-style names).
PORCH: list[Advert] = [
    {
        "mac": "A4:C1:38:0B:5E:7A",
        "model": "LYWSD03MMC",
        "temperature_C": 12.5,
        "humidity": 81,
        "battery_mV": 2950,
    },
    {
        "mac": "A4:C1:38:91:0C:33",
        "model": "LYWSD03MMC",
        "temperature_C": 13.0,
        "humidity": 77,
        "battery_mV": 3010,
    },
]
# A Tasmota Zigbee bridge under a FullTopic of its own (the tasmota preset reads
# tele/<topic>/SENSOR): ZbReceived as the tasmota fixture has it (docs/Zigbee.md).
ZIGBEE = [
    {
        "ZbReceived": {
            "0x2916": {
                "Device": "0x2916",
                "Temperature": 26.27,
                "Humidity": 47.73,
                "Endpoint": 1,
                "LinkQuality": 105,
            }
        }
    },
    {"ZbReceived": {"0x7120": {"Device": "0x7120", "Power": 1, "Endpoint": 1, "LinkQuality": 229}}},
]


def test_an_array_of_devices_gives_a_reading_each_and_the_gateway_as_info() -> None:
    messages = [
        Captured("rf-gateway/shed/events", js(SHED)),
        Captured("rf-gateway/greenhouse/events", js(GREENHOUSE)),
    ]
    (pattern,) = propose(messages)
    assert pattern.levels == ["rf-gateway", "{gateway}", "events"]
    assert (pattern.each, pattern.sensor_id, pattern.info) == (
        "devices",
        ["{model}-{id}", "{id}"],
        ["gateway"],
    )
    assert pattern.drop == []  # the array is the readings, not a field to drop
    # temp as temperature (°C, metric), not batt (2950: mV, not %)
    assert pattern.units == {"hum": "%", "moisture": "%", "temp": "°C"}
    assert any(
        n.startswith(
            "messages list the devices they carry (up to 3 in one, in the array 'devices')"
        )
        for n in pattern.notes
    )
    assert any("batt has no unit" in n for n in pattern.notes)
    text = rule_text(pattern, "gw", time.time())
    assert '[rule.rename]\n"seq" = "device_seq"' in text
    got = readings(pattern, messages)
    assert [(r.sensor_id, r.values, r.units, r.info) for r in got] == [
        (
            "THB2-a4c1381f",
            {"temp": 21.4, "hum": 48, "batt": 2950, "device_seq": 112},
            {"hum": "%", "temp": "°C"},
            {"gateway": "shed"},
        ),
        (
            "SOIL-38c1a2b7",
            {"moisture": 37, "temp": 11.9, "batt": 3010, "device_seq": 9},
            {"moisture": "%", "temp": "°C"},
            {"gateway": "shed"},
        ),
        (
            "c0ffee01",
            {"temp": 4.8, "batt": 2710, "device_seq": 55},
            {"temp": "°C"},
            {"gateway": "shed"},
        ),
        (
            "THB2-5e7a11c4",
            {"temp": 24.9, "hum": 71, "batt": 2890, "device_seq": 4},
            {"hum": "%", "temp": "°C"},
            {"gateway": "greenhouse"},
        ),
    ]
    assert all(r.tags == {} for r in got)  # the gateway is not part of the series


def test_a_payload_that_is_an_array_of_devices_and_an_object_keyed_by_device() -> None:
    porch = [Captured("ble-hub/porch", js(PORCH))]
    (pattern,) = propose(porch)
    assert (pattern.levels, pattern.each, pattern.sensor_id) == (
        ["ble-hub", "{gateway}"],
        None,
        ["{mac}"],
    )
    assert pattern.info == ["gateway", "model"]
    assert pattern.units == {"temperature_C": "°C", "humidity": "%", "battery_mV": "mV"}
    assert [(r.sensor_id, r.info) for r in readings(pattern, porch)] == [
        ("A4:C1:38:0B:5E:7A", {"model": "LYWSD03MMC", "gateway": "porch"}),
        ("A4:C1:38:91:0C:33", {"model": "LYWSD03MMC", "gateway": "porch"}),
    ]
    zigbee = [Captured("zb-hub/kitchen/tele/SENSOR", js(doc)) for doc in ZIGBEE]
    (pattern,) = propose(zigbee)
    assert (pattern.levels, pattern.each, pattern.sensor_id, pattern.drop) == (
        ["zb-hub", "{gateway}", "tele", "SENSOR"],
        "ZbReceived",
        ["{_key}"],
        ["Device"],
    )
    # Temperature from the names' table (Tasmota's default is °C); Power is a relay's
    # 0/1 state, no power in W
    assert pattern.units == {"Humidity": "%", "Temperature": "°C"}
    assert [(r.sensor_id, r.values) for r in readings(pattern, zigbee)] == [
        ("0x2916", {"Temperature": 26.27, "Humidity": 47.73, "Endpoint": 1, "LinkQuality": 105}),
        ("0x7120", {"Power": 1, "Endpoint": 1, "LinkQuality": 229}),
    ]


def test_the_messages_time_dates_its_devices_and_a_narrowed_gateway_stays_info() -> None:
    """A time the message gives beside its list dates every device's reading; a rule
    narrowed to one gateway (to leave a preset's topics alone) keeps it as info."""
    sent = int(time.time()) - 60
    messages = [Captured("rf-gateway/shed/events", js({"time": sent, **SHED}))]
    (pattern,) = propose(messages)
    assert '[rule.time]\nfield = "time"' in rule_text(pattern, "gw", time.time())
    assert {r.ts.timestamp() for r in readings(pattern, messages)} == {sent}
    narrowed = pattern.narrowed(1, "shed", {"rf-gateway/shed/events"})
    assert narrowed.levels == ["rf-gateway", "shed", "events"]
    got = readings(narrowed, messages)
    assert got
    for r in got:
        assert r.info is not None
        assert r.tags is not None
        assert (r.info["gateway"], len(r.tags)) == ("shed", 0)


def test_arrays_that_do_not_list_devices_are_still_dropped() -> None:
    """An alarm list whose ids repeat under every machine names no device, and objects
    of objects keyed by sensor type (Tasmota's AM2301) are not devices: the topic level
    stays the device."""
    alarms = [
        Captured(
            f"factory/press-{n}/telemetry",
            js({"rpm": 1200 + n, "alarms": [{"id": 1, "level": 2}, {"id": 2, "level": 1}]}),
        )
        for n in (7, 8, 9)
    ]
    (pattern,) = propose(alarms)
    assert (pattern.levels, pattern.each) == (["factory", "{sensor_id}", "telemetry"], None)
    assert 'drop = ["alarms"]' in rule_text(pattern, "press", time.time())
    types = [
        Captured(
            f"plug/{n}/SENSOR",
            js({"AM2301": {"Temperature": 21.5}, "DS18B20": {"Temperature": 19.0}}),
        )
        for n in ("a1", "b2")
    ]
    (pattern,) = propose(types)
    assert (pattern.levels, pattern.each) == (["plug", "{sensor_id}", "SENSOR"], None)


async def test_onboarding_gateways_that_list_their_devices_as_discover_proposes(
    persistent: Broker, daemon: Callable[..., Daemon], mode: str, db: Any, tmp_path: Path
) -> None:
    """Three gateways no preset knows, each listing its devices its own way: discover's
    proposal, applied unchanged, stores one reading per device under its own id, with
    the units the names give and the gateway as info."""
    messages = [
        ("rf-gateway/shed/events", js(SHED)),
        ("rf-gateway/greenhouse/events", js(GREENHOUSE)),
        ("ble-hub/porch", js(PORCH)),
        *(("zb-hub/kitchen/tele/SENSOR", js(doc)) for doc in ZIGBEE),
    ]
    text, report = await discover(persistent, [], messages)
    assert 'each = "devices"' in text
    assert 'each = "ZbReceived"' in text
    mapping = tmp_path / "proposal.toml"
    mapping.write_text(text)
    flags = advised(report, mapping)
    assert flags == ["--mapping", str(mapping)]
    proc = daemon(*flags, broker_url=persistent.url, rule_topics=True)
    started = time.time()
    await send(persistent, messages)

    def arrival(
        sensor: str, values: dict[str, Scalar], units: dict[str, str] | None, info: dict[str, str]
    ) -> Expected:
        return Expected(sensor, "arrival", values, None, units, info)

    expected = [
        arrival(
            "THB2-a4c1381f",
            {"temp": 21.4, "hum": 48, "batt": 2950, "device_seq": 112},
            {"hum": "%", "temp": "°C"},
            {"gateway": "shed"},
        ),
        arrival(
            "SOIL-38c1a2b7",
            {"moisture": 37, "temp": 11.9, "batt": 3010, "device_seq": 9},
            {"moisture": "%", "temp": "°C"},
            {"gateway": "shed"},
        ),
        arrival(
            "c0ffee01",
            {"temp": 4.8, "batt": 2710, "device_seq": 55},
            {"temp": "°C"},
            {"gateway": "shed"},
        ),
        arrival(
            "THB2-5e7a11c4",
            {"temp": 24.9, "hum": 71, "batt": 2890, "device_seq": 4},
            {"hum": "%", "temp": "°C"},
            {"gateway": "greenhouse"},
        ),
        *(
            arrival(
                d["mac"],
                {
                    "temperature_C": d["temperature_C"],
                    "humidity": d["humidity"],
                    "battery_mV": d["battery_mV"],
                },
                {"temperature_C": "°C", "humidity": "%", "battery_mV": "mV"},
                {"model": "LYWSD03MMC", "gateway": "porch"},
            )
            for d in PORCH
        ),
        arrival(
            "0x2916",
            {"Temperature": 26.27, "Humidity": 47.73, "Endpoint": 1, "LinkQuality": 105},
            {"Humidity": "%", "Temperature": "°C"},  # Temperature from the names' table
            {"gateway": "kitchen"},
        ),
        arrival(
            "0x7120", {"Power": 1, "Endpoint": 1, "LinkQuality": 229}, None, {"gateway": "kitchen"}
        ),
    ]
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == len(messages))
    await eventually(
        lambda: proc.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == len(expected)
    )
    assert rejected(proc) == 0  # seq renamed, not refused
    message = Message("gateways", "", b"", "", (), ignored=False, rejections=())
    await assert_stored(
        db,
        mode,
        [(message, e) for e in expected],
        0.0,
        (started, time.time()),
    )
    assert proc.stop() == 0

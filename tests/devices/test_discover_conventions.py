"""``ingest discover`` and the conventions that describe other topics: Home Assistant MQTT
discovery (units and names of the state topics its configs describe), Homie attributes,
and gateways whose payloads name the device (rtl_433's model, channel and id)."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pytest

from ingest.devices.decode import Limits
from ingest.devices.discover.conventions import read
from ingest.devices.discover.patterns import Captured
from ingest.devices.discover.proposal import rule_text
from ingest.devices.discover.propose import propose
from ingest.devices.mapping import Mapping
from ingest.devices.rules import parse
from tests.devices.test_homie import SUPER_CAR_V4, declare
from tests.devices.test_homie_daemon import typed
from tests.devices.test_presets import assert_counted, assert_stored
from tests.support.devices import Expected, Message, base_time, load
from tests.support.discover import advised, discover, send, units
from tests.support.mongo import COLLECTION, instants
from tests.support.procs import eventually

if TYPE_CHECKING:
    from collections.abc import Callable

    from ingest.devices.discover.patterns import Pattern
    from ingest.model import Reading
    from tests.support.procs import Broker, Daemon


def js(doc: object) -> bytes:
    return orjson.dumps(doc)


# Shaped as home-assistant.io source/_integrations/mqtt.markdown documents them: the
# "Sensors" example (two configs, one JSON state topic read with value_template), the
# binary sensor with a device, a switch in abbreviations with a base topic "~", and a
# device's plain-value topics outside the discovery prefix (abbreviated: stat_t,
# unit_of_meas, dev_cla, dev.ids).
HA_CONFIGS = [
    (
        "homeassistant/sensor/sensorBedroomT/config",
        js(
            {
                "device_class": "temperature",
                "state_topic": "homeassistant/sensor/sensorBedroom/state",
                "unit_of_measurement": "°C",
                "value_template": "{{ value_json.temperature}}",
                "unique_id": "temp01ae",
                "device": {
                    "identifiers": ["bedroom01ae"],
                    "name": "Bedroom",
                    "manufacturer": "Example sensors Ltd.",
                },
            }
        ),
    ),
    (
        "homeassistant/sensor/sensorBedroomH/config",
        js(
            {
                "device_class": "humidity",
                "state_topic": "homeassistant/sensor/sensorBedroom/state",
                "unit_of_measurement": "%",
                "value_template": "{{ value_json.humidity}}",
                "unique_id": "hum01ae",
                "device": {"identifiers": ["bedroom01ae"]},
            }
        ),
    ),
    (
        "homeassistant/binary_sensor/garden/config",
        js(
            {
                "name": None,
                "device_class": "motion",
                "state_topic": "homeassistant/binary_sensor/garden/state",
                "unique_id": "motion01ad",
                "device": {"identifiers": ["01ad"], "name": "Garden"},
            }
        ),
    ),
    (
        "homeassistant/switch/irrigation/config",
        js(
            {
                "~": "homeassistant/switch/irrigation",
                "name": "garden",
                "cmd_t": "~/set",
                "stat_t": "~/state",
            }
        ),
    ),
    (
        "homeassistant/sensor/kitchen_t/config",
        js(
            {
                "~": "kitchen/climate",
                "stat_t": "~/temperature",
                "unit_of_meas": "°C",
                "dev_cla": "temperature",
                "uniq_id": "kt1",
                "dev": {"ids": "kitchen01", "name": "Kitchen"},
            }
        ),
    ),
    (
        "homeassistant/sensor/kitchen_h/config",
        js(
            {
                "~": "kitchen/climate",
                "stat_t": "~/humidity",
                "unit_of_meas": "%",
                "dev_cla": "humidity",
                "uniq_id": "kh1",
                "dev": {"ids": "kitchen01"},
            }
        ),
    ),
]
HA_STATES = [
    ("homeassistant/sensor/sensorBedroom/state", js({"temperature": 23.2, "humidity": 43.7})),
    ("homeassistant/binary_sensor/garden/state", b"ON"),
    ("homeassistant/switch/irrigation/state", b"OFF"),
    ("homeassistant/switch/irrigation/set", b"ON"),
    ("kitchen/climate/temperature", b"21.5"),
    ("kitchen/climate/humidity", b"40"),
]
HA_STORED = {
    "bedroom01ae": (
        {"temperature": 23.2, "humidity": 43.7},
        {"temperature": "°C", "humidity": "%"},
    ),
    "01ad": ({"motion": True}, {}),
    "irrigation": ({"garden": False}, {}),
    "kitchen01": ({"temperature": 21.5, "humidity": 40}, {"temperature": "°C", "humidity": "%"}),
}


async def test_home_assistant_discovery_configs_give_the_state_topics_units_and_devices(
    persistent: Broker, daemon: Callable[..., Daemon], mode: str, db: Any, tmp_path: Path
) -> None:
    """Configs retained (as Home Assistant recommends), states live: the proposal, run as
    discover advises, stores each state under the device the configs name, with the
    measurement and unit they give."""
    text, report = await discover(persistent, HA_CONFIGS, HA_STATES)
    assert "6 config(s) describe 5 state topic(s)" in text
    mapping = tmp_path / "proposal.toml"
    mapping.write_text(text)
    proc = daemon(*advised(report, mapping), broker_url=persistent.url, rule_topics=True)
    await send(persistent, HA_STATES)
    await eventually(lambda: _sensors(db, mode, len(HA_STORED)))
    await eventually(lambda: proc.metric("ingest_messages_acked_total") >= len(HA_STATES))
    got: dict[str, dict[str, Any]] = {}
    for (sensor, _, _), fields in (await instants(db[COLLECTION[mode]], mode)).items():
        got.setdefault(sensor, {}).update(fields)
    assert got == {sensor: values for sensor, (values, _) in HA_STORED.items()}
    assert type(got["01ad"]["motion"]) is bool
    assert await units(db, mode) == {sensor: u for sensor, (_, u) in HA_STORED.items()}
    assert proc.metric('ingest_messages_ignored_total{rule="homeassistant-housekeeping"}') == 1
    assert proc.stop() == 0


async def _sensors(db: Any, mode: str, n: int) -> bool:
    key = "sensor_id" if mode == "bucket" else "meta.sensor_id"
    return len(await db[COLLECTION[mode]].distinct(key)) >= n


def test_device_discovery_abbreviations_and_templates_are_read() -> None:
    """A device config (component ``device``, entities under ``cmps``, the state topic
    shared at the top) as mqtt.markdown's "Device discovery payload" shows it; a template
    discover cannot follow is kept as computed."""
    device = js(
        {
            "dev": {"ids": "ea334450945afc", "name": "Kitchen", "mf": "Bla electronics"},
            "o": {"name": "bla2mqtt", "sw": "2.1"},
            "cmps": {
                "some_unique_component_id1": {
                    "p": "sensor",
                    "device_class": "temperature",
                    "unit_of_measurement": "°C",
                    "value_template": "{{ value_json.temperature}}",
                    "unique_id": "temp01ae_t",
                },
                "some_unique_id2": {
                    "p": "sensor",
                    "device_class": "humidity",
                    "unit_of_measurement": "%",
                    "value_template": "{{ value_json['humidity'] | float }}",
                    "unique_id": "temp01ae_h",
                },
            },
            "state_topic": "sensorBedroom/state",
            "qos": 2,
        }
    )
    pump = js(
        {
            "name": "turned on",
            "state_topic": "pump/timestamp_on",
            "device_class": "timestamp",
            "value_template": "{{ as_datetime(value) }}",
            "unique_id": "hp_1231232_ts_on",
            "device": {"name": "Heat pump", "identifiers": ["hp_1231232"]},
        }
    )
    known = read(
        [
            ("homeassistant/device/ea334450945afc/config", device),
            ("homeassistant/sensor/hp_1231232/config", pump),
        ]
    )
    assert known.configs == 2
    shared = known.entities["sensorBedroom/state"]
    assert [(e.component, e.path, e.unit, e.device) for e in shared] == [
        ("sensor", ("temperature",), "°C", "ea334450945afc"),
        ("sensor", ("humidity",), "%", "ea334450945afc"),
    ]
    (timestamp,) = known.entities["pump/timestamp_on"]
    assert (timestamp.path, timestamp.template) == (None, "{{ as_datetime(value) }}")
    state = Captured("sensorBedroom/state", js({"temperature": 23.2, "humidity": 43.7}))
    (pattern,) = propose([state], known)
    assert pattern.units == {"temperature": "°C", "humidity": "%"}
    assert pattern.sensor_id == ["ea334450945afc"]
    (pump_pattern,) = propose([Captured("pump/timestamp_on", b"1707294116")], known)
    assert any("as_datetime" in note for note in pump_pattern.notes)


def readings(pattern: Pattern, messages: list[Captured]) -> list[Reading]:
    """What the pattern's rule makes of the messages, through the real engine."""
    mapping = Mapping(parse(rule_text(pattern, "proposed", time.time()), "proposal"))
    out: list[Reading] = []
    for msg in messages:
        result = mapping.decode(msg.topic, msg.payload, time.time(), Limits())
        assert not result.decoded.rejections, (msg.topic, result.decoded.rejections)
        out += result.decoded.readings
    return out


# rtl_433's JSON events (src/output_mqtt.c: the "events" topic; docs/DATA_FORMAT.md:
# model, id, channel, time, <Type>_<Unit> fields), several devices on one topic, on a
# base topic of the user's own (the default rtl_433/<host>/events is its preset's).
RADIO = [
    {
        "time": "2026-05-01 12:00:00",
        "model": "Acurite-Tower",
        "id": 12345,
        "channel": "A",
        "battery_ok": 1,
        "temperature_C": 21.3,
        "humidity": 45,
        "mic": "CHECKSUM",
    },
    {
        "time": "2026-05-01 12:00:05",
        "model": "Acurite-Tower",
        "id": 2211,
        "channel": "B",
        "battery_ok": 1,
        "temperature_C": 19.8,
        "humidity": 52,
        "mic": "CHECKSUM",
    },
    {
        "time": "2026-05-01 12:00:07",
        "model": "LaCrosse-TX141THBv2",
        "id": 51,
        "channel": 0,
        "battery_ok": 1,
        "temperature_C": 4.5,
        "humidity": 80,
        "test": "No",
    },
    {
        "time": "2026-05-01 12:01:00",
        "model": "Fineoffset-WH51",
        "id": "0d1a2b",
        "battery_ok": 0.9,
        "battery_mV": 1500,
        "moisture": 33,
        "ad_raw": 320,
        "mic": "CRC",
    },
]


def test_a_gateway_topic_takes_its_sensor_ids_from_the_payload() -> None:
    messages = [Captured("radio/shed-pi/events", js(doc)) for doc in RADIO]
    (pattern,) = propose(messages)
    assert pattern.levels == ["radio", "shed-pi", "events"]
    assert pattern.sensor_id == ["{model}-{channel}-{id}", "{model}-{id}"]
    assert any(n.startswith("one topic carries several devices") for n in pattern.notes)
    assert pattern.units == {
        "temperature_C": "°C",
        "humidity": "%",
        "moisture": "%",
        "battery_mV": "mV",
    }
    got = readings(pattern, messages)
    assert [r.sensor_id for r in got] == [
        "Acurite-Tower-A-12345",
        "Acurite-Tower-B-2211",
        "LaCrosse-TX141THBv2-0-51",
        "Fineoffset-WH51-0d1a2b",
    ]
    assert all("model" not in r.values and "id" not in r.values for r in got)
    assert got[0].units == {"temperature_C": "°C", "humidity": "%"}
    assert "time" not in got[0].values  # a local time without offset: noted, dropped


def test_a_mac_in_the_payload_is_the_device_and_its_model_descriptive_info() -> None:
    """A BLE gateway's topic per device, the payload's id a MAC: the sensor id needs no
    model beside it, and the model is kept as info."""
    docs = {
        "AABBCCDDEEFF": {
            "id": "AA:BB:CC:DD:EE:FF",
            "model": "LYWSD03MMC",
            "tempc": 21.4,
            "hum": 48,
        },
        "112233445566": {"id": "11:22:33:44:55:66", "model": "MiFlora", "tempc": 18.2, "moi": 40},
    }
    messages = [Captured(f"ble/gw1/{mac}", js(doc)) for mac, doc in docs.items()]
    (pattern,) = propose(messages)
    assert pattern.levels == ["ble", "gw1", "+"]
    assert (pattern.sensor_id, pattern.info, pattern.tags) == (
        ["{id}"],
        ["model"],
        {"model": "{model}"},
    )
    got = readings(pattern, messages)
    assert sorted((r.sensor_id, r.info) for r in got) == [
        ("11:22:33:44:55:66", {"model": "MiFlora"}),
        ("AA:BB:CC:DD:EE:FF", {"model": "LYWSD03MMC"}),
    ]


def test_a_level_whose_values_repeat_under_several_devices_is_a_node() -> None:
    """pump1/motor and pump2/motor: the level that varies most (motor, bearing, inlet) is
    a part of each pump, not a device; the pump is the sensor."""
    messages = [
        Captured(f"plant/{pump}/{part}/temp", b"41.5")
        for pump in ("pump1", "pump2")
        for part in ("motor", "bearing", "inlet")
    ]
    (pattern,) = propose(messages)
    assert pattern.levels == ["plant", "{sensor_id}", "{node}", "temp"]
    assert pattern.measurement == "{node}_temp"
    assert any("appears under several devices" in n for n in pattern.notes)
    got = readings(pattern, messages)
    assert sorted({r.sensor_id for r in got}) == ["pump1", "pump2"]
    assert {k for r in got for k in r.values} == {"motor_temp", "bearing_temp", "inlet_temp"}


def test_homie_devices_their_units_and_attributes() -> None:
    """Homie 4 (homieiot convention v4.0.0): the device is the level after the root, the
    node and property name the measurement, $unit gives its unit, and every $-attribute is
    ignored (one rule per depth where no reading shares it)."""
    tree = {
        "weather-1": {"dht": {"temperature": "°C", "humidity": "%"}, "bme": {"pressure": "hPa"}},
        "garage": {"dht": {"temperature": "°C"}},
    }
    messages = []
    for device, nodes in tree.items():
        base = f"homie/{device}"
        messages += [Captured(f"{base}/$homie", b"4.0.0"), Captured(f"{base}/$state", b"ready")]
        for node, props in nodes.items():
            messages.append(Captured(f"{base}/{node}/$properties", ",".join(props).encode()))
            for prop, unit in props.items():
                messages += [
                    Captured(f"{base}/{node}/{prop}/$datatype", b"float"),
                    Captured(f"{base}/{node}/{prop}/$unit", unit.encode()),
                    Captured(f"{base}/{node}/{prop}", b"21.5"),
                ]
    patterns = {"/".join(p.levels): p for p in propose(messages)}
    assert set(patterns) == {
        "homie/+/+",
        "homie/+/+/$properties",
        "homie/+/+/+/+",
        "homie/{sensor_id}/{level3}/{measurement}",
    }
    values = patterns["homie/{sensor_id}/{level3}/{measurement}"]
    assert values.measurement == "{level3}_{measurement}"
    assert values.units == {"dht_temperature": "°C", "dht_humidity": "%", "bme_pressure": "hPa"}
    got = readings(values, [m for m in messages if "$" not in m.topic])
    assert sorted((r.sensor_id, *r.values, *(r.units or {}).values()) for r in got) == [
        ("garage", "dht_temperature", "°C"),
        ("weather-1", "bme_pressure", "hPa"),
        ("weather-1", "dht_humidity", "%"),
        ("weather-1", "dht_temperature", "°C"),
    ]


# A plain-value device no preset knows, beside the gateway: the proposal has a rule.
GARDEN = [("garden/weather-1/temperature", b"21.5"), ("garden/weather-1/humidity", b"40")]


@pytest.mark.parametrize("vendor", ["openmqttgateway", "rtl_433"])
async def test_onboarding_a_gateway_as_discover_advises(
    vendor: str,
    persistent: Broker,
    daemon: Callable[..., Daemon],
    mode: str,
    db: Any,
    tmp_path: Path,
) -> None:
    """A new user's broker: a gateway publishing as its vendor documents (the preset's
    fixture, its hostile messages aside) and a device of their own. discover recommends
    the gateway's preset and proposes a rule for the rest; run exactly as advised, every
    device is stored under its own id with its values, units, info and time."""
    started = time.time()
    t = base_time(started)
    fixture = [m for m in load(vendor, t) if not m.rejections]
    messages = [(m.topic, m.payload) for m in fixture] + GARDEN
    text, report = await discover(persistent, [], messages)
    assert f"use --preset {vendor} with this file" in text
    mapping = tmp_path / "proposal.toml"
    mapping.write_text(text)
    flags = advised(report, mapping)
    assert flags == ["--preset", vendor, "--mapping", str(mapping)]
    proc = daemon(*flags, broker_url=persistent.url, rule_topics=True)
    await send(persistent, messages)
    expected = [(m, r) for m in fixture for r in m.readings]
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == len(messages))
    await eventually(
        lambda: (
            proc.metric(f'ingest_readings_written_total{{mode="{mode}"}}')
            == len(expected) + len(GARDEN)
        )
    )
    assert_counted(proc.metrics(), fixture)
    own = [
        (
            Message("garden", topic, payload, "garden", (), ignored=False, rejections=()),
            Expected("weather-1", "arrival", {name: value}, None, {name: unit}),
        )
        for (topic, payload), (name, value, unit) in zip(
            GARDEN, (("temperature", 21.5, "°C"), ("humidity", 40, "%")), strict=True
        )
    ]
    await assert_stored(db, mode, [*expected, *own], t, (started, time.time()))
    assert proc.stop() == 0


def homie_device(root: str) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]]]:
    """(retained, live): the Homie 4.0.0 super-car as the convention shows it (its engine
    node's temperature, speed and direction described, each value retained as well), then
    new values and a controller's command, under the domain ``root``."""
    described = [
        *SUPER_CAR_V4,
        *declare(
            "super-car",
            {
                "engine/speed": ("integer", "km/h", "0:300"),
                "engine/direction": ("enum", None, "forward,backward"),
            },
        ),
    ]
    values = [
        ("homie/super-car/engine/temperature", "20.0"),
        ("homie/super-car/engine/speed", "0"),
        ("homie/super-car/engine/direction", "backward"),
    ]
    live = [
        ("homie/super-car/engine/temperature", "21.5"),
        ("homie/super-car/engine/speed", "120"),
        ("homie/super-car/engine/direction", "forward"),
        ("homie/super-car/engine/speed/set", "100"),
    ]

    def under(messages: list[tuple[str, str]]) -> list[tuple[str, bytes]]:
        return [(f"{root}/{t.removeprefix('homie/')}", p.encode()) for t, p in messages]

    return under(described + values), under(live)


HOMIE_STORED = [
    ("super-car", {"engine_temperature": ("float", 21.5)}),
    ("super-car", {"engine_speed": ("int", 120)}),
    ("super-car", {"engine_direction": ("str", "forward")}),
]


def test_homie_devices_under_a_domain_of_their_own_get_a_homie_rule() -> None:
    """The convention lets a controller choose the root: the devices under myhome/ get a
    homie rule for that domain (typed by $datatype, as the preset reads homie/), and a
    topic there that belongs to no Homie device a rule of its own, tried first."""
    from ingest.devices.discover.command import finish  # noqa: PLC0415

    retained, live = homie_device("myhome")
    other = [("myhome/garage/door", b"open")]
    captured = [Captured(t, p, retained=True) for t, p in retained]
    captured += [Captured(t, p) for t, p in live + other]
    out, err = io.StringIO(), io.StringIO()
    assert finish(captured, [], [], out, err) == 0
    text = out.getvalue()
    assert 'topic = "myhome/#"\nformat = "homie"\n' in text
    assert text.index('topic = "myhome/{sensor_id}/door"') < text.index('"myhome/#"')
    assert advised(err.getvalue(), Path("p.toml")) == ["--mapping", "p.toml"]
    mapping = Mapping(parse(text, "proposal"))
    results = [mapping.decode(t, p, time.time(), Limits()) for t, p in retained + live]
    got = [
        (r.sensor_id, {k: (type(v).__name__, v) for k, v in r.values.items()}, r.units)
        for result in results[len(retained) :]
        for r in result.decoded.readings
    ]
    assert got == [
        (*HOMIE_STORED[0], {"engine_temperature": "°C"}),
        (*HOMIE_STORED[1], {"engine_speed": "km/h"}),
        (*HOMIE_STORED[2], None),
    ]


@pytest.mark.parametrize("root", ["homie", "myhome"])
async def test_onboarding_a_homie_device_as_discover_advises(
    root: str, persistent: Broker, daemon: Callable[..., Daemon], mode: str, db: Any, tmp_path: Path
) -> None:
    """A Homie 4 device's retained attributes and values, then live values: on homie/,
    discover recommends --preset homie and proposes nothing; under a root of its own, a
    homie rule for it. Run exactly as advised, every value is stored under the device id
    with its datatype's type and its $unit."""
    retained, live = homie_device(root)
    text, report = await discover(persistent, retained, live)
    mapping = tmp_path / "proposal.toml"
    mapping.write_text(text)
    flags = advised(report, mapping)
    if root == "homie":
        assert "use --preset homie with this file" in text
        assert flags == ["--preset", "homie"]
    else:
        assert flags == ["--mapping", str(mapping)]
    proc = daemon(*flags, broker_url=persistent.url, rule_topics=True)
    await eventually(
        lambda: proc.metric('ingest_homie_messages_total{kind="attribute"}') == 8
    )  # $datatype, $unit, $format
    await send(persistent, live)
    await eventually(
        lambda: proc.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == len(HOMIE_STORED)
    )
    assert await typed(db, mode) == HOMIE_STORED
    assert await units(db, mode) == {
        "super-car": {"engine_temperature": "°C", "engine_speed": "km/h"}
    }
    assert rejected(proc) == 0
    assert proc.stop() == 0


def rejected(proc: Daemon) -> float:
    """Readings the daemon rejected, for every reason."""
    return sum(
        v for k, v in proc.metrics().items() if k.startswith("ingest_readings_rejected_total{")
    )


def test_a_capture_the_presets_take_whole_is_run_with_the_presets_alone() -> None:
    """Nothing to propose: the advice names the presets and no mapping file (a file
    without rules would not load)."""
    from ingest.devices.discover.command import finish  # noqa: PLC0415

    t = base_time(time.time())
    messages = [Captured(m.topic, m.payload) for m in load("rtl_433", t) if not m.rejections]
    out, err = io.StringIO(), io.StringIO()
    assert finish(messages, [], [], out, err) == 0
    assert "[[rule]]" not in out.getvalue()
    assert "nothing to add" in out.getvalue()
    assert advised(err.getvalue(), Path("unused")) == ["--preset", "rtl_433"]

"""Homie end to end: real mosquitto, the daemon with a homie rule, MongoDB; and the
``homie_devices`` store the daemons share.

Each test's Homie domain is its own topic root (``<root>/<device>/...``, ``<root>/5/...``),
so the retained attributes and values it publishes reach no other test.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from ingest.devices.decode import Limits
from ingest.devices.formats import homie as hm
from ingest.devices.homie_state import COLLECTION, DeviceStore, HomieState
from tests.devices.test_sparkplug_daemon import readings
from tests.support.mongo import COLLECTION as READINGS
from tests.support.procs import eventually

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.support.procs import Broker, Daemon

LIMITS = Limits()
BULB = {
    "homie": "5.0",
    "version": 3,
    "name": "Bulb",
    "nodes": {
        "light": {
            "properties": {
                "on": {"datatype": "boolean", "settable": True},
                "brightness": {
                    "datatype": "integer",
                    "unit": "%",
                    "format": "0:100",
                    "settable": True,
                },
            }
        }
    },
}


def start(
    daemon: Callable[..., Daemon], tmp_path: Path, domain: str, *extra: str, **options: Any
) -> Daemon:
    """The daemon with the preset's rule for the test's own domain."""
    rules = tmp_path / "homie.toml"
    rules.write_text(f'[[rule]]\nname = "homie"\ntopic = "{domain}/#"\nformat = "homie"\n')
    return daemon("--mapping", str(rules), *extra, **options)


def car(d: str) -> list[tuple[str, str]]:
    """The attributes a Homie 4 car and a Homie 5 bulb publish (retained) when they connect:
    those this format uses and some it does not, in the order a device sends them."""
    return [
        (f"{d}/car/$homie", "4.0.0"),  # not subscribed (nothing the format uses)
        (f"{d}/car/engine/$properties", "temperature,rpm,code"),  # arrives, ignored
        (f"{d}/car/engine/temperature/$name", "Engine temperature"),  # not subscribed
        (f"{d}/car/engine/temperature/$unit", "°C"),
        (f"{d}/car/engine/temperature/$datatype", "float"),
        (f"{d}/car/engine/rpm/$datatype", "integer"),
        (f"{d}/car/engine/code/$datatype", "string"),
        (f"{d}/5/bulb/$state", "ready"),  # arrives, ignored
        (f"{d}/5/bulb/$description", json.dumps(BULB)),
    ]


async def typed(db: Any, mode: str) -> list[tuple[str, dict[str, tuple[str, Any]]]]:
    """(sensor, {measurement: (type, value)}) of every reading, in stored order per sensor."""
    return [
        (sensor, {k: (type(v).__name__, v) for k, v in values.items()})
        for sensor, _, values in await readings(db, mode)
    ]


async def units(db: Any, mode: str) -> dict[str, dict[str, str]]:
    """The units stored per sensor (bucket: each document's; time series: each reading's)."""
    out: dict[str, dict[str, str]] = {}
    for doc in await db[READINGS[mode]].find({}).to_list():
        sensor = doc["sensor_id"] if mode == "bucket" else doc["meta"]["sensor_id"]
        out.setdefault(sensor, {}).update(doc.get("units") or {})
    return out


async def test_retained_attributes_then_values_land_under_the_device_typed_with_units(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any, tmp_path: Path
) -> None:
    d = topic_root
    # Devices connected before the daemon: attributes and values retained on the broker.
    await publish(
        [*car(d), (f"{d}/car/engine/temperature", "20.0"), (f"{d}/5/bulb/light/on", "false")],
        retain=True,
    )
    proc = start(daemon, tmp_path, d)
    # on subscribing: 5 used attributes (taken), $properties and $state (ignored), 2 values
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 9)
    await publish(
        [
            (f"{d}/car/engine/temperature", "21.5"),
            (f"{d}/car/engine/rpm", "3000"),
            (f"{d}/car/engine/code", "0012"),
            (f"{d}/5/bulb/light/on", "true"),
            (f"{d}/5/bulb/light/brightness", "80"),
            (f"{d}/car/engine/rpm", "fast"),  # not an integer: bad_value
            (f"{d}/car/engine/oil", "3"),  # no $datatype: no_datatype
            # a controller's commands, a target, a broadcast: not even subscribed
            (f"{d}/car/engine/temperature/set", "30"),
            (f"{d}/5/bulb/light/brightness/set", "100"),
            (f"{d}/5/bulb/light/brightness/$target", "100"),
            (f"{d}/$broadcast/alert", "Intruder detected"),
        ]
    )
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 16)
    assert proc.metric("ingest_messages_received_total") == 16
    assert await typed(db, mode) == [
        ("bulb", {"light_on": ("bool", True)}),
        ("bulb", {"light_brightness": ("int", 80)}),
        ("car", {"engine_temperature": ("float", 21.5)}),
        ("car", {"engine_rpm": ("int", 3000)}),
        ("car", {"engine_code": ("str", "0012")}),
    ]
    assert await units(db, mode) == {
        "bulb": {"light_brightness": "%"},
        "car": {"engine_temperature": "°C"},
    }
    rejects = await db.rejects.find({}, {"reason": 1, "topic": 1}).to_list()
    assert sorted((r["reason"], r["topic"]) for r in rejects) == [
        ("bad_value", f"{d}/car/engine/rpm"),
        ("no_datatype", f"{d}/car/engine/oil"),
    ]
    metrics = proc.metrics()
    assert metrics['ingest_retained_messages_total{outcome="attribute"}'] == 7
    assert metrics['ingest_retained_messages_total{outcome="skipped"}'] == 2
    assert metrics['ingest_homie_messages_total{kind="attribute"}'] == 5
    assert metrics['ingest_homie_messages_total{kind="value"}'] == 7
    assert metrics['ingest_messages_ignored_total{rule="homie"}'] == 2
    devices = {doc["_id"]: doc async for doc in db[COLLECTION].find()}
    assert {k: (v["homie"], v["device"], v["properties"]) for k, v in devices.items()} == {
        f"{d}/car": (
            4,
            "car",
            {
                "engine/temperature": {"datatype": "float", "unit": "°C"},
                "engine/rpm": {"datatype": "integer"},
                "engine/code": {"datatype": "string"},
            },
        ),
        f"{d}/5/bulb": (
            5,
            "bulb",
            {
                "light/on": {"datatype": "boolean"},
                "light/brightness": {"datatype": "integer", "unit": "%", "format": "0:100"},
            },
        ),
    }
    assert devices[f"{d}/5/bulb"]["version"] == 3
    assert proc.stop() == 0


@pytest.mark.parametrize("mode", ["bucket"])
async def test_with_retained_store_the_retained_values_come_after_their_attributes(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any, tmp_path: Path
) -> None:
    d = topic_root
    # Published in the order a broker would send one homie/# subscription's retained
    # messages: each value before its property's attributes (a topic before its children).
    await publish(
        [(f"{d}/car/engine/temperature", "20.0"), *car(d), (f"{d}/5/bulb/light/brightness", "40")],
        retain=True,
    )
    proc = start(daemon, tmp_path, d, "--retained", "store")
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 9)
    assert await typed(db, mode) == [
        ("bulb", {"light_brightness": ("int", 40)}),
        ("car", {"engine_temperature": ("float", 20.0)}),
    ]
    assert await units(db, mode) == {
        "bulb": {"light_brightness": "%"},
        "car": {"engine_temperature": "°C"},
    }
    assert await db.rejects.count_documents({}) == 0
    metrics = proc.metrics()
    assert metrics['ingest_retained_messages_total{outcome="new"}'] == 2
    assert metrics['ingest_retained_messages_total{outcome="attribute"}'] == 7
    assert proc.stop() == 0


@pytest.mark.parametrize("mode", ["timeseries"])  # units per reading, not per bucket
async def test_every_worker_learns_every_attribute_and_a_restart_reads_them_back(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any, tmp_path: Path
) -> None:
    d = topic_root
    await publish(car(d), retain=True)
    proc = start(daemon, tmp_path, d, "--workers", "2")
    # Both workers took the 5 used attributes. (Each also has the $description a second
    # time, through the shared filter of Homie 4 values, d/+/+/+, which mosquitto sends
    # retained messages to on subscribing as well.)
    await eventually(
        lambda: proc.metric('ingest_homie_messages_total{kind="attribute"}') == 2 * (5 + 1)
    )
    # A live change reaches both workers too (subscribed unshared): no stale unit anywhere.
    await publish([(f"{d}/car/engine/temperature/$unit", "K")], retain=True)
    await eventually(
        lambda: proc.metric('ingest_homie_messages_total{kind="attribute"}') == 2 * (5 + 1) + 2
    )
    values = [(f"{d}/car/engine/temperature", f"{290 + n}.5") for n in range(10)]
    values += [(f"{d}/5/bulb/light/brightness", str(n)) for n in range(10)]
    await publish(values)
    await eventually(lambda: proc.metric('ingest_homie_messages_total{kind="value"}') == 20)
    await eventually(
        lambda: (
            proc.metric("ingest_messages_acked_total")
            == proc.metric("ingest_messages_received_total")
        )
    )
    assert await reading_units(db) == {
        ("car", "engine_temperature"): {"K"},
        ("bulb", "light_brightness"): {"%"},
    }
    assert await db.rejects.count_documents({}) == 0
    assert proc.stop() == 0
    # The sessions resume: no retained attributes come again; they are read from MongoDB.
    again = start(daemon, tmp_path, d, "--workers", "2")
    await publish(
        [(f"{d}/car/engine/temperature", "299.5"), (f"{d}/5/bulb/light/brightness", "99")]
    )
    await eventually(lambda: again.metric('ingest_homie_messages_total{kind="value"}') == 2)
    await eventually(
        lambda: (
            again.metric("ingest_messages_acked_total")
            == again.metric("ingest_messages_received_total")
        )
    )
    assert again.metric('ingest_homie_messages_total{kind="attribute"}') == 0
    assert again.metric('ingest_homie_device_lookups_total{outcome="found"}') >= 2
    stored = await typed(db, mode)
    assert len(stored) == 22
    assert ("car", {"engine_temperature": ("float", 299.5)}) in stored
    assert ("bulb", {"light_brightness": ("int", 99)}) in stored
    assert await reading_units(db) == {
        ("car", "engine_temperature"): {"K"},
        ("bulb", "light_brightness"): {"%"},
    }
    assert await db.rejects.count_documents({}) == 0
    assert again.stop() == 0


@pytest.mark.parametrize("mode", ["timeseries"])  # units per reading, not per bucket
@pytest.mark.parametrize("workers", [1, 2])
async def test_with_a_preset_of_wildcard_filters_every_value_is_stored_once_with_its_unit(
    daemon: Callable[..., Daemon],
    mode: str,
    workers: int,
    publish: Any,
    persistent: Broker,
    db: Any,
) -> None:
    """``--preset homie --preset esphome``: the filters join into ``+/#`` (ESPHome's start
    with a wildcard level), so a broker of the test's own. The Homie attribute topics are
    subscribed apart and first (unshared in a group), so each attribute comes twice and
    the second copy changes nothing; every value comes once, on ``+/#``."""
    d = "homie"
    await publish(
        [
            *car(d),
            (f"{d}/car/engine/temperature", "20.0"),
            ("kitchen/sensor/temperature/state", "19.5"),
        ],
        retain=True,
        to=persistent,
    )
    group = ["--shared-group", "g", "--workers", "2"] if workers == 2 else []
    retained = ["--retained", "store"] if workers == 1 else []  # one worker: no race
    proc = daemon(
        "--preset",
        "homie",
        "--preset",
        "esphome",
        *group,
        *retained,
        rule_topics=True,
        broker_url=persistent.url,
    )
    attributes = ", ".join(
        [*(f"homie/+/+/+/{a}" for a in ("$datatype", "$unit", "$format")), "homie/5/+/$description"]
    )
    assert f"subscribed to {attributes}, {'$share/g/' if group else ''}+/#" in proc.logs()
    # Each daemon: the 5 used attributes on their own subscriptions, then on +/# again
    # (with the 9 retained messages of car() and the 2 retained values).
    await eventually(
        lambda: proc.metric('ingest_homie_messages_total{kind="attribute"}') == workers * 10
    )
    await publish(
        [
            (f"{d}/car/engine/temperature", "21.5"),
            (f"{d}/car/engine/rpm", "3000"),
            (f"{d}/5/bulb/light/brightness", "80"),
            ("kitchen/sensor/temperature/state", "20.0"),
            ("kitchen/binary_sensor/motion/state", "ON"),
        ],
        to=persistent,
    )
    await eventually(
        lambda: (
            proc.metric('ingest_homie_messages_total{kind="value"}') == 3 + (1 if retained else 0)
        )
    )
    await eventually(
        lambda: (
            proc.metric("ingest_messages_acked_total")
            == proc.metric("ingest_messages_received_total")
            == workers * 16 + 5
        )
    )
    stored = sorted(await typed(db, mode), key=repr)
    assert stored == sorted(
        [
            *(
                [
                    ("car", {"engine_temperature": ("float", 20.0)}),
                    ("kitchen", {"temperature": ("float", 19.5)}),
                ]
                if retained
                else []
            ),
            ("car", {"engine_temperature": ("float", 21.5)}),
            ("car", {"engine_rpm": ("int", 3000)}),
            ("bulb", {"light_brightness": ("int", 80)}),
            ("kitchen", {"temperature": ("float", 20.0)}),
            ("kitchen", {"motion": ("bool", True)}),
        ],
        key=repr,
    )
    assert await reading_units(db) == {
        ("car", "engine_temperature"): {"°C"},
        ("bulb", "light_brightness"): {"%"},
    }
    assert await db.rejects.count_documents({}) == 0
    devices = {doc["_id"]: doc["properties"] async for doc in db[COLLECTION].find()}
    assert devices["homie/car"]["engine/temperature"] == {"datatype": "float", "unit": "°C"}
    assert devices["homie/5/bulb"]["light/brightness"]["unit"] == "%"
    assert proc.stop() == 0


async def reading_units(db: Any) -> dict[tuple[str, str], set[str]]:
    """Time-series mode: (sensor, measurement) -> the units its readings were stored with."""
    out: dict[tuple[str, str], set[str]] = {}
    for doc in await db[READINGS["timeseries"]].find({}).to_list():
        for name, unit in (doc.get("units") or {}).items():
            out.setdefault((doc["meta"]["sensor_id"], name), set()).add(unit)
    return out


async def test_devices_evicted_for_their_properties_are_read_again_from_mongodb(
    db: Any,
) -> None:
    # room for one car's three properties, not two cars'; each car looked up in vain first
    fmt = HomieState(hm.HomieFormat(max_properties=4), DeviceStore(db[COLLECTION]))

    async def take(topic: str, payload: bytes) -> Any:
        assert await fmt.prepare(topic, payload, LIMITS, lambda: False)
        return fmt.parse(topic, payload, LIMITS)

    for d in ("a", "b"):
        for topic, payload in car(d)[:7]:  # the Homie 4 car
            assert (await take(topic, payload.encode())).rejections == []
    assert list(fmt.format.devices) == ["b/car"]
    parsed = await take("a/car/engine/rpm", b"3000")
    assert [(i.sensor, i.fields) for i in parsed.items] == [("car", {"engine_rpm": 3000})]
    assert fmt._lookups == {"found": 1, "missing": 2}
    assert list(fmt.format.devices) == ["a/car"]
    assert fmt.format.properties_held == 3


async def test_the_store_keeps_what_the_attributes_say_and_serves_a_restart(db: Any) -> None:
    store = DeviceStore(db[COLLECTION])
    first = HomieState(store=store)

    async def take(fmt: HomieState, topic: str, payload: bytes) -> Any:
        assert await fmt.prepare(topic, payload, LIMITS, lambda: False)
        return fmt.parse(topic, payload, LIMITS)

    for topic, payload in car("h"):
        assert (await take(first, topic, payload.encode())).rejections == []
    doc = await db[COLLECTION].find_one({"_id": "h/car"})
    assert doc["properties"]["engine/temperature"] == {"datatype": "float", "unit": "°C"}
    # the same attribute again changes nothing, so nothing is written
    await take(first, "h/car/engine/temperature/$unit", "°C".encode())
    assert (await db[COLLECTION].find_one({"_id": "h/car"}))["updated_at"] == doc["updated_at"]
    await take(first, "h/car/engine/temperature/$unit", b"")  # cleared
    doc = await db[COLLECTION].find_one({"_id": "h/car"})
    assert doc["properties"]["engine/temperature"] == {"datatype": "float"}
    # a restarted daemon: nothing in memory, the device read back once
    second = HomieState(store=store)
    parsed = await take(second, "h/car/engine/rpm", b"3000")
    assert [i.fields for i in parsed.items] == [{"engine_rpm": 3000}]
    parsed = await take(second, "h/5/bulb/light/on", b"true")
    assert [i.fields for i in parsed.items] == [{"light_on": True}]
    assert second._lookups == {"found": 2, "missing": 0}
    # a device nobody described: read once, then not again for a while
    for _ in range(3):
        parsed = await take(second, "h/ghost/n/p", b"1")
        assert [r.reason for r in parsed.rejections] == ["no_datatype"]
    assert second._lookups == {"found": 2, "missing": 1}
    # a Homie 5 device removed (its $description cleared)
    await take(second, "h/5/bulb/$description", b"")
    assert await db[COLLECTION].count_documents({}) == 1

"""What ``ingest discover`` takes from the values and the topic tree, beyond the names:
units the names' table gives only with evidence (``batt`` a whole percentage, ``rssi``
negative, ``acc`` in a location fix), and commands told by their payloads and their
place (an HTTP API request, a switch word on a group topic beside the device trees)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from ingest.devices.decode import Limits
from ingest.devices.discover.chores import commands, housekeeping
from ingest.devices.discover.units import EVIDENCE, TABLE, units_of
from tests.devices.corpus import HOUSEKEEPING
from tests.devices.corpus.score import family_messages, mapping_of, score
from tests.support.discover import advised, discover, send, units
from tests.support.procs import eventually

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.support.procs import Broker, Daemon

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_list_the_names_table() -> None:
    """docs/onboarding.md's table is the one discover uses, with its sources."""
    docs = (ROOT / "docs" / "onboarding.md").read_text()
    rows = "\n".join(
        f"| {name} | {unit} | {EVIDENCE[check] if check else ''} | {source} |"
        for name, (unit, source, check) in TABLE.items()
    )
    assert "| name | unit | only when | source |\n|---|---|---|---|\n" + rows + "\n\n" in docs


def test_short_names_get_a_unit_only_where_the_values_give_it() -> None:
    # batt: a percentage only as whole numbers 0..100 (else millivolts or volts)
    assert units_of({"batt": [87, 86]}) == {"batt": "%"}
    assert units_of({"batt": [2950, 3010]}) == {}
    assert units_of({"batt": [3.7]}) == {}
    # rssi: dBm when negative (Tasmota's RSSI is a percentage)
    assert units_of({"rssi": [-74]}) == {"rssi": "dBm"}
    assert units_of({"Wifi_RSSI": [60, 62]}) == {}
    # acc: metres beside a latitude and a longitude; else it may be an acceleration
    assert units_of({"acc": [12], "lat": [52.5], "lon": [13.4]}) == {"acc": "m"}
    assert units_of({"acc": [0.98], "gyro": [3.1]}) == {}
    # a share in % needs every value from 0 to 100
    assert units_of({"air_util_tx": [0.32]}) == {"air_util_tx": "%"}
    assert units_of({"humidity": [150]}) == {}


def test_names_by_their_last_words_and_the_metric_system() -> None:
    got = units_of(
        {
            "inside_temp": [21.5],
            "odometer": [12345.67],
            "speed": [42],
            "wind_speed": [3.4],
            "cog": [270],
            "alt": [34],
            "UptimeSec": [3600],
        }
    )
    assert got == {
        "inside_temp": "°C",
        "odometer": "km",
        "speed": "km/h",
        "wind_speed": "m/s",
        "cog": "°",
        "alt": "m",
        "UptimeSec": "s",
    }
    # units that depend on the device, not on the user's unit system: none
    assert units_of({"chargedEnergy": [3500], "energy": [1.2], "uptime": [2125105]}) == {}


def test_commands_by_their_payloads_and_their_place() -> None:
    devices = {"wled/kitchen/g": [b"128"], "wled/porch/g": [b"255"]}
    found = commands(
        {
            **devices,
            "wled/kitchen/api": [b"FX=2&SX=200"],
            "wled/porch/api": [b"T=1"],
            "wled/all": [b"ON"],
        }
    )
    assert sorted(found) == ["wled/all", "wled/kitchen/api", "wled/porch/api"]
    # a name that extends a state's (col beside c), with its shape (a colour), for only
    # some of the devices that publish the state: the command that sets it
    colours = {"wled/kitchen/c": [b"#FFA000"], "wled/porch/c": [b"#0000FF"]}
    found = commands({**devices, **colours, "wled/porch/col": [b"#FF0000"]})
    assert list(found) == ["wled/porch/col"]
    # not where every device publishes both, nor a second channel (POWER1 beside
    # POWER), nor numbers (OpenDTU's power, powerdc)
    both = {"wled/kitchen/col": [b"#FFA000"], "wled/porch/col": [b"#0000FF"]}
    assert commands({**colours, **both}) == {}
    relays = {"s/a/POWER": [b"ON"], "s/a/POWER1": [b"ON"], "s/b/POWER": [b"OFF"]}
    assert commands(relays) == {}
    powers = {"solar/1/0/power": [b"123.4"], "solar/1/0/powerdc": [b"130.1"]}
    assert commands({**powers, "solar/2/0/power": [b"124.4"]}) == {}
    # a switch state on a device's own topic is a reading: not among device trees
    assert commands({"plug/kitchen/POWER": [b"ON"], "plug/porch/POWER": [b"OFF"]}) == {}
    # nor beside a level that is a topic itself (Shelly's relay/0 and relay/0/power)
    assert (
        commands(
            {
                "shellies/a/relay/0": [b"on"],
                "shellies/a/relay/0/power": [b"12.5"],
                "shellies/a/relay/1/power": [b"0"],
            }
        )
        == {}
    )
    # a number or a text beside device trees is no command
    assert commands({**devices, "wled/version": [b"0.15.0"], "wled/count": [b"2"]}) == {}
    assert commands({"a/b": [b"x=1 y=2"], "a/c": [b"21.5"]}) == {}


def test_wled_requests_and_group_commands_are_ignored() -> None:
    """The proposal for WLED ignores its API requests, its colour command and its group
    topic through the daemon's engine, and still stores the brightness and colour it
    publishes."""
    messages = family_messages("wled")
    mapping = mapping_of(score("wled").proposal)
    now = time.time()
    for msg in messages:
        result = mapping.decode(msg.topic, msg.payload, now, Limits())
        if msg.topic.endswith(("/api", "/col", "/all", "/status")):
            assert msg.truth == HOUSEKEEPING
            assert result.ignored, msg.topic
        elif msg.topic.endswith(("/g", "/c")):
            assert not result.ignored
            assert [r.sensor_id for r in result.decoded.readings] == [msg.topic.split("/")[1]]


def test_a_clock_time_beside_its_own_time_is_housekeeping() -> None:
    """Z-Wave JS UI's ``lastActive`` (``{"time": ms, "value": <ms>}``) is a last-seen
    time, not a reading; a value beside its time is a reading."""
    now = time.time()
    ms = int(now * 1000)
    seen = [orjson.dumps({"time": ms, "value": ms - 5000})]
    assert housekeeping("zwave/Garage/Plug/lastActive", "json", seen, set(), now)
    reading = [orjson.dumps({"time": ms, "value": 21.3})]
    assert not housekeeping(
        "zwave/Garage/Plug/sensor_multilevel/Power", "json", reading, set(), now
    )
    other = [orjson.dumps({"time": ms, "value": ms, "nodeId": 3})]  # more than one value
    assert not housekeeping("zwave/Garage/Plug/x", "json", other, set(), now)


async def test_every_payload_unit_is_stored_also_for_properties_discover_never_saw(
    persistent: Broker, daemon: Callable[..., Daemon], mode: str, db: Any, tmp_path: Path
) -> None:
    """Meters that publish one value per topic with its unit: discover proposes
    ``"*" = "{unit}"``, and the daemon, run as it advises, stores each value with its
    payload's unit, for a property the capture never showed as for the others."""
    seen = [
        (f"lab/meter-{n}/{prop}", orjson.dumps({"value": v, "unit": u}))
        for n in (1, 2)
        for prop, v, u in (("voltage", 3.3, "V"), ("temperature", 71.5, "°F"))
    ]
    text, report = await discover(persistent, [], seen)
    assert '"*" = "{unit}"' in text
    assert '"temperature" = "°C"' not in text  # the payload's °F, not the names' table
    mapping = tmp_path / "proposal.toml"
    mapping.write_text(text)
    proc = daemon(*advised(report, mapping), broker_url=persistent.url, rule_topics=True)
    later = [("lab/meter-1/current", orjson.dumps({"value": 0.5, "unit": "A"}))]
    await send(persistent, seen + later)
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == len(seen) + 1)
    expected = {
        "meter-1": {"voltage": "V", "temperature": "°F", "current": "A"},
        "meter-2": {"voltage": "V", "temperature": "°F"},
    }

    async def stored() -> bool:
        return await units(db, mode) == expected

    await eventually(stored)
    assert proc.stop() == 0

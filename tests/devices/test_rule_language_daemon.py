"""The rule language's one-value and payload-selection rules end to end, both modes.

Victron Venus OS (``N/<portal>/<service>/<instance>/<path>`` with ``{"value": ...}``),
OwnTracks (``_type`` location and lwt on one topic) and Meshtastic JSON (``type``
telemetry, nodeinfo, text and another on one topic), published to a real broker, read
by the real daemon subscribed to its rules' filters, stored in MongoDB over the wire.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson

from tests.support.mongo import COLLECTION
from tests.support.procs import eventually

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.support.procs import Daemon

HOUR = (time.time() - 7200) // 3600 * 3600  # a whole hour, two hours ago
MS = int(HOUR * 1000)
MAPPING = """
[[rule]]
name = "victron-mirrors"
topic = "{root}/R/#"
ignore = true

[[rule]]
name = "victron"
topic = "{root}/N/c0619ab1a2b3/{{service}}/{{instance}}/{{property#}}"
sensor_id = "{{service}}-{{instance}}"
measurement = "{{property}}"
[rule.time]
field = "time"
[rule.units]
Dc_0_Voltage = "V"
Dc_0_Current = "{{unit}}"

[[rule]]
name = "victron-renamed"
topic = "{root}/N/d41d8cd98f00/{{service}}/{{instance}}/{{property#}}"
sensor_id = "{{service}}-{{instance}}-b"
drop = ["min", "max"]
[rule.rename]
value = "{{property}}"
[rule.time]
field = "time"

[[rule]]
name = "owntracks-lwt"
topic = "{root}/owntracks/{{user}}/{{device}}"
ignore = true
[rule.match]
"_type" = "lwt"

[[rule]]
name = "owntracks"
topic = "{root}/owntracks/{{user}}/{{device}}"
sensor_id = "{{user}}-{{device}}"
keep = ["lat", "lon", "acc", "batt"]
[rule.time]
field = "tst"
[rule.units]
acc = "m"
batt = "%"
[rule.match]
"_type" = "location"

[[rule]]
name = "mesh-chores"
topic = "{root}/msh/{{region}}/2/json/{{channel}}/{{gateway}}"
ignore = true
[rule.match]
type = ["nodeinfo", "text"]

[[rule]]
name = "mesh"
topic = "{root}/msh/{{region}}/2/json/{{channel}}/{{gateway}}"
sensor_id = "{{from}}"
root = "payload"
info = ["gateway", "region", "channel"]
[rule.time]
field = "timestamp"
[rule.match]
type = ["position", "telemetry"]
"""


def packet(kind: str, seconds: int, payload: dict[str, object]) -> bytes:
    """A Meshtastic JSON packet as a gateway node uplinks it (MQTT.cpp meshPacketToJson)."""
    return orjson.dumps(
        {
            "channel": 0,
            "from": 2130636288,
            "id": 1781265290 + seconds,
            "payload": payload,
            "rssi": -98,
            "sender": "!a1b2c3d4",
            "snr": 6.25,
            "timestamp": int(HOUR) + seconds,
            "to": 4294967295,
            "type": kind,
        }
    )


async def test_one_value_topics_and_shared_topics_are_stored_by_their_rules(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any, tmp_path: Path
) -> None:
    mapping = tmp_path / "mapping.toml"
    mapping.write_text(MAPPING.format(root=topic_root))
    proc = daemon("--mapping", str(mapping), rule_topics=True)
    victron, other = f"{topic_root}/N/c0619ab1a2b3", f"{topic_root}/N/d41d8cd98f00"
    phone = f"{topic_root}/owntracks/jane/phone"
    mesh = f"{topic_root}/msh/EU_868/2/json/LongFast/!a1b2c3d4"
    messages: list[tuple[str, bytes]] = [
        (f"{topic_root}/R/c0619ab1a2b3/keepalive", b""),
        (f"{victron}/battery/512/Dc/0/Voltage", b'{"time": %d, "value": 53.12}' % (MS + 1000)),
        (
            f"{victron}/battery/512/Dc/0/Current",
            b'{"time": %d, "value": -4.2, "unit": "A"}' % (MS + 1000),
        ),
        (f"{victron}/battery/512/Soc", b'{"time": %d, "value": 87.5}' % (MS + 2000)),
        (f"{victron}/pvinverter/20/Ac/L2/Power", b'{"value": null}'),
        (
            f"{other}/settings/0/Settings/CGwacs/AcPowerSetPoint",
            b'{"max": 1000000, "min": -1000000, "value": 50, "time": %d}' % (MS + 3000),
        ),
        (phone, orjson.dumps({"_type": "lwt", "tst": int(HOUR)})),
        (
            phone,
            orjson.dumps(
                {
                    "_type": "location",
                    "tid": "jp",
                    "tst": int(HOUR) + 60,
                    "lat": 52.5163,
                    "lon": 13.3777,
                    "acc": 12,
                    "batt": 87,
                    "conn": "w",
                }
            ),
        ),
        (mesh, packet("telemetry", 120, {"voltage": 4.05, "battery_level": 87})),
        (mesh, packet("nodeinfo", 121, {"id": "!7eff0000", "longname": "Node 0"})),
        (mesh, packet("text", 122, {"text": "hello mesh"})),
        (mesh, packet("traceroute", 123, {"route": [1, 2]})),
    ]
    await publish(messages)
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == len(messages))
    await eventually(lambda: proc.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == 6)
    metric = proc.metric
    assert metric('ingest_messages_ignored_total{rule="victron-mirrors"}') == 1
    assert metric('ingest_messages_ignored_total{rule="owntracks-lwt"}') == 1
    assert metric('ingest_messages_ignored_total{rule="mesh-chores"}') == 2
    assert metric('ingest_messages_ignored_total{rule="(outside the rules)"}') == 0
    assert metric('ingest_rule_messages_total{outcome="accepted",rule="victron"}') == 3
    assert metric('ingest_rule_messages_total{outcome="rejected",rule="victron"}') == 1
    assert metric('ingest_rule_messages_total{outcome="accepted",rule="mesh"}') == 1
    await eventually(lambda: _rejects(db, 2))
    rejects = await db["rejects"].find({}, {"reason": 1, "detail": 1, "topic": 1}).to_list()
    assert sorted((r["reason"], r["topic"]) for r in rejects) == [
        ("no_measurements", f"{victron}/pvinverter/20/Ac/L2/Power"),
        ("no_rule", mesh),
    ]
    (unselected,) = [r for r in rejects if r["reason"] == "no_rule"]
    assert "the payload matched no [rule.match] (rules mesh-chores, mesh)" in unselected["detail"]
    stored = await _stored(db[COLLECTION[mode]], mode)
    battery_units = {"Dc_0_Voltage": "V", "Dc_0_Current": "A"}  # the bucket's, or the reading's
    assert stored == {
        # two topics of one device at one instant: one reading
        ("battery-512", MS + 1000): ({"Dc_0_Voltage": 53.12, "Dc_0_Current": -4.2}, battery_units),
        ("battery-512", MS + 2000): ({"Soc": 87.5}, battery_units if mode == "bucket" else {}),
        ("settings-0-b", MS + 3000): ({"Settings_CGwacs_AcPowerSetPoint": 50}, {}),
        ("jane-phone", MS + 60_000): (
            {"lat": 52.5163, "lon": 13.3777, "acc": 12, "batt": 87},
            {"acc": "m", "batt": "%"},
        ),
        ("2130636288", MS + 120_000): ({"voltage": 4.05, "battery_level": 87}, {}),
    }
    assert proc.stop() == 0


async def _rejects(db: Any, count: int) -> bool:
    return bool(await db["rejects"].count_documents({}) >= count)


async def _stored(coll: Any, mode: str) -> dict[tuple[str, int], tuple[dict[str, Any], Any]]:
    """(sensor, ms) -> (values, units), whatever the layout."""
    out: dict[tuple[str, int], tuple[dict[str, Any], Any]] = {}
    skip = {"ts", "_id", "meta", "units", "info"}
    async for doc in coll.find({}):
        if mode == "bucket":
            for reading in doc["readings"]:
                ms = round(reading["ts"].timestamp() * 1000)
                values = {k: v for k, v in reading.items() if k not in skip}
                out[(doc["sensor_id"], ms)] = (values, doc.get("units", {}))
        else:
            ms = round(doc["ts"].timestamp() * 1000)
            values = {k: v for k, v in doc.items() if k not in skip}
            out[(doc["meta"]["sensor_id"], ms)] = (values, doc.get("units", {}))
    return out

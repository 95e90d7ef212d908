"""Mapping rules end to end: a real broker, the real daemon process, MongoDB over the wire.

Zigbee2MQTT-shaped JSON (booleans, a string, nested objects), SenML with units, an
ignored housekeeping topic and a topic no rule takes, in both storage modes.
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
MAPPING = """
[[rule]]
name = "bridge"
topic = "{root}/z2m/bridge/#"
ignore = true

[[rule]]
name = "z2m"
topic = "{root}/z2m/{{sensor_id}}"
format = "json"
drop = ["last_seen"]
[rule.time]
field = "time"
format = "epoch_ms"
[rule.tags]
site = "home"

[[rule]]
name = "senml"
topic = "{root}/senml/#"
format = "senml"
"""


def z2m(
    seconds: int, battery: int, *, low: bool, temperature: float, state: str, inner: float
) -> bytes:
    return orjson.dumps(
        {
            "time": int((HOUR + seconds) * 1000) + 500,
            "battery": battery,
            "battery_low": low,
            "occupancy": True,
            "temperature": temperature,
            "linkquality": 134,
            "update": {"state": state},
            "AM2301": {"Humidity": inner},
            "last_seen": "now",
        }
    )


async def test_mapped_messages_are_stored_with_their_kinds_tags_units_and_exact_stats(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any, tmp_path: Path
) -> None:
    mapping = tmp_path / "mapping.toml"
    mapping.write_text(MAPPING.format(root=topic_root))
    proc = daemon("--mapping", str(mapping))
    senml = [
        {
            "bn": "urn:dev:mac:0024befffe804ff1:",
            "bt": HOUR + 30,
            "n": "temp",
            "u": "Cel",
            "v": 22.5,
        },
        {"n": "door", "vb": True},
    ]
    await publish(
        [
            (
                f"{topic_root}/z2m/Living Room",
                z2m(10, 100, low=False, temperature=21.7, state="idle", inner=40.5),
            ),
            (
                f"{topic_root}/z2m/Living Room",
                z2m(20, 99, low=True, temperature=22.1, state="updating", inner=41.5),
            ),
            (f"{topic_root}/z2m/bridge/state", b"online"),
            (f"{topic_root}/senml/gw", orjson.dumps(senml)),
            (f"{topic_root}/nobody/x", b"1"),
        ]
    )
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 5)
    assert proc.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == 3
    assert proc.metric('ingest_messages_ignored_total{rule="bridge"}') == 1
    assert proc.metric('ingest_rule_messages_total{outcome="accepted",rule="z2m"}') == 2
    assert proc.metric('ingest_rule_messages_total{outcome="accepted",rule="senml"}') == 1
    # Every rule's series exists from the start, at 0.
    assert 'ingest_rule_messages_total{outcome="rejected",rule="z2m"}' in proc.metrics()
    assert proc.metric('ingest_readings_rejected_total{reason="no_rule"}') == 1
    await eventually(lambda: _rejects(db))
    (reject,) = await db["rejects"].find({}).to_list()
    assert (reject["reason"], reject["topic"]) == ("no_rule", f"{topic_root}/nobody/x")
    coll = db[COLLECTION[mode]]
    if mode == "bucket":
        await _check_buckets(coll)
    else:
        await _check_timeseries(coll)
    assert proc.stop() == 0


async def _rejects(db: Any) -> bool:
    return bool(await db["rejects"].count_documents({}))


async def _check_buckets(coll: Any) -> None:
    doc = await coll.find_one({"sensor_id": "Living Room"})
    assert doc["count"] == 2
    assert doc["tags"] == {"site": "home"}
    stats = doc["stats"]
    assert stats["battery_low"] == {"count": 2, "sum": 1, "min": 0, "max": 1}
    assert stats["occupancy"] == {"count": 2, "sum": 2, "min": 1, "max": 1}
    assert stats["battery"] == {"count": 2, "sum": 199, "min": 99, "max": 100}
    assert stats["AM2301_Humidity"] == {"count": 2, "sum": 82.0, "min": 40.5, "max": 41.5}
    assert abs(stats["temperature"]["sum"] - 43.8) < 1e-9
    assert "update_state" not in stats
    assert "last_seen" not in stats
    first, second = doc["readings"]
    assert (first["battery_low"], second["battery_low"]) == (False, True)
    assert type(first["battery_low"]) is bool
    assert (first["update_state"], second["update_state"]) == ("idle", "updating")
    assert first["ts"].timestamp() == HOUR + 10.5
    senml = await coll.find_one({"sensor_id": "urn:dev:mac:0024befffe804ff1"})
    assert senml["units"] == {"temp": "Cel"}
    assert senml["stats"]["door"] == {"count": 1, "sum": 1, "min": 1, "max": 1}
    assert senml["readings"][0]["door"] is True
    # Queries by tag and by unit, as docs/mapping.md shows them.
    assert await coll.count_documents({"tags.site": "home"}) == 1
    assert await coll.count_documents({"units.temp": "Cel"}) == 1


async def _check_timeseries(coll: Any) -> None:
    docs = await coll.find({"meta.sensor_id": "Living Room"}).sort("ts", 1).to_list()
    assert [d["meta"] for d in docs] == [{"sensor_id": "Living Room", "site": "home"}] * 2
    assert [d["battery_low"] for d in docs] == [False, True]
    assert all(type(d["battery_low"]) is bool for d in docs)
    assert [d["update_state"] for d in docs] == ["idle", "updating"]
    assert [d["AM2301_Humidity"] for d in docs] == [40.5, 41.5]
    assert "last_seen" not in docs[0]
    assert docs[0]["ts"].timestamp() == HOUR + 10.5
    (senml,) = await coll.find({"meta.sensor_id": "urn:dev:mac:0024befffe804ff1"}).to_list()
    assert senml["units"] == {"temp": "Cel"}
    assert (senml["temp"], senml["door"]) == (22.5, True)
    assert await coll.count_documents({"meta.site": "home"}) == 2


BOUNDS = """
[[rule]]
name = "json"
topic = "{root}/json/{{sensor_id}}"
format = "json"

[[rule]]
name = "value"
topic = "{root}/value/{{sensor_id}}/{{measurement}}"
format = "value"
measurement = "{{measurement}}"

[[rule]]
name = "senml"
topic = "{root}/senml/#"
format = "senml"
"""


async def test_values_beyond_the_bound_are_refused_on_every_path_and_sums_stay_finite(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any, tmp_path: Path
) -> None:
    """±1e300 bounds every format (two 1.7e308 would make a bucket's stats sum Infinity),
    the mapping formats and Sparkplug doubles as the default format."""
    from loadgen import sparkplug as enc  # noqa: PLC0415 - only this test publishes Sparkplug
    from loadgen.sparkplug import Metric  # noqa: PLC0415

    mapping = tmp_path / "bounds.toml"
    mapping.write_text(BOUNDS.format(root=topic_root))
    proc = daemon(
        "--mapping", str(mapping), "--preset", "sparkplug", "--topic", f"spBv1.0/{topic_root}/#"
    )
    t0 = int(HOUR * 1000)
    huge = 1.7e308
    await publish(
        [
            *[(f"{topic_root}/json/j", orjson.dumps({"v": huge, "ok": i})) for i in range(2)],
            *[(f"{topic_root}/value/w/v", repr(huge).encode()) for _ in range(2)],
            (f"{topic_root}/value/w/v", b"1" + b"0" * 400),  # an integer no double holds
            (f"{topic_root}/value/w/ok", b"3"),
            (
                f"{topic_root}/senml/s",
                orjson.dumps(
                    [
                        {"bn": "s:", "bt": HOUR, "bv": huge, "n": "v", "v": huge},
                        {"n": "ok", "v": 1, "bv": 0},
                    ]
                ),
            ),
            (
                enc.topic(topic_root, "NBIRTH", "E"),
                enc.nbirth(
                    [Metric("v", 1, t0, enc.DOUBLE, huge), Metric("ok", 2, t0, enc.INT32, 1)],
                    bd_seq=0,
                    timestamp=t0,
                ),
            ),
            (
                enc.topic(topic_root, "NDATA", "E"),
                enc.payload(
                    [
                        Metric(alias=1, timestamp=t0 + 1, datatype=enc.DOUBLE, value=huge),
                        Metric(alias=2, timestamp=t0 + 1, datatype=enc.INT32, value=2),
                    ],
                    t0 + 1,
                    1,
                ),
            ),
        ]
    )
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 9)
    rejects = await db["rejects"].find({}, {"reason": 1, "detail": 1}).to_list()
    assert sorted((r["reason"], r["detail"]) for r in rejects) == sorted(
        [("bad_value", "v: not a finite number within ±1e300")] * 8
        + [("no_measurements", "no measurement left to store")] * 3
    ), rejects
    coll = db[COLLECTION[mode]]
    if mode == "bucket":
        docs = await coll.find({}).to_list()
        assert {d["sensor_id"]: d["count"] for d in docs} == {
            "j": 2,
            "w": 1,
            "s": 1,
            f"{topic_root}/E": 2,
        }
        sums = [s["sum"] for d in docs for s in d["stats"].values()]
        assert all(abs(s) < 1e300 for s in sums), sums
    else:
        assert await coll.count_documents({}) == 6
        assert await coll.count_documents({"v": {"$exists": True}}) == 0
    assert proc.stop() == 0


GATEWAY = """
[[rule]]
name = "gateway"
topic = "{root}/gw/{{gw}}"
each = "devices"
sensor_id = ["{{model}}-{{id}}", "{{model}}"]
info = ["gw"]
[rule.rename]
seq = "dev_seq"
[rule.units]
temperature_C = "°C"
[rule.time]
field = "time"
format = "epoch_s"
"""


async def test_one_gateway_message_stores_each_device_under_its_own_id_with_units(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any, tmp_path: Path
) -> None:
    """Identity, time, units and names from the payload (docs/mapping.md), both layouts."""
    mapping = tmp_path / "mapping.toml"
    mapping.write_text(GATEWAY.format(root=topic_root))
    proc = daemon("--mapping", str(mapping))
    await publish(
        [
            (
                f"{topic_root}/gw/attic",
                orjson.dumps(
                    {
                        "time": HOUR + 60,
                        "devices": [
                            {"model": "Nexus-TH", "id": 7, "temperature_C": 20.5, "seq": 1},
                            {
                                "model": "Nexus-TH",
                                "id": 8,
                                "temperature_C": 19.0,
                                "time": HOUR + 61,
                            },
                            {"id": 9, "temperature_C": 18.0},
                        ],
                    }
                ),
            )
        ]
    )
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 1)
    assert proc.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == 2
    assert proc.metric('ingest_readings_rejected_total{reason="no_sensor_id"}') == 1
    coll = db[COLLECTION[mode]]
    key = "sensor_id" if mode == "bucket" else "meta.sensor_id"
    found = {}
    for sensor in ("Nexus-TH-7", "Nexus-TH-8"):
        doc = await coll.find_one({key: sensor})
        reading = doc["readings"][0] if mode == "bucket" else doc
        assert doc["units"] == {"temperature_C": "°C"}
        assert doc["info"] == {"gw": "attic"}
        found[sensor] = {
            k: v for k, v in reading.items() if k in {"temperature_C", "dev_seq", "id", "model"}
        }
        found[sensor]["ts"] = reading["ts"].timestamp()
    assert found == {
        "Nexus-TH-7": {"temperature_C": 20.5, "dev_seq": 1, "ts": HOUR + 60},
        "Nexus-TH-8": {"temperature_C": 19.0, "ts": HOUR + 61},
    }
    assert proc.stop() == 0

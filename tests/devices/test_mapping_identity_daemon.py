"""What tells series and measurements apart is never lost on the way to the store: a real
broker, the real daemon process, MongoDB over the wire, in both modes.

- A line protocol tag named ``sensor_id`` (Telegraf's 1-Wire probes) is kept as the tag
  ``_sensor_id``, so two probes of one gateway are two series; a tag name too long, or
  two tags of one name once made safe, refuse their line (``bad_tag_name``).
- Two Homie properties whose ``<node>_<property>`` names would meet are stored apart.
- A preset's numeric measurement is never stored as text (``bad_value``).
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from tests.devices.test_homie_daemon import start as homie_start
from tests.devices.test_presets import prefixed, stored_rows
from tests.support.procs import eventually

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.support.procs import Daemon

SECOND = int(time.time()) // 60 * 60 - 3600  # a whole minute, an hour ago
TELEGRAF = """
[[rule]]
name = "telegraf"
topic = "{root}/telegraf/{{sensor_id}}/+"
format = "influx"
"""


def rows_by_series(
    rows: list[dict[str, Any]],
) -> dict[tuple[str, tuple[tuple[str, str], ...]], list[dict[str, Any]]]:
    """Stored values by (sensor id, tags), in time order."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: r["ts"]):
        key = (row["sensor_id"], tuple(sorted((row["tags"] or {}).items())))
        out.setdefault(key, []).append(row["values"])
    return out


async def rejects(db: Any) -> list[tuple[str, str, str]]:
    """(reason, topic, detail) of every stored rejection, sorted."""
    found = await db["rejects"].find({}, {"reason": 1, "topic": 1, "detail": 1}).to_list()
    return sorted((r["reason"], r["topic"], r["detail"]) for r in found)


async def test_two_probes_named_by_a_sensor_id_tag_are_two_series_and_bad_tag_names_counted(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any, tmp_path: Path
) -> None:
    mapping = tmp_path / "telegraf.toml"
    mapping.write_text(TELEGRAF.format(root=topic_root))
    proc = daemon("--mapping", str(mapping))
    topic = f"{topic_root}/telegraf/gw1/temperature"
    long_key = "k" * 65

    def line(tags: str, value: float, seconds: int) -> bytes:
        return f"temperature,host=gw1,{tags} value={value} {(SECOND + seconds) * 10**9}".encode()

    await publish(
        [
            (topic, line("sensor_id=28-0001", 21.5, 0)),
            (topic, line("sensor_id=28-0002", 19.0, 0)),  # the same instant, another probe
            (topic, line("sensor_id=28-0001", 21.75, 10)),
            (topic, line("sensor_id=28-0002", 19.25, 10)),
            (topic, line("probe.id=1,probe_id=2", 5.0, 20)),  # one name once made safe
            (topic, line(f"{long_key}=x", 6.0, 20)),  # no tag name of 64 characters or fewer
        ]
    )
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 6)
    await eventually(lambda: proc.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == 4)
    assert proc.metric('ingest_readings_rejected_total{reason="bad_tag_name"}') == 2
    assert proc.metric('ingest_readings_rejected_total{reason="ts_conflict"}') == 0
    assert rows_by_series(await stored_rows(db, mode)) == {
        ("gw1", (("_sensor_id", "28-0001"),)): [{"temperature": 21.5}, {"temperature": 21.75}],
        ("gw1", (("_sensor_id", "28-0002"),)): [{"temperature": 19.0}, {"temperature": 19.25}],
    }
    await eventually(lambda: _count(db, 2))
    assert await rejects(db) == [
        (
            "bad_tag_name",
            topic,
            (f"tag {'k' * 60!r}: not a tag name once made safe ([A-Za-z0-9_-]{{1,64}})"),
        ),
        (
            "bad_tag_name",
            topic,
            ("tags 'probe.id' and 'probe_id': one name once made safe (probe_id)"),
        ),
    ]
    assert proc.stop() == 0


async def _count(db: Any, n: int) -> bool:
    return int(await db["rejects"].count_documents({})) == n


async def test_two_homie_properties_whose_joined_ids_meet_are_stored_apart(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any, tmp_path: Path
) -> None:
    """Node ``a_b``/property ``c`` (°C) and node ``a``/property ``b_c`` (%) of one device
    are two measurements with their own units; an id starting with ``_`` is refused."""
    d = topic_root
    await publish(
        [
            (f"{d}/dev/a_b/c/$datatype", "float"),
            (f"{d}/dev/a_b/c/$unit", "°C"),
            (f"{d}/dev/a/b_c/$datatype", "integer"),
            (f"{d}/dev/a/b_c/$unit", "%"),
        ],
        retain=True,
    )
    proc = homie_start(daemon, tmp_path, d)
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 4)
    await publish([(f"{d}/dev/a_b/c", "21.5"), (f"{d}/dev/a/b_c", "40"), (f"{d}/dev/_a/b", "1")])
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 7)
    await eventually(lambda: proc.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == 2)
    assert proc.metric('ingest_readings_rejected_total{reason="bad_topic"}') == 1
    rows = await stored_rows(db, mode)
    assert sorted(((r["sensor_id"], r["values"]) for r in rows), key=str) == [
        ("dev", {"a__b_c": 21.5}),
        ("dev", {"a_b__c": 40}),
    ]
    if mode == "timeseries":  # each reading its unit
        assert sorted(str(r["units"]) for r in rows) == ["{'a__b_c': '°C'}", "{'a_b__c': '%'}"]
    else:  # one document: the units of both measurements
        assert rows[0]["doc"]["units"] == {"a__b_c": "°C", "a_b__c": "%"}
    assert await rejects(db) == [
        ("bad_topic", f"{d}/dev/_a/b", f"not a Homie 4 or 5 topic: '{d}/dev/_a/b'")
    ]
    assert proc.stop() == 0


async def test_a_presets_numeric_measurement_is_never_stored_as_text(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any, tmp_path: Path
) -> None:
    """Zigbee2MQTT ``{"temperature": "warm"}`` and a Shelly Gen1 ``relay/0/power`` of
    ``NaN`` are refused as ``bad_value`` (the reading's other values stored); Zigbee2MQTT's
    booleans and Shelly's on/off stay booleans; every stored value keeps its kind."""
    z2m, shelly = (prefixed(p, topic_root, tmp_path) for p in ("zigbee2mqtt", "shelly"))
    mapping = tmp_path / "both.toml"
    # One file of both presets' rules: the second's [page] table (the read API's chart
    # order, which a file holds once) left out.
    second = re.sub(r"^\[page\]\n(?:(?!\[).*\n)*", "", shelly.read_text(), flags=re.MULTILINE)
    mapping.write_text(z2m.read_text() + "\n" + second)
    proc = daemon("--mapping", str(mapping))
    hall = f"{topic_root}/zigbee2mqtt/Hall"
    plug = f"{topic_root}/shellies/shelly1pm-84CCA8ADE5E2"
    await publish(
        [
            (hall, '{"temperature": "warm", "occupancy": true, "action": "single"}'),
            (hall, '{"temperature": 21.5, "occupancy": false}'),
            (hall, '{"occupancy": "yes"}'),
            (f"{plug}/relay/0/power", "NaN"),
            (f"{plug}/relay/0/power", "22.5"),
            (f"{plug}/relay/0", "on"),
        ]
    )
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 6)
    await eventually(lambda: proc.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == 4)
    assert proc.metric('ingest_readings_rejected_total{reason="bad_value"}') == 3
    assert proc.metric('ingest_readings_rejected_total{reason="no_measurements"}') == 2
    rows = await stored_rows(db, mode)
    kinds: dict[str, set[str]] = {}
    for row in rows:
        for name, value in row["values"].items():
            kinds.setdefault(name, set()).add(type(value).__name__)
    assert kinds == {
        "temperature": {"float"},
        "occupancy": {"bool"},
        "action": {"str"},
        "relay_0_power": {"float"},
        "relay_0": {"bool"},
    }
    await eventually(lambda: _count(db, 5))
    assert [r for r in await rejects(db) if r[0] == "bad_value"] == sorted(
        [
            ("bad_value", hall, "temperature: 'warm' is not a number ([rule.types])"),
            ("bad_value", hall, "occupancy: 'yes' is not a boolean ([rule.types])"),
            (
                "bad_value",
                f"{plug}/relay/0/power",
                "relay_0_power: 'NaN' is not a number ([rule.types])",
            ),
        ]
    )
    assert proc.stop() == 0

"""``ingest discover``: a mixed fleet on a real broker, retained and live; the proposal must
load as a mapping file and, with the presets it names, store every data message; followed
to the letter, it leaves every preset's topics to the preset and counts what each rule
takes as the daemon then does."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import orjson
import pytest

from ingest.devices.decode import Limits
from ingest.devices.discover.patterns import Captured, payload_kind
from ingest.devices.mapping import Mapping
from ingest.devices.rules import load_preset, parse
from tests.support.devices import base_time, load
from tests.support.discover import advised, daemon_table, discover, report_table, send
from tests.support.mongo import stored
from tests.support.procs import ROOT, eventually

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.support.procs import Broker, Daemon

NOW = time.time()
BINARY = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01"


def fleet() -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]]]:
    """(retained, live) messages of a mixed fleet."""

    def js(doc: Any) -> bytes:
        return orjson.dumps(doc)

    retained = [
        ("zigbee2mqtt/bridge/state", b"online"),
        ("zigbee2mqtt/Living Room", js({"temperature": 21.5, "occupancy": True})),
        ("tele/tasmota_1A2B3C/LWT", b"Online"),
        *((f"factory/line1/press-{n}/status", b"online") for n in (7, 8, 9)),
    ]
    live = [
        ("zigbee2mqtt/hall", js({"temperature": 20.5, "linkquality": 100})),
        (
            "tele/tasmota_1A2B3C/SENSOR",
            js({"Time": "2026-11-21T09:00:00", "AM2301": {"Temperature": 22.5}, "TempUnit": "C"}),
        ),
        *(
            (
                f"factory/line1/press-{n}/telemetry",
                js(
                    {
                        "ts": int(NOW * 1000) - n,
                        "spindle": {"rpm": 1200 + n, "temp": 40.5},
                        "mode": "auto",
                        "alarms": [],
                    }
                ),
            )
            for n in (7, 8, 9)
        ),
        *(
            (f"plant/boiler-{n}/{q}", f"{70 + n}.5".encode())
            for n in (1, 2)
            for q in ("temperature", "pressure")
        ),
        ("plant/boiler-1/pump", b"ON"),
        ("plant/boiler-2/pump", b"OFF"),
        ("sensors/s1/readings", js({"ts": NOW - 5, "temp": 20.1})),
        ("sensors/s2/readings", js({"ts": NOW - 5, "temp": 20.2, "hum": 41})),
        (
            "lab/gw1/senml",
            js(
                [
                    {
                        "bn": "urn:dev:mac:0024befffe804ff1:",
                        "bt": NOW,
                        "n": "temp",
                        "u": "Cel",
                        "v": 22.5,
                    },
                    {"n": "hum", "u": "%RH", "v": 40},
                ]
            ),
        ),
        # Telegraf's outputs.mqtt (taken by --preset influx), and line protocol on topics
        # of another publisher (proposed).
        ("telegraf/host1/cpu", f"cpu,host=host1 usage=0.5 {int(NOW * 1e9)}".encode()),
        ("telegraf/host2/cpu", f"cpu,host=host2 usage=0.7 {int(NOW * 1e9)}".encode()),
        ("meters/m1", f"power,phase=1 watts=230.5 {int(NOW * 1e9)}".encode()),
        ("meters/m2", f"power,phase=1 watts=115.0 {int(NOW * 1e9)}".encode()),
        ("cams/door/snapshot", BINARY),
    ]
    return retained, live


def test_payload_kinds_are_recognised() -> None:
    retained, live = fleet()
    kinds = {topic: payload_kind(topic, payload) for topic, payload in retained + live}
    assert kinds["factory/line1/press-7/telemetry"] == "json"
    assert kinds["plant/boiler-1/temperature"] == "value"
    assert kinds["sensors/s1/readings"] == "ingest"
    assert kinds["lab/gw1/senml"] == "senml"
    assert kinds["telegraf/host1/cpu"] == "influx"
    assert kinds["cams/door/snapshot"] == "binary"


def check_proposal(text: str, presets: list[str], messages: list[tuple[str, bytes]]) -> None:
    """The proposal loads; with the presets it stores every message but the binary one."""
    rules = parse(text, "proposal")
    for name in presets:
        rules.extend(load_preset(name))
    mapping = Mapping(rules)
    outcomes: dict[str, str | int] = {}
    for topic, payload in messages:
        result = mapping.decode(topic, payload, time.time(), Limits())
        assert result.rule is not None, f"{topic}: no rule"
        assert not result.decoded.rejections, (topic, result.decoded.rejections)
        outcomes[topic] = "ignored" if result.ignored else len(result.decoded.readings)
    assert outcomes["cams/door/snapshot"] == "ignored"
    assert outcomes["factory/line1/press-7/status"] == "ignored"
    assert outcomes["zigbee2mqtt/bridge/state"] == "ignored"
    stored = [n for n in outcomes.values() if n != "ignored"]
    assert all(isinstance(n, int) and n >= 1 for n in stored)
    assert outcomes["lab/gw1/senml"] == 1  # temp and hum: one reading of two values


def test_a_proposal_from_a_capture_stores_the_fleet() -> None:
    from ingest.devices.discover.command import finish  # noqa: PLC0415

    retained, live = fleet()
    captured = [Captured(t, p, retained=True) for t, p in retained]
    captured += [Captured(t, p) for t, p in live]
    out, err = io.StringIO(), io.StringIO()
    assert finish(captured, [], [], out, err) == 0
    text = out.getvalue()
    assert "use --preset influx" in text
    assert "use --preset tasmota" in text
    assert "use --preset zigbee2mqtt" in text
    assert 'topic = "plant/{sensor_id}/{measurement}"' in text
    assert 'topic = "meters/{sensor_id}"\nformat = "influx"' in text
    assert 'field = "ts"' in text  # epoch milliseconds found and used
    check_proposal(text, ["influx", "tasmota", "zigbee2mqtt"], retained + live)
    report = err.getvalue()
    assert "accepted" in report
    assert "--preset influx --preset tasmota --preset zigbee2mqtt" in report


async def test_discover_listens_to_a_broker_and_proposes_a_working_mapping(
    persistent: Broker,
) -> None:
    retained, live = fleet()
    text, report = await discover(persistent, retained, live)
    assert f"captured {len(retained) + len(live)} message(s)" in report
    assert f"({len(retained)} retained)" in report
    check_proposal(text, ["influx", "tasmota", "zigbee2mqtt"], retained + live)
    assert "--preset influx --preset tasmota --preset zigbee2mqtt --mapping <this file>" in report


@pytest.mark.process
def test_discover_with_no_broker_is_one_line() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ingest",
            "discover",
            "--mqtt-url",
            "mqtt://127.0.0.1:1",
            "--seconds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert out.returncode == 1
    assert out.stderr.strip().startswith("ingest: error: broker 127.0.0.1:1:")
    assert len(out.stderr.strip().splitlines()) == 1


def test_plain_values_name_their_measurement_from_the_topic() -> None:
    """Two Gen1-Shelly-like devices under a base topic no preset knows."""
    from ingest.devices.discover.propose import propose  # noqa: PLC0415

    messages = [
        Captured(f"home/{device}/{tail}", payload.encode())
        for device in ("sh1-AAA1", "sh1-AAA2")
        for tail, payload in (
            ("relay/0", "on"),
            ("relay/0/power", "22.5"),
            ("relay/1/power", "0"),
            ("temperature", "41.2"),
        )
    ]
    found = {"/".join(p.levels): p.measurement for p in propose(messages)}
    assert found == {
        "home/{sensor_id}/relay/{level4}/power": "relay_{level4}_power",
        "home/{sensor_id}/relay/0": "relay_0",
        "home/{sensor_id}/temperature": "temperature",
    }


@pytest.mark.process
def test_discover_with_an_unknown_preset_is_one_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ingest", "discover", "--preset", "nope", "--seconds", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr.startswith("ingest: error: --preset nope: unknown preset (known: ")
    assert len(out.stderr.strip().splitlines()) == 1


def test_topics_your_mapping_covers_are_not_proposed_again() -> None:
    from ingest.devices.discover.command import finish  # noqa: PLC0415

    retained, live = fleet()
    mine = parse(
        '[[rule]]\nname = "boilers"\ntopic = "plant/{sensor_id}/{measurement}"\nformat = "value"\n',
        "--mapping mine.toml",
    )
    captured = [Captured(t, p) for t, p in retained + live]
    out, err = io.StringIO(), io.StringIO()
    assert finish(captured, mine, [], out, err) == 0
    assert 'topic = "plant/' not in out.getvalue()
    assert "boilers" in err.getvalue()  # your rule's counts are in the report
    check_proposal(
        out.getvalue() + '\n[[rule]]\nname = "boilers"\n'
        'topic = "plant/{sensor_id}/{measurement}"\nformat = "value"\n'
        "[rule.values]\nON = true\nOFF = false\n",
        ["influx", "tasmota", "zigbee2mqtt"],
        retained + live,
    )


def test_sparkplug_traffic_is_recognised_even_when_its_births_came_before_the_capture() -> None:
    from ingest.devices.discover.command import finish  # noqa: PLC0415
    from loadgen import sparkplug as enc  # noqa: PLC0415
    from loadgen.sparkplug import Metric  # noqa: PLC0415

    t0 = int(NOW * 1000) - 60_000

    def ndata(node: str, seq: int) -> Captured:
        return Captured(
            enc.topic("Plant1", "NDATA", node),
            enc.payload(
                [Metric(alias=1, timestamp=t0 + seq, datatype=enc.FLOAT, value=1.5)], t0 + seq, seq
            ),
        )

    # E1's BIRTH was published before the capture began; E2 connects during it.
    captured = [ndata("E1", seq) for seq in range(1, 6)]
    captured.append(Captured("spBv1.0/STATE/scada", b'{"online": true, "timestamp": 1}'))
    captured.append(
        Captured(
            enc.topic("Plant1", "NBIRTH", "E2"),
            enc.nbirth([Metric("Temp", 1, t0, enc.FLOAT, 20.0)], bd_seq=0, timestamp=t0),
        )
    )
    captured += [ndata("E2", seq) for seq in range(1, 4)]
    out, err = io.StringIO(), io.StringIO()
    assert finish(captured, [], [], out, err) == 0
    assert "use --preset sparkplug" in out.getvalue()
    assert "spBv1.0" not in out.getvalue().split("[[rule]]", 1)[-1]  # no rule proposed
    report = err.getvalue()
    assert "Sparkplug B messages: NBIRTH 1, NDATA 8, STATE 1" in report
    assert "--preset sparkplug" in report
    assert "5 message(s) refer to a BIRTH published before the capture" in report


def shadowed_fleet() -> list[tuple[str, bytes]]:
    """Tasmota and Zigbee2MQTT as their fixtures document them, Telegraf's line protocol,
    and plain values on three-level topics no preset knows (three messages on each)."""
    t = base_time(time.time())
    vendors = [(m.topic, m.payload) for name in ("tasmota", "zigbee2mqtt") for m in load(name, t)]
    line = f"cpu,host=host1 usage=0.5 {int(time.time() * 1e9)}".encode()
    unknown = [
        (topic, f"{20 + n}.5".encode())
        for n in range(3)
        for topic in ("plant/boiler-1/temperature", "barn/cow-2/humidity", "shed/pump-3/pressure")
    ]
    return [*vendors, ("telegraf/host1/cpu", line), *unknown]


def test_a_proposal_never_takes_a_topic_of_a_preset_it_recommends() -> None:
    """The three-level plain values would be one rule {level1}/{sensor_id}/{measurement},
    which matches tele/<device>/SENSOR and zigbee2mqtt/bridge/state: it is split by its
    first level instead, and the counts are messages and topics, each named."""
    from ingest.devices.discover.command import finish  # noqa: PLC0415

    messages = shadowed_fleet()
    out, err = io.StringIO(), io.StringIO()
    assert finish([Captured(t, p) for t, p in messages], [], [], out, err) == 0
    text = out.getvalue()
    assert 'topic = "{level1}' not in text
    for site, device, quantity in (
        ("plant", "boiler-1", "temperature"),
        ("barn", "cow-2", "humidity"),
        ("shed", "pump-3", "pressure"),
    ):
        assert (
            f"# 3 message(s) on 1 topic(s) of the capture: 3 stored, e.g. "
            f"{site}/{device}/{quantity}\n"
        ) in text
        assert f'topic = "{site}/{{sensor_id}}/{{measurement}}"' in text
    rules = parse(text, "proposal")
    for name in ("influx", "tasmota", "zigbee2mqtt"):
        rules.extend(load_preset(name))
    mapping = Mapping(rules)
    t = base_time(time.time())
    for name in ("tasmota", "zigbee2mqtt"):
        for msg in load(name, t):
            result = mapping.decode(msg.topic, msg.payload, time.time(), Limits())
            assert result.rule is not None, msg.topic
            assert result.rule.name == msg.rule, msg.topic
            assert result.ignored == msg.ignored, msg.topic


def test_an_overlap_no_split_can_remove_is_a_note_naming_the_preset_rule() -> None:
    """Shelly Gen2's filters start with a wildcard (+/status/sys): only the device level
    could keep plant/{sensor_id}/{measurement} from them; none of their topics was
    captured, so the rule stays whole and says where it would take a Shelly's topic."""
    from ingest.devices.discover.command import finish  # noqa: PLC0415

    messages = [Captured(m.topic, m.payload) for m in load("shelly", base_time(time.time()))]
    messages += [
        Captured(f"plant/boiler-{n}/{q}", b"1.5")
        for n in (1, 2)
        for q in ("temperature", "pressure")
    ]
    out, err = io.StringIO(), io.StringIO()
    assert finish(messages, [], [], out, err) == 0
    text = out.getvalue()
    assert "use --preset shelly with this file" in text
    assert (
        "# NOTE: a topic such as plant/status/sys would match this rule before preset "
        "shelly's rule shelly2-status-system (+/status/sys) and "
    ) in text
    assert 'topic = "plant/{sensor_id}/{measurement}"' in text


async def test_following_the_advice_leaves_every_preset_topic_to_its_preset(
    persistent: Broker, daemon: Callable[..., Daemon], db: Any, tmp_path: Path
) -> None:
    """discover on the broker, then the daemon run exactly as discover advises: each vendor
    message lands on the preset rule its fixture names, and every rule takes the messages
    discover's report said it would."""
    messages = shadowed_fleet()
    text, report = await discover(persistent, [], messages)
    mapping = tmp_path / "proposal.toml"
    mapping.write_text(text)
    flags = advised(report, mapping)
    assert flags == [
        "--preset",
        "influx",
        "--preset",
        "tasmota",
        "--preset",
        "zigbee2mqtt",
        "--mapping",
        str(mapping),
    ]
    proc = daemon(*flags, broker_url=persistent.url, rule_topics=True)
    await send(persistent, messages)
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == len(messages))
    said = report_table(report)
    assert daemon_table(proc, list(said)) == said
    t = base_time(time.time())
    vendor = Counter(
        (m.rule, m.ignored) for name in ("tasmota", "zigbee2mqtt") for m in load(name, t)
    )
    for (rule, ignored), n in vendor.items():
        assert said[rule][2 if ignored else 0] == n, rule
    assert said["telegraf"] == (1, 0, 0)
    assert sum(r for _, r, _ in said.values()) == 0  # nothing rejected
    stored_readings = sum(a for a, _, _ in said.values())
    await eventually(lambda: _stored_is(db, stored_readings))
    assert proc.stop() == 0


async def _stored_is(db: Any, n: int) -> bool:
    return await stored(db, "bucket") >= n


def test_topic_levels_a_filter_cannot_hold_still_give_a_loadable_proposal() -> None:
    """A brace is a capture in a rule's topic: a level with one is proposed as a
    wildcard, never written as a literal the mapping file would refuse."""
    from ingest.devices.discover.command import finish  # noqa: PLC0415

    messages = [
        Captured("odd/{x}/temp", b"1.5"),
        Captured("odd/y}/temp", b"2.5"),
        Captured("odd/{z/telemetry/{v}", b'{"a": 1}'),
    ]
    out, err = io.StringIO(), io.StringIO()
    assert finish(messages, [], [], out, err) == 0
    rules = parse(out.getvalue(), "proposal")
    assert [r.topics[0] for r in rules] == ["odd/+/telemetry/{sensor_id}", "odd/{sensor_id}/temp"]
    assert report_table(err.getvalue()) == {"odd-telemetry": (1, 0, 0), "odd-temp": (2, 0, 0)}
    assert re.search(r"^\(no rule\)\s+0\s+0\s+0$", err.getvalue(), re.MULTILINE)

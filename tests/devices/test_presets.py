"""Presets against device-shaped messages: through the engine, ``ingest check``, and the
real daemon with a real broker and store in both modes."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.devices.decode import Limits
from ingest.devices.mapping import Mapping, Result
from ingest.devices.rules import parse, preset_names
from tests.support.devices import PRESETS, Expected, Message, base_time, load, same_value
from tests.support.procs import ROOT, Daemon, eventually

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from ingest.model import Reading
    from tests.support.procs import Broker

# The order docs/presets.md recommends when combining them (fixed prefixes first), then
# any other shipped preset.
ORDER = ("homeassistant", "zigbee2mqtt", "tasmota", "shelly", "esphome", "senml", "influx")
COMBINED = (*ORDER, *sorted(set(preset_names()) - set(ORDER)))


def outcome(
    mapping: Mapping, msg: Message, now: float, t: float, any_ignore_rule: bool = False
) -> list[str]:
    """What is wrong with the engine's answer to one fixture message (empty: nothing)."""
    result = mapping.decode(msg.topic, msg.payload, now, Limits())
    name = result.rule.name if result.rule is not None else None
    same_rule = name == msg.rule or (any_ignore_rule and msg.ignored)
    problems = [] if same_rule else [f"rule {name}, expected {msg.rule}"]
    reasons = [r.reason for r in result.decoded.rejections]
    if msg.ignored:
        return problems + ([] if result.ignored else ["not ignored"])
    if msg.rejections:
        return problems + ([] if reasons == list(msg.rejections) else [f"rejected {reasons}"])
    if reasons:
        problems.append(f"rejected: {result.decoded.rejections}")
    got = result.decoded.readings
    if len(got) != len(msg.readings):
        return [*problems, f"{len(got)} readings, expected {len(msg.readings)}"]
    for reading, want in zip(got, msg.readings, strict=True):
        problems += reading_problems(reading, want, now, t)
    return problems


def reading_problems(reading: Reading, want: Expected, now: float, t: float) -> list[str]:
    """What differs between a decoded reading and the fixture's expected one."""
    problems = []
    if reading.sensor_id != want.sensor_id:
        problems.append(f"sensor {reading.sensor_id}, expected {want.sensor_id}")
    if reading.values.keys() != want.values.keys() or not all(
        same_value(reading.values[k], v) for k, v in want.values.items()
    ):
        problems.append(f"values {reading.values}, expected {want.values}")
    if (reading.tags or None) != (want.tags or None):
        problems.append(f"tags {reading.tags}, expected {want.tags}")
    if (reading.units or None) != (want.units or None):
        problems.append(f"units {reading.units}, expected {want.units}")
    if (reading.info or None) != (want.info or None):
        problems.append(f"info {reading.info}, expected {want.info}")
    if want.ts == "T" and abs(reading.epoch - t) > 0.0005:
        problems.append(f"time {reading.epoch}, expected {t}")
    # Arrival times of one sensor are made distinct: a millisecond later per reading that
    # arrived in the same millisecond (fixtures have fewer than 100 messages).
    if want.ts == "arrival" and not now - 0.001 <= reading.epoch <= now + 0.1:
        problems.append(f"time {reading.epoch}, expected the arrival time {now}")
    return problems


@pytest.mark.parametrize("preset", PRESETS)
def test_every_fixture_gives_the_documented_readings(preset: str) -> None:
    now = time.time()
    t = base_time(now)
    mapping = Mapping.load(None, [preset])
    wrong = {m.topic: p for m in load(preset, t) if (p := outcome(mapping, m, now, t))}
    assert wrong == {}


def test_presets_combined_leave_every_fixture_on_its_own_rule() -> None:
    """All shipped presets loaded at once: names unique, no preset shadowing another's
    readings (a housekeeping topic may be ignored by another preset's identical rule)."""
    assert set(ORDER) <= set(preset_names())
    now = time.time()
    t = base_time(now)
    mapping = Mapping.load(None, COMBINED)
    wrong = {
        m.topic: p
        for preset in PRESETS
        for m in load(preset, t)
        if (p := outcome(mapping, m, now, t, any_ignore_rule=True))
    }
    assert wrong == {}


@pytest.mark.process
@pytest.mark.parametrize("preset", PRESETS)
def test_check_shows_a_fixture_reading_and_an_ignored_topic(preset: str) -> None:
    t = base_time(time.time())
    messages = load(preset, t)
    stored = min((m for m in messages if m.readings), key=lambda m: m.readings[0].ts != "arrival")
    ignored = next(m for m in messages if m.ignored)
    out = _check(preset, stored)
    assert out.returncode == 0, out.stderr
    line = orjson.loads(out.stdout)
    want = stored.readings[0]
    assert (line["rule"], line["sensor_id"], line["values"]) == (
        stored.rule,
        want.sensor_id,
        want.values,
    )
    assert line["tags"] == (want.tags or {})
    if want.ts == "T":
        assert datetime.fromisoformat(line["ts"]) == datetime.fromtimestamp(t, UTC)
    out = _check(preset, ignored)
    assert (out.returncode, out.stdout.strip()) == (0, f"ignored by rule {ignored.rule}")


def _check(preset: str, msg: Message) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ingest",
            "check",
            "--preset",
            preset,
            "--topic-name",
            msg.topic,
            msg.payload.decode(),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_files_name_what_they_follow(preset: str) -> None:
    text = (ROOT / "ingest" / "devices" / "presets" / f"{preset}.toml").read_text()
    assert re.search(r"^# .*\bfollows\b", text, re.MULTILINE | re.IGNORECASE), "name the source"
    assert f"--preset {preset}" in text.splitlines()[0]


# ---------------------------------------------------------------- the real daemon


def prefixed(preset: str, root: str, directory: Path) -> Path:
    """The preset as a user's copy under a base topic of their own (``root/...``): what
    docs/presets.md tells a user to do, and what keeps tests apart on one broker."""
    text = (ROOT / "ingest" / "devices" / "presets" / f"{preset}.toml").read_text()
    text, n = re.subn(
        r'^topic = "(.*)"$', lambda m: f'topic = "{root}/{m.group(1)}"', text, flags=re.MULTILINE
    )
    assert n > 0
    path = directory / f"{preset}.toml"
    path.write_text(text)
    return path


async def stored_rows(db: Any, mode: str) -> list[dict[str, Any]]:
    """Every stored reading: sensor_id, ts, values, tags, units, info, and its bucket
    document (whose units and info are those of its last write)."""
    rows: list[dict[str, Any]] = []
    if mode == "timeseries":
        for doc in await db["readings"].find({}).to_list():
            meta = dict(doc["meta"])
            values = {
                k: v for k, v in doc.items() if k not in {"_id", "ts", "meta", "units", "info"}
            }
            rows.append(
                {
                    "sensor_id": meta.pop("sensor_id"),
                    "ts": doc["ts"],
                    "values": values,
                    "tags": meta or None,
                    "units": doc.get("units"),
                    "info": doc.get("info"),
                    "doc": None,
                }
            )
        return rows
    for doc in await db["buckets"].find({}).to_list():
        for entry in doc["readings"]:
            values = {k: v for k, v in entry.items() if k not in {"ts", "seq"}}
            rows.append(
                {
                    "sensor_id": doc["sensor_id"],
                    "ts": entry["ts"],
                    "values": values,
                    "tags": doc.get("tags"),
                    "units": doc.get("units"),
                    "info": doc.get("info"),
                    "doc": doc,
                }
            )
    return rows


def exact_statistics(doc: dict[str, Any]) -> dict[str, Any]:
    """Bucket statistics recomputed from the document's readings: numbers and booleans
    (as 0/1), no statistics for strings."""
    stats: dict[str, dict[str, Any]] = {}
    for entry in doc["readings"]:
        for name, value in entry.items():
            if name in {"ts", "seq"} or isinstance(value, str):
                continue
            number = int(value) if isinstance(value, bool) else value
            s = stats.setdefault(name, {"count": 0, "sum": 0, "min": number, "max": number})
            s["count"] += 1
            s["sum"] += number
            s["min"], s["max"] = min(s["min"], number), max(s["max"], number)
    return stats


def assert_counted(metrics: dict[str, float], messages: list[Message]) -> None:
    """Ignored topics counted per rule, accepted messages per rule, no other rejection."""
    ignored: dict[str, int] = {}
    accepted: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for m in messages:
        if m.ignored:
            ignored[m.rule] = ignored.get(m.rule, 0) + 1
        elif m.readings:
            accepted[m.rule] = accepted.get(m.rule, 0) + 1
        for reason in m.rejections:
            reasons[reason] = reasons.get(reason, 0) + 1
    for rule, count in ignored.items():
        assert metrics[f'ingest_messages_ignored_total{{rule="{rule}"}}'] == count, rule
    for rule, count in accepted.items():
        assert (
            metrics[f'ingest_rule_messages_total{{outcome="accepted",rule="{rule}"}}'] == count
        ), rule
    rejected = {
        k: v for k, v in metrics.items() if k.startswith("ingest_readings_rejected_total{") and v
    }
    assert rejected == {
        f'ingest_readings_rejected_total{{reason="{r}"}}': float(n) for r, n in reasons.items()
    }


def find_row(
    rows: list[dict[str, Any]], sensor_id: str, values: dict[str, Any]
) -> dict[str, Any] | None:
    for row in rows:
        if (
            row["sensor_id"] == sensor_id
            and row["values"].keys() == values.keys()
            and all(same_value(row["values"][k], v) for k, v in values.items())
        ):
            rows.remove(row)
            return row
    return None


@pytest.mark.parametrize("preset", PRESETS)
async def test_preset_messages_are_stored_through_the_daemon(
    preset: str,
    daemon: Callable[..., Daemon],
    mode: str,
    publish: Any,
    topic_root: str,
    db: Any,
    tmp_path: Path,
) -> None:
    proc = daemon("--mapping", str(prefixed(preset, topic_root, tmp_path)))
    started = time.time()
    t = base_time(started)
    messages = load(preset, t)
    await publish([(f"{topic_root}/{m.topic}", m.payload) for m in messages])
    finished = time.time()
    expected = [(m, r) for m in messages for r in m.readings]
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == len(messages))
    await eventually(
        lambda: proc.metric(f'ingest_readings_written_total{{mode="{mode}"}}') == len(expected)
    )
    assert_counted(proc.metrics(), messages)

    await assert_stored(db, mode, expected, t, (started, finished))
    assert proc.stop() == 0


async def assert_stored(
    db: Any,
    mode: str,
    expected: list[tuple[Message, Expected]],
    t: float,
    window: tuple[float, float],
) -> None:
    """Exactly the expected readings are stored, each as its fixture says: sensor id,
    values and their types, time (``T``, or an arrival within ``window``), tags, units,
    info; bucket statistics exact."""
    rows = await stored_rows(db, mode)
    assert len(rows) == len(expected)
    instant = datetime.fromtimestamp(t, UTC)
    for msg, want in expected:
        row = find_row(rows, want.sensor_id, want.values)
        assert row is not None, f"{msg.topic}: {want} not stored"
        if want.ts == "T":
            assert row["ts"] == instant, msg.topic
        else:
            assert window[0] - 1 <= row["ts"].timestamp() <= window[1] + 5, msg.topic
        if mode == "timeseries":
            assert row["tags"] == want.tags, msg.topic
            assert (row["units"], row["info"]) == (want.units, want.info), msg.topic
        else:  # a bucket keeps the tags, units and info of its last write
            assert set(want.tags or {}) <= set(row["tags"] or {}), msg.topic
            assert (want.units or {}).items() <= (row["units"] or {}).items(), msg.topic
            assert (want.info or {}).items() <= (row["info"] or {}).items(), msg.topic
    if mode == "bucket":
        for doc in await db["buckets"].find({}).to_list():
            assert doc["count"] == len(doc["readings"])
            assert doc.get("stats", {}) == exact_statistics(doc), doc["sensor_id"]


async def test_a_preset_by_name_subscribes_to_its_topics_and_each_message_counts_once(
    broker: Broker, mongo_uri: str, db_name: str, db: Any, tmp_path: Path, publish: Any
) -> None:
    """``--preset zigbee2mqtt`` with no --topic: the daemon subscribes to the preset's
    filters, whose overlaps (``zigbee2mqtt/+/availability`` and ``zigbee2mqtt/+/+``) must
    not deliver a message twice; a topic outside the preset never arrives. The preset's
    filters are joined into ``zigbee2mqtt/+/#``: a topic that only this widening brings in
    and no rule takes is acked and counted as ignored, not rejected as ``no_rule``."""
    device = f"dev{uuid.uuid4().hex[:8]}"
    proc = Daemon(
        [
            "--mqtt-url",
            broker.url,
            "--mongodb-uri",
            mongo_uri,
            "--db",
            db_name,
            "--client-id",
            f"ingest-{device}",
            "--flush-interval",
            "0.2",
            "--mode",
            "timeseries",
            "--preset",
            "zigbee2mqtt",
        ],
        tmp_path / "daemon.log",
    ).start()
    try:
        await publish(
            [
                (f"zigbee2mqtt/{device}", b'{"temperature":21.5,"state":"ON"}'),
                (f"zigbee2mqtt/{device}/availability", b'{"state":"online"}'),
                (f"elsewhere/{device}", b'{"temperature":1}'),
                (f"zigbee2mqtt/{device}/not/a/device/topic", b"1"),
                # Last, on a topic only one filter matches: once it is written, any
                # second copy of the messages before it has been received too.
                (f"zigbee2mqtt/{device}-last", b'{"temperature":1}'),
            ]
        )
        await eventually(
            lambda: proc.metric('ingest_readings_written_total{mode="timeseries"}') == 2
        )
        metrics = proc.metrics()
        assert metrics["ingest_messages_received_total"] == 4
        assert metrics['ingest_messages_ignored_total{rule="z2m-availability"}'] == 1
        assert metrics['ingest_messages_ignored_total{rule="(outside the rules)"}'] == 1
        assert metrics['ingest_readings_rejected_total{reason="no_rule"}'] == 0
        docs = await db["readings"].find({"meta.sensor_id": device}).to_list()
        assert [(d["temperature"], d["state"]) for d in docs] == [(21.5, True)]
    finally:
        assert proc.stop() == 0


def test_shelly_notify_status_rule_as_documented() -> None:
    """docs/presets.md: swap the ignored events/rpc rule for the commented one to read
    NotifyStatus (with the device's own time); NotifyEvent then falls out as rejected."""
    text = (ROOT / "ingest" / "devices" / "presets" / "shelly.toml").read_text()
    ignored = 'name = "shelly2-events"\ntopic = "+/events/rpc"\nignore = true\n'
    assert ignored in text
    start = text.index('# [[rule]]\n# name = "shelly2-notify"')
    notify = "\n".join(line.removeprefix("# ") for line in text[start:].splitlines())
    rules = parse(
        text[:start].replace(ignored, 'name = "gone"\ntopic = "nothing/here"\nignore = true\n')
        + notify,
        "copy",
    )
    now = time.time()
    t = base_time(now)
    status = orjson.dumps(
        {
            "src": "shellypro4pm-f008d1d8b8b8",
            "dst": "user_1",
            "method": "NotifyStatus",
            "params": {
                "ts": round(t, 2),
                "switch:0": {"id": 0, "output": True, "source": "button"},
            },
        }
    )
    result = Mapping(rules).decode("shellypro4pm-f008d1d8b8b8/events/rpc", status, now, Limits())
    assert not result.decoded.rejections
    [reading] = result.decoded.readings
    assert (reading.sensor_id, reading.values) == (
        "shellypro4pm-f008d1d8b8b8",
        {"params_switch_0_output": True},
    )
    assert reading.epoch == pytest.approx(t, abs=0.01)
    event = orjson.dumps(
        {
            "src": "shellyplus1-a8032abe54dc",
            "dst": "user_1",
            "method": "NotifyEvent",
            "params": {
                "ts": round(t, 2),
                "events": [
                    {"component": "input:0", "id": 0, "event": "single_push", "ts": round(t, 2)}
                ],
            },
        }
    )
    result = Mapping(rules).decode("shellyplus1-a8032abe54dc/events/rpc", event, now, Limits())
    assert [r.reason for r in result.decoded.rejections] == ["bad_value", "no_measurements"]


_HOSTILE_LEVEL = st.text(min_size=0, max_size=300).filter(lambda s: "/" not in s and "\0" not in s)
_HOSTILE_PAYLOAD = st.one_of(
    st.binary(max_size=2000),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda inner: (
            st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=80), inner, max_size=8)
        ),
        max_leaves=40,
    ).map(
        lambda doc: orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS) if _dumpable(doc) else b"null"
    ),
)
_ALL = Mapping.load(None, COMBINED)
# A sensor id: the device's name kept exactly, no control characters, 1 to 128 characters.
_SAFE = re.compile(r"[^\x00-\x1f\x7f-\x9f]{1,128}")
_FIELD = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _dumpable(doc: object) -> bool:
    try:
        orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        return False
    return True


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(
    preset=st.sampled_from(PRESETS),
    index=st.integers(0, 40),
    level=_HOSTILE_LEVEL,
    payload=_HOSTILE_PAYLOAD,
)
def test_hostile_device_names_and_payloads_through_the_presets(
    preset: str, index: int, level: str, payload: bytes
) -> None:
    """A fixture topic with its device level replaced by anything, and any payload: no
    exception, and every stored sensor id, field name and tag stays inside the guard; a
    sensor id is the device level itself (or built from it), never a "safe" spelling."""
    messages = load(preset, base_time(time.time()))
    levels = messages[index % len(messages)].topic.split("/")
    levels[1 if len(levels) > 1 else 0] = level
    result = _ALL.decode("/".join(levels), payload, time.time(), Limits())
    for reading in result.decoded.readings:
        assert _SAFE.fullmatch(reading.sensor_id)
        assert all(
            _FIELD.fullmatch(name) and name not in {"ts", "_id", "meta"} for name in reading.values
        )
        assert all(len(v) <= 256 for v in (reading.tags or {}).values())
        assert all(
            not isinstance(v, str) or len(v.encode()) <= 256 for v in reading.values.values()
        )


def test_plain_values_of_one_device_in_one_millisecond_are_all_stored_in_bucket_mode() -> None:
    """Shelly Gen1 publishes relay/0/power, relay/0/energy, temperature... in one burst:
    each value is its own message, and several arrive within a millisecond."""
    from ingest.store.writers import Plan  # noqa: PLC0415
    from ingest.store.writers._bucket_py import unique_readings  # noqa: PLC0415

    mapping = Mapping.load(None, ["shelly"])
    now = math.floor(time.time()) + 0.1234
    readings = [
        r
        for topic, payload in (
            ("shellies/shelly1pm-84CCA8ADE5E2/relay/0/power", b"22.54"),
            ("shellies/shelly1pm-84CCA8ADE5E2/relay/0/energy", b"3065"),
            ("shellies/shelly1pm-84CCA8ADE5E2/temperature", b"41.62"),
        )
        for r in mapping.decode(topic, payload, now, Limits()).decoded.readings
    ]
    plan = Plan([], [])
    kept, _ = unique_readings(readings, plan)
    assert plan.conflicts == []
    assert plan.deferred == []
    assert sum(len(r.values) for r in kept) == 3


def _matches(topic_filter: str, topic: str) -> bool:
    """MQTT topic filter matching (``+`` one level, ``#`` the rest)."""
    want, got = topic_filter.split("/"), topic.split("/")
    for i, level in enumerate(want):
        if level == "#":
            return True
        if i >= len(got) or (level not in {"+", got[i]}):
            return False
    return len(want) == len(got)


@pytest.mark.parametrize("preset", PRESETS)
def test_each_reading_message_matches_one_filter_of_its_preset(preset: str) -> None:
    """No two rules of a preset cover a topic that carries readings, so the preset needs
    no joined (broader) subscription to be read once per message."""
    subscriptions = {f for rule in Mapping.load(None, [preset]).rules for f in rule.subscriptions}
    for msg in load(preset, base_time(time.time())):
        if msg.readings:
            matching = [f for f in subscriptions if _matches(f, msg.topic)]
            assert len(matching) == 1, (msg.topic, matching)


# ---------------------------------------------------------------- Telegraf (--preset influx)

# One interval of Telegraf's mem, disk and cpu inputs (one timestamp), by metric name.
TELEGRAF = {
    "mem": ["mem,host=h1 free=100i,used=5i"],
    "disk": ["disk,host=h1,path=/ free=200i,used=7i", "disk,host=h1,path=/boot free=300i,used=9i"],
    "cpu": ["cpu,host=h1,cpu=cpu0 usage_idle=91.5", "cpu,host=h1,cpu=cpu1 usage_idle=88.0"],
}
# What must be stored: (sensor id, tags) -> values, each value once, under a name and a
# series that tell it apart (the host tag is the sensor id, not also a tag).
TELEGRAF_SERIES: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, Any]] = {
    ("h1", ()): {"mem_free": 100, "mem_used": 5},
    ("h1", (("path", "/"),)): {"disk_free": 200, "disk_used": 7},
    ("h1", (("path", "/boot"),)): {"disk_free": 300, "disk_used": 9},
    ("h1", (("cpu", "cpu0"),)): {"cpu_usage_idle": 91.5},
    ("h1", (("cpu", "cpu1"),)): {"cpu_usage_idle": 88.0},
}
# Telegraf's outputs.mqtt layouts that carry line protocol, with the topic template
# (plugins/outputs/mqtt/README.md): the rule of the preset expected to take them.
LAYOUTS = {
    "non-batch": "telegraf",  # one metric per message on telegraf/<host>/<name>
    "batch": "telegraf",  # the metrics of one topic in one message
    "batch-host-topic": "telegraf-one-level",  # batch, topic = 'telegraf/{{ .Tag "host" }}'
}


def telegraf_messages(layout: str, ns: int, root: str = "telegraf") -> list[tuple[str, bytes]]:
    """One interval as outputs.mqtt publishes it with data_format = "influx" (Telegraf's
    influx serializer ends every line with a newline)."""

    def text(lines: list[str]) -> bytes:
        return "".join(f"{line} {ns}\n" for line in lines).encode()

    if layout == "non-batch":
        return [
            (f"{root}/h1/{name}", text([line]))
            for name, lines in TELEGRAF.items()
            for line in lines
        ]
    if layout == "batch":
        return [(f"{root}/h1/{name}", text(lines)) for name, lines in TELEGRAF.items()]
    return [(f"{root}/h1", text([line for lines in TELEGRAF.values() for line in lines]))]


def series_of(
    rows: list[tuple[str, dict[str, str] | None, dict[str, Any]]],
) -> dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, Any]]:
    """(sensor id, tags, values) rows by series; a series twice is a failure."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, Any]] = {}
    for sensor, tags, values in rows:
        key = (sensor, tuple(sorted((tags or {}).items())))
        assert key not in out, f"series {key} stored twice"
        out[key] = values
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
def test_telegraf_layouts_give_each_value_once_under_its_own_name_and_series(layout: str) -> None:
    mapping = Mapping.load(None, ["influx"])
    now = time.time()
    ns = (math.floor(now) - 3600) * 10**9
    readings = []
    for topic, payload in telegraf_messages(layout, ns):
        result = mapping.decode(topic, payload, now, Limits())
        assert result.rule is not None
        assert (result.rule.name, result.decoded.rejections) == (LAYOUTS[layout], [])
        readings += result.decoded.readings
    assert {r.ms for r in readings} == {ns // 10**6}
    got = series_of([(r.sensor_id, r.tags, r.values) for r in readings])
    assert got == TELEGRAF_SERIES
    assert all(
        same_value(got[k][name], v)
        for k, want in TELEGRAF_SERIES.items()
        for name, v in want.items()
    )


def test_telegraf_topics_without_the_host_and_the_other_layouts() -> None:
    """omit_hostname: telegraf/<name> carries no host: refused, never stored under the
    measurement's name as a sensor; telegraf/<host>/<name> without a host tag takes the
    topic's host; the field and homie-v4 layouts publish bare values, refused as not line
    protocol (docs/presets.md says which rules read them); influx/<id> as before."""
    mapping = Mapping.load(None, ["influx"])
    now = time.time()

    def decode(topic: str, payload: str) -> Result:
        return mapping.decode(topic, payload.encode(), now, Limits())

    result = decode("telegraf/mem", "mem free=100i")
    assert [r.reason for r in result.decoded.rejections] == ["no_sensor_id"]
    (reading,) = decode("telegraf/h1/mem", "mem free=100i").decoded.readings
    assert (reading.sensor_id, reading.values, reading.tags) == ("h1", {"mem_free": 100}, {})
    for topic, value in (("telegraf/h1/mem/free", "100"), ("telegraf/h1/$homie", "4.0")):
        result = decode(topic, value)
        assert result.rule is not None
        assert result.rule.name == "telegraf"
        assert [r.reason for r in result.decoded.rejections] == ["bad_shape"]
    (reading,) = decode("influx/kitchen", "climate,room=kitchen temp=22.5").decoded.readings
    assert (reading.sensor_id, reading.values, reading.tags) == (
        "kitchen",
        {"climate_temp": 22.5},
        {"room": "kitchen"},
    )


def test_the_field_layout_rule_in_the_docs_reads_telegraf_field_topics() -> None:
    """docs/presets.md's rule for layout = "field" with the tags in the topic template."""
    docs = (ROOT / "docs" / "presets.md").read_text()
    block = re.search(r"```toml\n(# layout = \"field\".*?)```", docs, re.DOTALL)
    assert block is not None
    mapping = Mapping(
        parse(block.group(1), "docs")
        + parse(
            (ROOT / "ingest" / "devices" / "presets" / "influx.toml").read_text(), "--preset influx"
        )
    )
    now = time.time()
    got = []
    for topic, value in (
        ("telegraf/h1/disk/sda1/free", b"300"),
        ("telegraf/h1/disk/sda2/free", b"200"),
        ("telegraf/h1/mem/free", b"100"),
    ):
        result = mapping.decode(topic, value, now, Limits())
        assert result.decoded.rejections == []
        got += [(r.sensor_id, r.tags, r.values) for r in result.decoded.readings]
    assert got == [
        ("h1", {"device": "sda1"}, {"disk_free": 300}),
        ("h1", {"device": "sda2"}, {"disk_free": 200}),
        ("h1", {}, {"mem_free": 100}),
    ]


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_telegraf_metrics_are_stored_once_each_by_series_through_the_daemon(
    layout: str,
    daemon: Callable[..., Daemon],
    mode: str,
    publish: Any,
    topic_root: str,
    db: Any,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    proc = daemon("--mapping", str(prefixed("influx", topic_root, tmp_path)))
    ns = (math.floor(time.time()) - 3600) * 10**9
    messages = telegraf_messages(layout, ns, f"{topic_root}/telegraf")
    await publish(messages)
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == len(messages))
    rule = LAYOUTS[layout]
    assert proc.metric(f'ingest_rule_messages_total{{outcome="accepted",rule="{rule}"}}') == len(
        messages
    )

    def settled() -> bool:  # every reading written or refused
        metrics = proc.metrics()
        return metrics.get(f'ingest_readings_written_total{{mode="{mode}"}}', 0) + sum(
            v for k, v in metrics.items() if k.startswith("ingest_readings_rejected_total{")
        ) >= len(TELEGRAF_SERIES)

    await eventually(settled)
    metrics = proc.metrics()
    assert {
        k: v for k, v in metrics.items() if k.startswith("ingest_readings_rejected_total{") and v
    } == {}
    assert metrics[f'ingest_readings_written_total{{mode="{mode}"}}'] == len(TELEGRAF_SERIES)
    rows = await stored_rows(db, mode)
    assert {row["ts"] for row in rows} == {datetime.fromtimestamp(ns // 10**9, UTC)}
    got = series_of([(row["sensor_id"], row["tags"], row["values"]) for row in rows])
    assert got == TELEGRAF_SERIES
    assert all(
        same_value(got[k][name], v)
        for k, want in TELEGRAF_SERIES.items()
        for name, v in want.items()
    )
    assert proc.stop() == 0

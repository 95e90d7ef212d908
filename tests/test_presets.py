"""Presets against device-shaped messages: through the engine, ``ingest check``, and the
real daemon with a real broker and store in both modes."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import orjson
import pytest

from ingest.decode import Limits
from ingest.mapping import Mapping
from ingest.rules import preset_names
from tests.support.devices import PRESETS, Message, base_time, load, same_value
from tests.support.procs import ROOT

# The order docs/presets.md recommends when combining them: fixed prefixes first.
COMBINED = ("homeassistant", "zigbee2mqtt", "tasmota", "shelly", "esphome", "senml", "influx")


def outcome(mapping: Mapping, msg: Message, now: float, t: float,
            any_ignore_rule: bool = False) -> list[str]:
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
        if reading.sensor_id != want.sensor_id:
            problems.append(f"sensor {reading.sensor_id}, expected {want.sensor_id}")
        if reading.values.keys() != want.values.keys() or not all(
                same_value(reading.values[k], v) for k, v in want.values.items()):
            problems.append(f"values {reading.values}, expected {want.values}")
        if (reading.tags or None) != (want.tags or None):
            problems.append(f"tags {reading.tags}, expected {want.tags}")
        expected_ts = t if want.ts == "T" else now
        if abs(reading.epoch - expected_ts) > 0.0005:
            problems.append(f"time {reading.epoch}, expected {expected_ts} ({want.ts})")
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
    assert set(COMBINED) == set(preset_names())
    now = time.time()
    t = base_time(now)
    mapping = Mapping.load(None, COMBINED)
    wrong = {m.topic: p for preset in PRESETS for m in load(preset, t)
             if (p := outcome(mapping, m, now, t, any_ignore_rule=True))}
    assert wrong == {}


@pytest.mark.parametrize("preset", PRESETS)
def test_check_shows_a_fixture_reading_and_an_ignored_topic(preset: str) -> None:
    messages = load(preset, base_time(time.time()))
    stored = next(m for m in messages if m.readings and m.readings[0].ts == "arrival")
    ignored = next(m for m in messages if m.ignored)
    out = _check(preset, stored)
    assert out.returncode == 0, out.stderr
    line = orjson.loads(out.stdout)
    want = stored.readings[0]
    assert (line["rule"], line["sensor_id"], line["values"]) == (
        stored.rule, want.sensor_id, want.values)
    assert line["tags"] == (want.tags or {})
    out = _check(preset, ignored)
    assert (out.returncode, out.stdout.strip()) == (0, f"ignored by rule {ignored.rule}")


def _check(preset: str, msg: Message) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingest", "check", "--preset", preset, "--topic-name",
         msg.topic, msg.payload.decode()],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_files_name_what_they_follow(preset: str) -> None:
    text = (ROOT / "ingest" / "presets" / f"{preset}.toml").read_text()
    assert re.search(r"^# .*\bfollows\b", text, re.MULTILINE | re.IGNORECASE), "name the source"
    assert f"--preset {preset}" in text.splitlines()[0]

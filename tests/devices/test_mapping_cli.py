"""--mapping, --preset and ``ingest check`` as a user meets them: the real process."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

import orjson
import pytest

from ingest.cli import build_parser, settings_from
from tests.support.procs import clean_env

if TYPE_CHECKING:
    from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # noqa: PTH100, PTH120


def ingest(
    *args: str, stdin: bytes = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    clean = clean_env()
    return subprocess.run(
        [sys.executable, "-m", "ingest", *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        cwd=ROOT,
        env={**clean, **(env or {})},
        check=False,
    )


@pytest.mark.process
@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            '[[rule]]\nname = "z2m"\ntopic = "zigbee2mqtt/{sensor_id}"\nformat = "yaml"\n',
            (
                "rule 'z2m': format must be one of ingest, json, value, senml, influx, sparkplug, "
                "homie, got 'yaml'"
            ),
        ),
        (
            (
                '[[rule]]\nname = "z2m"\ntopic = "zigbee2mqtt/{sensor_id}"\n[rule.time]\n'
                'format = "local"\nzone = "Nowhere/City"\n'
            ),
            "rule 'z2m': time.zone 'Nowhere/City': unknown time zone",
        ),
        ("[[rule]\nname = 1\n", "not valid TOML"),
    ],
)
def test_a_bad_mapping_file_stops_the_daemon_with_one_line_and_exit_2(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    done = ingest("run", "--mapping", str(path), "--dry-run")
    assert done.returncode == 2
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"ingest: error: --mapping {path}: ")
    assert problem in lines[0]
    assert done.stdout == b""


@pytest.mark.process
def test_a_missing_mapping_file_and_an_unknown_preset_from_the_environment(tmp_path: Path) -> None:
    done = ingest("run", "--mapping", str(tmp_path / "none.toml"))
    assert done.returncode == 2
    assert (
        done.stderr.decode().strip().endswith("none.toml: cannot read: No such file or directory")
    )
    done = ingest("run", env={"INGEST_PRESET": "senml, nope"})
    assert done.returncode == 2
    assert done.stderr.decode().startswith("ingest: error: --preset nope: unknown preset (known: ")


def test_subscriptions_come_from_the_rules_unless_topics_are_given(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(
        '[[rule]]\nname = "a"\ntopic = "home/{room}/{sensor_id}"\n'
        '[[rule]]\nname = "b"\ntopic = "home/#"\nignore = true\n'
    )
    env = {"INGEST_PRESET": "senml,influx"}
    args = build_parser(env).parse_args(["run", "--mapping", str(path)])
    settings = settings_from(args, env)
    # home/# covers home/+/+
    assert settings.topics == ("home/#", "senml/#", "telegraf/+/+/#", "telegraf/+", "influx/+")
    assert settings.mapping is not None
    assert [r.name for r in settings.mapping.rules] == [
        "a",
        "b",
        "senml",
        "telegraf",
        "telegraf-one-level",
        "influx",
    ]
    args = build_parser(env).parse_args(["run", "--preset", "senml", "--topic", "x/#"])
    settings = settings_from(args, env)
    assert settings.topics == ("x/#",)
    assert settings.mapping is not None
    assert [r.name for r in settings.mapping.rules] == ["senml"]  # the flag wins over env
    plain = settings_from(build_parser({}).parse_args(["run"]), {})
    assert plain.mapping is None
    assert plain.topics == ("sensors/#",)


@pytest.mark.process
def test_check_prints_the_readings_that_would_be_stored(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(
        '[[rule]]\nname = "bridge"\ntopic = "zigbee2mqtt/bridge/#"\nignore = true\n'
        '[[rule]]\nname = "z2m"\ntopic = "zigbee2mqtt/{sensor_id}"\n'
        '[rule.time]\nfield = "ts"\n'
    )
    payload = b'{"ts": 1795251600500, "occupancy": true, "update": {"state": "idle"}}'
    done = ingest(
        "check", "--mapping", str(path), "--topic-name", "zigbee2mqtt/Hall Way", "-", stdin=payload
    )
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.decode().splitlines()
    assert orjson.loads(line) == {
        "rule": "z2m",
        "sensor_id": "Hall Way",
        "ts": "2026-11-21T09:00:00.500+00:00",
        "values": {"occupancy": True, "update_state": "idle"},
        "tags": {},
        "units": {},
    }
    done = ingest(
        "check", "--mapping", str(path), "--topic-name", "zigbee2mqtt/bridge/state", "online"
    )
    assert (done.returncode, done.stdout) == (0, b"ignored by rule bridge\n")


@pytest.mark.process
def test_check_exits_1_when_everything_is_rejected_and_says_why(tmp_path: Path) -> None:
    done = ingest("check", "--preset", "influx", "--topic-name", "other/x", "m v=1")
    assert done.returncode == 1
    assert done.stdout.decode() == ("rejected: no_rule: no mapping rule matches topic 'other/x'\n")
    done = ingest(
        "check",
        "--preset",
        "influx",
        "--topic-name",
        "influx/s1",
        'm v=1,bad="' + "x" * 300 + '"\nnot a line',
    )
    assert done.returncode == 0
    out = done.stdout.decode().splitlines()
    assert orjson.loads(out[0])["values"] == {"m_v": 1.0}
    assert sorted(out[1:]) == [
        "rejected (reading 0): bad_value: m_bad: string longer than 256 bytes",
        "rejected (reading 1): bad_shape: not line protocol: Failed to parse key of field.",
    ]
    done = ingest("check", "--topic-name", "sensors/s1", '{"temp": "hot"}')
    assert done.returncode == 1
    assert done.stdout.decode().startswith("rejected: bad_value: temp: expected a number")
    done = ingest("check", "--preset", "senml")
    assert done.returncode == 2
    assert b"--topic-name" in done.stderr

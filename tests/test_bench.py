"""loadgen bench and MQTT credentials: report rendering, percentiles, CONNECT packets,
and a small bench of both modes against a password-protected mosquitto."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest
from pymongo import MongoClient

from loadgen.bench_cli import notes, write_outputs
from loadgen.cli import main
from loadgen.config import BenchSettings, ConfigError, parse_mqtt_url, redact
from loadgen.payloads import late_plan, message_plan
from loadgen.report import SECTIONS, percentile, render_markdown
from loadgen.wire import RefusedError, connect_packet
from tests.support.procs import ROOT, Broker, free_port, wait_port

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

USER, SECRET = "sensor", "s3cret-Pa55"


# --- percentiles and the report ---------------------------------------------------------------


def test_percentile_interpolates_between_ranks() -> None:
    values = [40.0, 10.0, 30.0, 20.0]
    assert percentile(values, 0) == 10.0
    assert percentile(values, 100) == 40.0
    assert percentile(values, 50) == pytest.approx(25.0)
    assert percentile(values, 90) == pytest.approx(37.0)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError, match=r"0\.\.100"):
        percentile(values, 101)


def _mode(written: int, ok: bool = True) -> dict[str, Any]:
    return {
        "published": 1000,
        "written": written,
        "rejected": 0,
        "complete": True,
        "throughput": {"readings_per_s": 480, "seconds": 2.08},
        "latency_ms": {"samples": 50, "seen": 50, "p50": 120.5, "p90": 250.0, "p99": 300.1},
        "writes": {
            "ops_per_reading": 0.05,
            "requests_per_reading": 0.002,
            "est_bytes_per_reading": 59.5,
        },
        "storage": {
            "documents": 20,
            "storage_size": 4096,
            "total_index_size": 2048,
            "avg_document_size": 1500,
        },
        "queries_ms": {
            "one_sensor_last_hour": {"median_ms": 1.234},
            "one_sensor_last_24h": {"median_ms": 2.5},
            "hourly_all_sensors_day": {"median_ms": 10.0},
        },
        "verify": {
            "ok": ok,
            "found": written,
            "missing": 1000 - written,
            "duplicated": 0,
            "wrong": 0,
            "bad_documents": 0,
        },
    }


def test_markdown_has_a_column_per_mode_and_a_row_per_figure() -> None:
    report = {
        "run_id": "r1",
        "server": {"version": "8.0.4", "label": "MongoDB server"},
        "workload": {"preset": "many-sensors", "sensors": 500, "count": 1000},
        "modes": {"bucket": _mode(1000), "timeseries": _mode(999, ok=False)},
        "notes": ["an estimate"],
    }
    text = render_markdown(report)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| |"))
    assert header == "| | bucket | timeseries |"
    table = [line for line in lines if line.startswith("| ")]
    assert all(line.count("|") == 4 for line in table)
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table[2:]]
    row = {c[0]: c[1:] for c in cells}
    assert row["ingest throughput (readings/s, first publish to last write)"][0] == "480"
    assert row["end-to-end latency p50 / p90 / p99 (ms)"][0].startswith("120 / 250 / 300")
    assert row["storageSize"][0] == "4.0 KiB"
    assert row["query: one sensor, last hour (median ms)"][0] == "1.23"
    assert row["loadgen verify"][0] == "OK (1,000 readings)"
    assert row["loadgen verify"][1].startswith("MISMATCH: missing 1")
    assert "MongoDB 8.0.4 (MongoDB server)" in text
    assert "- an estimate" in text


def test_markdown_shows_missing_figures_as_na() -> None:
    text = render_markdown({"modes": {"bucket": {"published": 5}}})
    assert "| readings published | 5 |" in text
    assert "| storageSize | n/a |" in text


def test_without_matplotlib_the_chart_is_skipped_and_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    report: dict[str, Any] = {
        "run_id": "r",
        "server": {"label": "x", "emulator": True},
        "modes": {"bucket": _mode(1000)},
    }
    paths = write_outputs(report, tmp_path, "bench-r")
    assert [p.name for p in paths] == ["bench-r.md", "bench-r.json"]
    assert report["chart"] is None
    assert "matplotlib is not installed" in report["chart_skipped"]
    assert "pip install -e '.[bench]'" in report["chart_skipped"]  # works from a clone
    assert "chart skipped" in (tmp_path / "bench-r.md").read_text()


def test_the_latency_note_counts_the_readings_actually_sampled(tmp_path: Path) -> None:
    """A short run has fewer messages than --latency-samples: the note says how many."""
    short = _mode(1000)
    short["latency_ms"] = {**short["latency_ms"], "samples": 12, "seen": 12}
    report = {"server": {"emulator": False}, "modes": {"bucket": short, "timeseries": short}}
    bench = BenchSettings(
        mongodb_uri="mongodb://x",
        db="d",
        out=tmp_path,
        modes=("bucket", "timeseries"),
        collections={},
        preset="p",
        start="s",
        latency_samples=50,
    )
    latency_note = next(n for n in notes(report, bench) if n.startswith("latency"))
    assert latency_note.startswith("latency: 12 readings (of --latency-samples 50")
    assert "50 readings sampled" not in latency_note


# --- MQTT credentials --------------------------------------------------------------------------


def test_connect_packet_carries_user_name_and_password_after_the_client_id() -> None:
    plain = connect_packet("c1", 60)
    assert plain[9] == 0x02  # clean session only
    packet = connect_packet("c1", 60, "user", "pw")
    assert packet[0] == 0x10
    assert packet[9] == 0x02 | 0x80 | 0x40
    body = packet[2:]
    assert body[10:] == (
        struct.pack("!H", 2) + b"c1" + struct.pack("!H", 4) + b"user" + struct.pack("!H", 2) + b"pw"
    )
    assert packet[1] == len(body)
    assert connect_packet("c1", 60, "user")[9] == 0x82  # a user name without a password


def test_mqtt_url_credentials_and_password_file(tmp_path: Path) -> None:
    broker = parse_mqtt_url("mqtt://sensor:p%40ss@broker:1884")
    assert (broker.host, broker.port, broker.username, broker.password) == (
        "broker",
        1884,
        "sensor",
        "p@ss",
    )
    assert "p@ss" not in repr(broker)
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    assert parse_mqtt_url("mqtt://sensor:url@broker", str(secret)).password == "from-file"
    assert parse_mqtt_url("mqtt://sensor@broker", str(secret)).password == "from-file"
    with pytest.raises(ConfigError, match="--mqtt-password-file: cannot read"):
        parse_mqtt_url("mqtt://sensor@broker", str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="needs a user name"):
        parse_mqtt_url("mqtt://broker", str(secret))
    with pytest.raises(ConfigError) as bad:
        parse_mqtt_url("http://sensor:hunter2@broker")
    assert "hunter2" not in str(bad.value)
    assert redact("mqtt://u:hunter2@h:1") == "mqtt://u:***@h:1"


def test_refusal_names_the_reason_not_the_password() -> None:
    assert str(RefusedError(4)) == (
        "broker refused the connection: bad user name or password (return code 4)"
    )
    assert "not authorized" in str(RefusedError(5))


def test_late_plan_sends_every_nth_message_of_each_sensor_at_the_end() -> None:
    plan = list(late_plan(message_plan([0, 1], [6, 6], 2), 2, 3))
    assert plan == [(0, 0, 2), (1, 0, 2), (0, 2, 2), (1, 2, 2), (0, 4, 2), (1, 4, 2)]
    plan = list(late_plan(message_plan([0], [6], 1), 1, 3))
    assert [first for _, first, _ in plan] == [0, 1, 3, 4, 2, 5]


@pytest.fixture
def auth_broker(tmp_path: Path) -> Iterator[str]:
    """mosquitto that wants a password: mqtt://127.0.0.1:<port>."""
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    passwd_tool = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
    passwd = tmp_path / "passwd"
    subprocess.run(
        [passwd_tool, "-b", "-c", str(passwd), USER, SECRET], check=True, capture_output=True
    )
    passwd.chmod(0o600)
    port = free_port()
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous false\n"
        f"password_file {passwd}\nmax_queued_messages 1000000\n"
        f"log_dest file {tmp_path}/mosquitto.log\nuser root\n"
    )
    process = subprocess.Popen([binary, "-c", str(conf)], stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        yield f"mqtt://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def _publish(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "loadgen",
            "publish",
            "--mqtt-url",
            url,
            "--count",
            "20",
            "--sensors",
            "2",
            "--qos",
            "1",
            "--rate",
            "0",
            "--json",
            *extra,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def test_publish_logs_in_with_a_password_and_a_refusal_exits_2(
    auth_broker: str, tmp_path: Path
) -> None:
    host = auth_broker.removeprefix("mqtt://")
    good = _publish(f"mqtt://{USER}:{SECRET}@{host}")
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["acked"] == 20
    secret = tmp_path / "pw"
    secret.write_text(SECRET + "\n")
    from_file = _publish(f"mqtt://{USER}:wrong@{host}", "--mqtt-password-file", str(secret))
    assert from_file.returncode == 0, from_file.stderr
    for url, extra in (
        (f"mqtt://{USER}:not-{SECRET}@{host}", ()),
        (auth_broker, ()),
        (f"mqtt://{USER}@{host}", ("--mqtt-password-file", str(tmp_path / "x"))),
    ):
        if extra:
            (tmp_path / "x").write_text("wrong-from-file")
        bad = _publish(url, *extra)
        assert bad.returncode == 2
        assert bad.stderr.count("\n") == 1, bad.stderr
        assert "refused the connection" in bad.stderr
        assert SECRET not in bad.stderr + bad.stdout
        assert "wrong-from-file" not in bad.stderr


# --- bench end to end --------------------------------------------------------------------------


@pytest.fixture
def bench_db(mongo_uri: str, db_name: str) -> Iterator[str]:
    yield db_name
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_uri)
    client.drop_database(db_name)
    client.close()


def test_bench_compares_both_modes_end_to_end(
    auth_broker: str, mongo_uri: str, bench_db: str, tmp_path: Path
) -> None:
    secret = tmp_path / "sensor-password"
    secret.write_text(SECRET + "\n")
    out = tmp_path / "out"
    host = auth_broker.removeprefix("mqtt://")
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadgen",
            "bench",
            f"--mqtt-url=mqtt://{USER}@{host}",
            f"--mqtt-password-file={secret}",
            f"--mongodb-uri={mongo_uri}",
            f"--out={out}",
            "--db",
            bench_db,
            "--preset",
            "many-sensors",
            "--sensors",
            "20",
            "--count",
            "200",
            "--rate",
            "400",
            "--query-runs",
            "2",
            "--latency-samples",
            "10",
            "--daemon-arg=--flush-interval=0.2",
            "--wait-timeout",
            "40",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 60
    assert SECRET not in result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert set(report["modes"]) == {"bucket", "timeseries"}
    # ISO-8601 UTC strings compare in time order; the run takes seconds (two daemons).
    assert report["started_at"] < report["finished_at"]
    rows: dict[str, int] = {}
    promql: dict[str, int] = {}
    for mode, figures in report["modes"].items():
        assert all(section in figures for section in SECTIONS), mode
        assert figures["published"] == figures["written"] == 200
        verify = figures["verify"]
        assert verify["ok"], verify
        assert (verify["found"], verify["missing"], verify["duplicated"], verify["wrong"]) == (
            200,
            0,
            0,
            0,
        )
        assert figures["throughput"]["readings_per_s"] > 0
        assert figures["latency_ms"]["seen"] > 0
        assert 0 <= figures["latency_ms"]["p50"] <= figures["latency_ms"]["p99"]
        assert figures["writes"]["est_bytes_per_reading"] > 0
        assert figures["storage"]["documents"] > 0
        assert all(q["median_ms"] > 0 for q in figures["queries_ms"].values())
        rows[mode] = figures["queries_ms"]["hourly_all_sensors_day"]["rows"]
        promql[mode] = figures["queries_ms"]["promql_avg_over_time_day"]["rows"]
    # Both layouts answer the hourly query with the same sensor-hours, and the PromQL
    # query with the same series.
    assert rows["bucket"] == rows["timeseries"] > 0
    assert promql["bucket"] == promql["timeseries"] > 0
    assert report["modes"]["timeseries"]["writes"]["ops_per_reading"] == 1.0
    assert report["server"]["version"]
    files = sorted(p.suffix for p in out.glob("bench-*"))
    markdown = next(out.glob("bench-*.md")).read_text()
    assert "| | bucket | timeseries |" in markdown
    saved = json.loads(next(out.glob("bench-*.json")).read_text())
    assert saved["modes"].keys() == report["modes"].keys()
    assert files in ([".json", ".md"], [".json", ".md", ".png"])
    assert (".png" in files) == (report["chart"] is not None)


def test_bench_refused_credentials_exit_2_at_once(
    auth_broker: str, mongo_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = auth_broker.removeprefix("mqtt://")
    started = time.monotonic()
    code = main(
        [
            "bench",
            f"--mqtt-url=mqtt://{USER}:nope-{SECRET}@{host}",
            f"--mongodb-uri={mongo_uri}",
            f"--out={tmp_path}",
        ],
        env={},
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("loadgen: cannot connect")
    assert "refused" in err
    assert SECRET not in err
    assert time.monotonic() - started < 10


def test_bench_runs_a_sparkplug_fleet_through_the_preset(
    broker: Broker, mongo_uri: str, bench_db: str, tmp_path: Path
) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadgen",
            "bench",
            f"--mqtt-url={broker.url}",
            f"--mongodb-uri={mongo_uri}",
            f"--out={tmp_path / 'out'}",
            "--db",
            bench_db,
            "--modes",
            "bucket",
            "--format",
            "sparkplug",
            "--preset",
            "few-sensors",
            "--count",
            "200",
            "--query-runs",
            "1",
            "--latency-samples",
            "5",
            "--daemon-arg=--flush-interval=0.2",
            "--wait-timeout",
            "40",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["workload"]["format"] == "sparkplug"
    figures = report["modes"]["bucket"]
    assert figures["published"] == figures["written"] == 200
    assert figures["rejected"] == 0
    assert figures["verify"]["ok"], figures["verify"]
    assert figures["latency_ms"]["seen"] > 0

"""``ingest local`` as a user runs it: one process, its banner, a publish, Ctrl-C."""

from __future__ import annotations

import json
import queue
import shlex
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pymongo import MongoClient

from ingest import local_store
from ingest.cli import build_parser, local_settings, settings_from
from ingest.errors import ConfigError
from tests.support import devices
from tests.support.procs import ROOT, clean_env, free_port, metrics_of

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.support.procs import Broker


def free_pair() -> int:
    """A free port whose successor is free too (the timeseries daemon's metrics port)."""
    while True:
        port = free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


class Local:
    """``python -m ingest local ...`` with its stdout read line by line."""

    def __init__(
        self,
        tmp_path: Path,
        *argv: str,
        default_mqtt_port: int | None = None,
        ports: dict[str, int] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.ports = ports or {
            "mqtt": free_port(),
            "store": free_port(),
            "api": free_port(),
            "metrics": free_pair(),
        }
        while self.ports["metrics"] + 1 in self.ports.values():
            self.ports["metrics"] = free_pair()
        self.stderr = tmp_path / f"local-{time.monotonic_ns()}.err"
        clean = clean_env()
        args = [
            "local",
            "--data-dir",
            str(tmp_path / "data"),
            "--store-port",
            str(self.ports["store"]),
            "--metrics-port",
            str(self.ports["metrics"]),
            "--api-port",
            str(self.ports["api"]),
            *argv,
        ]
        if default_mqtt_port is None:
            command = [
                sys.executable,
                "-m",
                "ingest",
                *args,
                "--mqtt-port",
                str(self.ports["mqtt"]),
            ]
        else:  # as on a machine whose mosquitto service holds the default port
            command = [
                sys.executable,
                "-c",
                (
                    f"import sys, ingest.cli as c; c.DEFAULT_MQTT_PORT = {default_mqtt_port}; "
                    f"sys.exit(c.main({args!r}))"
                ),
            ]
        with self.stderr.open("w") as err:
            self.process = subprocess.Popen(
                command,
                cwd=tmp_path,
                env=clean | (env or {}),
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        self.lines: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.out: list[str] = []

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def banner(self, timeout: float = 90) -> str:
        """Everything printed up to the last line of the banner."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                assert self.process.poll() is None, self.stderr.read_text()
                continue
            self.out.append(line)
            if "/readyz" in line and sum("/readyz" in x for x in self.out) == 2:
                return "".join(self.out)
        raise AssertionError(f"no banner:\n{''.join(self.out)}\n{self.stderr.read_text()}")

    def command(self, starts_with: str) -> list[str]:
        line = next(x for x in self.out if x.strip().startswith(starts_with))
        return shlex.split(line)

    def children(self) -> list[int]:
        """Process ids whose parent is ``ingest local``."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == self.process.pid:
                    found.append(int(entry.name))
        return found

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.reader.join(timeout=10)
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.fixture
def local(tmp_path: Path) -> Iterator[list[Local]]:
    started: list[Local] = []
    yield started
    for proc in started:
        proc.kill()


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_for(check: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.2)
    raise AssertionError("condition not met")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_one_command_runs_the_main_job_and_ctrl_c_stops_it(
    tmp_path: Path, local: list[Local]
) -> None:
    first = Local(tmp_path)
    local.append(first)
    banner = first.banner()
    assert "NOT MongoDB" in banner
    publish = first.command("mosquitto_pub")
    subprocess.run(publish, check=True, timeout=30)
    uri = f"mongodb://127.0.0.1:{first.ports['store']}/?directConnection=true"
    with MongoClient[dict[str, Any]](uri) as client:
        bucket = wait_for(lambda: client.iot.buckets.find_one({"sensor_id": "demo-1"}))
        reading = wait_for(lambda: client.iot.readings.find_one({"meta.sensor_id": "demo-1"}))
    assert bucket["readings"][0]["temp"] == 21.5
    assert reading["temp"] == 21.5
    # The banner's own commands work as printed.
    shown = subprocess.run(
        first.command(sys.executable), capture_output=True, text=True, check=True, timeout=30
    )
    assert "demo-1" in shown.stdout
    for port, mode in (
        (first.ports["metrics"], "bucket"),
        (first.ports["metrics"] + 1, "timeseries"),
    ):
        assert metrics_of(port)[f'ingest_readings_written_total{{mode="{mode}"}}'] == 1

    # A second run on the same data dir is refused (two processes on one store file).
    again = run_local(
        tmp_path,
        "--mqtt-port",
        str(free_port()),
        "--store-port",
        str(free_port()),
        "--metrics-port",
        str(free_port()),
    )
    assert "--data-dir" in last_line(again, 1)

    children = first.children()
    assert len(children) == 4  # mosquitto, two daemons and the API
    first.process.send_signal(signal.SIGINT)
    assert first.process.wait(timeout=60) == 0
    assert not [pid for pid in children if alive(pid)]
    assert not [name for name, port in first.ports.items() if listening(port)]
    assert "Traceback" not in first.stderr.read_text()

    # The data dir keeps the data: a second start finds the reading. Started at once on
    # the same ports, whose closed connections linger (TIME_WAIT): they are free.
    second = Local(tmp_path, ports=first.ports)
    local.append(second)
    second.banner()
    uri = f"mongodb://127.0.0.1:{second.ports['store']}/?directConnection=true"
    with MongoClient[dict[str, Any]](uri) as client:
        assert client.iot.readings.count_documents({"meta.sensor_id": "demo-1"}) == 1
    second.process.send_signal(signal.SIGTERM)
    assert second.process.wait(timeout=60) == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_timeseries_keeps_up_its_files_are_private_and_ctrl_c_mid_write_exits_0(
    tmp_path: Path, local: list[Local]
) -> None:
    """The embedded store takes a time-series burst without slowing with every reading
    stored, keeps its data to its user, and Ctrl-C while a burst is being written ends
    with status 0 and no traceback, whatever the store was doing."""
    proc = Local(tmp_path, "--mode", "timeseries")
    local.append(proc)
    wait_banner_one_mode(proc)
    data = tmp_path / "data"
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    for path in (
        data / ".lock",
        data / "store.sqlite",
        data / "mosquitto",
        data / "mosquitto" / "mosquitto.conf",
    ):
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path

    port = proc.ports["metrics"] + 1
    written = 'ingest_readings_written_total{mode="timeseries"}'
    burst = [
        sys.executable,
        "-m",
        "loadgen",
        "publish",
        "--mqtt-url",
        f"mqtt://127.0.0.1:{proc.ports['mqtt']}",
        "--sensors",
        "20",
        "--rate",
        "0",
        "--count",
        "2000",
        "--qos",
        "1",
    ]
    subprocess.run(burst, check=True, timeout=60, cwd=ROOT, capture_output=True)
    started = time.monotonic()
    wait_for(lambda: metrics_of(port)[written] >= 2000, timeout=120)
    # Each insert no longer reads the whole collection: 2,000 readings take seconds (over
    # 100 s when every insert decodes every document stored before it).
    assert time.monotonic() - started < 40

    subprocess.run(burst, check=True, timeout=60, cwd=ROOT, capture_output=True)
    wait_for(lambda: metrics_of(port)[written] > 2000, timeout=60)
    proc.process.send_signal(signal.SIGINT)
    assert proc.process.wait(timeout=90) == 0
    err = proc.stderr.read_text()
    assert "Traceback" not in err
    assert "Exception" not in err
    assert err.count("did not close cleanly") <= 1


async def test_a_store_that_fails_to_close_is_one_warning_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """mongoeco raises an exception group when its file is locked by a write in flight."""

    class Store:
        async def close(self) -> None:
            raise ExceptionGroup(
                "proxy cleanup failed", [sqlite3.OperationalError("database is locked")]
            )

    await local_store.close(Store())
    [record] = caplog.records
    assert record.levelname == "WARNING"
    assert "(OperationalError: database is locked)" in record.getMessage()
    assert record.exc_info is None


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


def test_a_preset_goes_to_every_daemon_and_the_banner_names_the_api_that_reads_it(
    tmp_path: Path, local: list[Local]
) -> None:
    """The user's issue: ``ingest local --preset zigbee2mqtt``, a message as Zigbee2MQTT
    publishes it, the reading through the API address the banner prints."""
    proc = Local(tmp_path, "--preset", "zigbee2mqtt")
    local.append(proc)
    banner = proc.banner()
    assert "--preset zigbee2mqtt; topics zigbee2mqtt/" in banner
    api = proc.command("api")[1]
    assert api == f"http://127.0.0.1:{proc.ports['api']}/"
    message = next(
        m for m in devices.load("zigbee2mqtt", time.time()) if m.topic == "zigbee2mqtt/Living Room"
    )
    subprocess.run(
        [
            "mosquitto_pub",
            "-p",
            str(proc.ports["mqtt"]),
            "-q",
            "1",
            "-t",
            message.topic,
            "-m",
            message.payload.decode(),
        ],
        check=True,
        timeout=30,
    )
    url = f"{api}api/readings?sensor={urllib.parse.quote(message.topic.split('/')[1])}"
    answer = wait_for(lambda: get_json(url)["readings"])
    assert [r["values"] for r in answer] == [message.readings[0].values]
    # The API got it too (its [page] orders the page's charts), and no Grafana address:
    # ingest local runs no Grafana, so the page links to none.
    info = get_json(f"{api}api/info")
    assert info["grafana_dashboard"] is None
    assert "linkquality" in info["measurement_order"]["last"]
    # The timeseries daemon got the preset too (the API serves the bucket layout).
    uri = f"mongodb://127.0.0.1:{proc.ports['store']}/?directConnection=true"
    with MongoClient[dict[str, Any]](uri) as client:
        doc = wait_for(lambda: client.iot.readings.find_one({"meta.sensor_id": "Living Room"}))
    assert doc["temperature"] == 21.7
    assert "update_state" not in doc
    proc.process.send_signal(signal.SIGINT)
    assert proc.process.wait(timeout=60) == 0
    assert not listening(proc.ports["api"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_parts_get_only_the_settings_ingest_local_decides(
    tmp_path: Path, local: list[Local]
) -> None:
    """Daemon variables in the shell (a deployment's, say) reach no part: each would break
    it (one collection name for both layouts, a URI file over the embedded store, both
    modes in one shared group, a dry run). INGEST_TOPIC, a setting of ingest local, is a
    list as for ingest run."""
    proc = Local(
        tmp_path,
        env={
            "INGEST_TOPIC": "lab/#, plant/#",
            "INGEST_COLLECTION": "x",
            "INGEST_MONGODB_URI_FILE": str(tmp_path / "absent"),
            "INGEST_SHARED_GROUP": "g",
            "INGEST_DRY_RUN": "1",
            "INGEST_CLIENT_ID": "mine",
        },
    )
    local.append(proc)
    assert " -t lab/demo-1 " in proc.banner()  # the first filter; plant/# is used below
    assert (
        "ignored, as settings of no part: INGEST_CLIENT_ID, INGEST_COLLECTION, "
        "INGEST_DRY_RUN, INGEST_MONGODB_URI_FILE, INGEST_SHARED_GROUP (" in proc.stderr.read_text()
    )
    children = proc.children()
    assert len(children) == 4
    parts = [pid for pid in children if b"ingest" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(parts) == 3  # both daemons and the API; the fourth child is mosquitto
    for pid in children:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        # INGEST_NO_EXTENSIONS (the suite's run without accelerators) holds for every part.
        given = [
            v.split(b"=")[0]
            for v in environ
            if v.startswith(b"INGEST_") and not v.startswith(b"INGEST_NO_EXTENSIONS=")
        ]
        # The URI only, and there rather than on the command line, where ps shows it.
        assert given == ([b"INGEST_MONGODB_URI"] if pid in parts else []), pid
        assert b"mongodb://" not in Path(f"/proc/{pid}/cmdline").read_bytes(), pid
    subprocess.run(
        [
            "mosquitto_pub",
            "-p",
            str(proc.ports["mqtt"]),
            "-q",
            "1",
            "-t",
            "plant/demo-2",
            "-m",
            '{"temp": 21.5}',
        ],
        check=True,
        timeout=30,
    )
    uri = f"mongodb://127.0.0.1:{proc.ports['store']}/?directConnection=true"
    with MongoClient[dict[str, Any]](uri) as client:
        wait_for(lambda: client.iot.buckets.find_one({"sensor_id": "demo-2"}))
        wait_for(lambda: client.iot.readings.find_one({"meta.sensor_id": "demo-2"}))
        assert "x" not in client.iot.list_collection_names()
    url = f"http://127.0.0.1:{proc.ports['api']}/api/readings?sensor=demo-2"
    assert [r["values"] for r in get_json(url)["readings"]] == [{"temp": 21.5}]
    proc.process.send_signal(signal.SIGINT)
    assert proc.process.wait(timeout=60) == 0


@pytest.mark.process
@pytest.mark.parametrize(
    ("argv", "env", "error"),
    [
        (["--preset", "nope"], {}, "--preset nope: unknown preset (known: "),
        ([], {"INGEST_PRESET": "zigbee2mqtt,nope"}, "--preset nope: unknown preset"),
        (["--mapping", "missing.toml"], {}, "--mapping missing.toml: cannot read"),
        (["--mapping", "bad.toml"], {}, "--mapping bad.toml: not valid TOML"),
    ],
    ids=["flag", "env", "no-file", "bad-file"],
)
def test_bad_rules_are_one_line_and_nothing_starts(
    tmp_path: Path, argv: list[str], env: dict[str, str], error: str
) -> None:
    (tmp_path / "bad.toml").write_text("[[rule]\n")
    result = run_local(tmp_path, *argv, env=env, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(f"ingest: error: {error}")
    assert result.stderr.count("\n") == 1
    assert not (tmp_path / "data").exists()  # not even the data dir's lock


def test_a_preset_flag_replaces_the_variable_as_in_ingest_run(tmp_path: Path) -> None:
    env = {"INGEST_PRESET": "nope", "INGEST_MAPPING": str(tmp_path / "rules.toml")}
    (tmp_path / "rules.toml").write_text(
        '[[rule]]\nname = "mine"\ntopic = "lab/{sensor_id}"\nformat = "json"\n'
    )
    args = build_parser(env).parse_args(["local", "--preset", "tasmota"])
    settings = local_settings(args, env)
    assert settings.presets == ("tasmota",)
    assert settings.mapping == str(tmp_path / "rules.toml")
    assert settings.topics[0] == "lab/+"  # the rules' topics, not sensors/#


@pytest.mark.parametrize(
    ("env", "argv", "expected"),
    [
        ({"INGEST_TOPIC": "a/#"}, [], ("a/#",)),
        ({"INGEST_TOPIC": " a/# , b/+/x "}, [], ("a/#", "b/+/x")),
        ({"INGEST_TOPIC": "a,b"}, ["--topic", "x", "--topic", "y/#"], ("x", "y/#")),
        ({"INGEST_PRESET": "tasmota", "INGEST_TOPIC": "a/#,b/#"}, [], ("a/#", "b/#")),
        ({"INGEST_PRESET": "tasmota"}, [], "the rules' filters"),
        ({}, [], ("sensors/#",)),
    ],
    ids=["one", "list", "flags-win", "variable-over-rules", "rules", "default"],
)
def test_topics_are_read_as_ingest_run_reads_them(
    env: dict[str, str], argv: list[str], expected: object
) -> None:
    """``INGEST_TOPIC`` is a comma-separated list and ``--topic`` repeats, as for run."""
    run = settings_from(build_parser(env).parse_args(["run", *argv]), env)
    local = local_settings(build_parser(env).parse_args(["local", *argv]), env)
    assert local.topics == run.topics
    if expected == "the rules' filters":
        assert "tele/+/SENSOR" in local.topics
    else:
        assert local.topics == expected


def test_an_empty_topic_in_the_variable_is_refused_as_by_ingest_run() -> None:
    env = {"INGEST_TOPIC": "a/#,,b/#"}
    with pytest.raises(ConfigError, match=r"^--topic: at least one non-empty"):
        local_settings(build_parser(env).parse_args(["local"]), env)


@pytest.mark.process
def test_a_taken_api_port_names_the_flag(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        line = last_line(
            run_local(
                tmp_path,
                "--api-port",
                str(port),
                "--mqtt-port",
                str(free_port()),
                "--store-port",
                str(free_port()),
                "--metrics-port",
                str(free_pair()),
            ),
            1,
        )
    assert line.startswith(f"ingest local: error: --api-port: 127.0.0.1:{port} is already in use")
    line = last_line(run_local(tmp_path, "--api-port", "9109"), 2)
    assert line == (
        "ingest: error: --api-port: 9109 is also the port of the timeseries "
        "daemon's metrics (--metrics-port); choose another"
    )


def test_the_same_flags_point_it_at_a_real_store_and_broker(
    tmp_path: Path, local: list[Local], broker: Broker, mongo_uri: str, db_name: str
) -> None:
    """--mongodb-uri and --mqtt-url: nothing embedded starts, the daemons use those."""
    proc = Local(
        tmp_path,
        "--mode",
        "timeseries",
        "--mongodb-uri",
        mongo_uri,
        "--mqtt-url",
        broker.url,
        "--db",
        db_name,
        "--topic",
        f"{db_name}/#",
    )
    local.append(proc)
    out = wait_banner_one_mode(proc)
    assert "NOT MongoDB" not in out
    assert not listening(proc.ports["store"])
    assert not listening(proc.ports["mqtt"])
    subprocess.run(proc.command("mosquitto_pub"), check=True, timeout=30)
    with MongoClient[dict[str, Any]](mongo_uri) as client:
        wait_for(lambda: client[db_name].readings.find_one({"meta.sensor_id": "demo-1"}))
        client.drop_database(db_name)
    proc.process.send_signal(signal.SIGINT)
    assert proc.process.wait(timeout=60) == 0


def test_a_broker_already_on_the_default_port_is_used_and_left_running(
    tmp_path: Path, local: list[Local], broker: Broker
) -> None:
    """A distribution's mosquitto service holds 1883: ingest local uses it, says so, and
    leaves it running at Ctrl-C."""
    proc = Local(tmp_path, "--mode", "bucket", default_mqtt_port=broker.port)
    local.append(proc)
    out = wait_banner_one_mode(proc)
    assert f"mqtt://127.0.0.1:{broker.port}" in out
    assert "already running" in out
    assert "using it" in proc.stderr.read_text()
    subprocess.run(proc.command("mosquitto_pub"), check=True, timeout=30)
    uri = f"mongodb://127.0.0.1:{proc.ports['store']}/?directConnection=true"
    with MongoClient[dict[str, Any]](uri) as client:
        wait_for(lambda: client.iot.buckets.find_one({"sensor_id": "demo-1"}))
    proc.process.send_signal(signal.SIGINT)
    assert proc.process.wait(timeout=60) == 0
    assert listening(broker.port)


def wait_banner_one_mode(proc: Local, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = proc.lines.get(timeout=0.2)
        except queue.Empty:
            assert proc.process.poll() is None, proc.stderr.read_text()
            continue
        proc.out.append(line)
        if "/readyz" in line:
            return "".join(proc.out)
    raise AssertionError("no banner")


def run_local(
    tmp_path: Path, *argv: str, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    clean = clean_env()
    return subprocess.run(
        [sys.executable, "-m", "ingest", "local", "--data-dir", str(tmp_path / "data"), *argv],
        cwd=cwd,
        env=clean | (env or {}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def last_line(result: subprocess.CompletedProcess[str], status: int) -> str:
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.process
def test_without_mosquitto_it_says_how_to_install_it(tmp_path: Path) -> None:
    line = last_line(
        run_local(
            tmp_path,
            "--mosquitto",
            str(tmp_path / "no-mosquitto"),
            "--mqtt-port",
            str(free_port()),
            "--store-port",
            str(free_port()),
        ),
        1,
    )
    assert line.startswith("ingest local: error: --mosquitto")
    assert "apt-get install mosquitto" in line


@pytest.mark.process
def test_a_taken_store_port_names_the_flag(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        line = last_line(
            run_local(tmp_path, "--store-port", str(port), "--mqtt-port", str(free_port())), 1
        )
    assert "--store-port" in line
    assert "--mongodb-uri" in line


@pytest.mark.process
def test_a_bad_broker_url_is_a_configuration_error(tmp_path: Path) -> None:
    line = last_line(run_local(tmp_path, "--mqtt-url", "127.0.0.1:1883"), 2)
    assert "mqtt://host:port" in line


@pytest.mark.process
def test_without_the_local_extra_it_says_what_to_install(tmp_path: Path) -> None:
    """As on a machine where mongoeco is not installed (an import that fails)."""
    code = (
        "import sys; sys.modules['mongoeco'] = None; from ingest.cli import main; "
        f"sys.exit(main(['local', '--data-dir', {str(tmp_path)!r}, "
        f"'--mqtt-port', '{free_port()}', '--metrics-port', '{free_port()}'], {{}}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    line = last_line(result, 1)
    assert "pip install 'iot-ingest[local]'" in line
    assert "pip install -e '.[local]'" in line
    assert "--mongodb-uri" in line

"""Start-up failures as a user sees them: the process's last stderr line and exit status.

Configuration problems exit with 2, the environment (a port, a broker, a store, Python
itself) with 1; either way one line naming the flag or address and what to do.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest

from tests.support.procs import (
    ROOT,
    Broker,
    clean_env,
    free_port,
    http_status,
    password_broker,
)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


def ingest(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingest", *argv],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def failure_line(result: subprocess.CompletedProcess[str], status: int) -> str:
    """The one line a failed start ends with; no traceback before it."""
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines, "nothing on stderr"
    assert lines[-1].startswith("ingest: error: "), lines[-1]
    return lines[-1]


# --------------------------------------------------------------------------- configuration


@pytest.mark.process
def test_a_broker_url_without_scheme_says_how_to_write_it() -> None:
    line = failure_line(ingest("run", "--mqtt-url", "127.0.0.1:1883"), 2)
    assert "--mqtt-url" in line
    assert "mqtt://host:port" in line


@pytest.fixture
def pem_files(tmp_path: Path) -> dict[str, Path]:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    return {"garbage": garbage, "missing": tmp_path / "missing.pem"}


@pytest.mark.process
@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--mqtt-ca-file", "{missing}"], "--mqtt-ca-file"),
        (["--mqtt-ca-file", "{garbage}"], "--mqtt-ca-file"),
        (["--mqtt-cert-file", "{garbage}"], "--mqtt-cert-file"),
        (["--mqtt-cert-file", "{garbage}", "--mqtt-key-file", "{garbage}"], "--mqtt-key-file"),
        (["--mqtt-key-file", "{garbage}"], "--mqtt-key-file"),
    ],
    ids=["missing-ca", "garbage-ca", "garbage-cert", "garbage-cert-and-key", "key-alone"],
)
def test_bad_tls_files_are_refused_before_start(
    pem_files: dict[str, Path], flags: list[str], named: str
) -> None:
    argv = [flag.format(**pem_files) for flag in flags]
    line = failure_line(ingest("run", "--mqtt-url", "mqtts://broker.invalid", *argv), 2)
    assert named in line


@pytest.mark.process
def test_tls_files_with_a_plain_url_are_refused(pem_files: dict[str, Path]) -> None:
    line = failure_line(
        ingest(
            "run", "--mqtt-url", "mqtt://127.0.0.1", "--mqtt-ca-file", str(pem_files["garbage"])
        ),
        2,
    )
    assert "--mqtt-ca-file" in line
    assert "mqtts://" in line


@pytest.mark.process
def test_help_shows_each_default_once() -> None:
    result = ingest("run", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "(default: None)" not in text
    assert text.count("sensors/#") == 1
    assert "(default: 10000)" in text  # the flags with a default still show it


# --------------------------------------------------------------------------- environment


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.process
def test_metrics_port_in_use(taken_port: int) -> None:
    line = failure_line(
        ingest(
            "run",
            "--dry-run",
            "--mqtt-url",
            "mqtt://127.0.0.1:1",
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(taken_port),
        ),
        1,
    )
    assert "--metrics-port" in line
    assert f"127.0.0.1:{taken_port}" in line
    assert "in use" in line


@pytest.mark.process
def test_api_port_in_use(taken_port: int) -> None:
    line = failure_line(
        ingest(
            "api",
            "--mongodb-uri",
            "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200",
            "--api-host",
            "127.0.0.1",
            "--api-port",
            str(taken_port),
        ),
        1,
    )
    assert "--api-port" in line
    assert f"127.0.0.1:{taken_port}" in line


def test_the_two_modes_default_to_distinct_metrics_ports() -> None:
    """Two daemons on one host, as the docs show them, do not collide."""
    from ingest.cli import build_parser, settings_from  # noqa: PLC0415

    ports = {
        mode: settings_from(build_parser({}).parse_args(["run", "--mode", mode]), {}).metrics_port
        for mode in ("bucket", "timeseries")
    }
    assert ports == {"bucket": 9108, "timeseries": 9109}


@pytest.mark.process
def test_init_db_with_mongodb_unreachable() -> None:
    closed = free_port()
    uri = f"mongodb://127.0.0.1:{closed}/?serverSelectionTimeoutMS=500"
    line = failure_line(ingest("init-db", "--mongodb-uri", uri), 1)
    assert "--mongodb-uri" in line
    assert f"127.0.0.1:{closed}" in line
    assert "Topology Description" not in line


def start_daemon(tmp_path: Path, *argv: str) -> tuple[subprocess.Popen[str], Path, int]:
    port = free_port()
    log = tmp_path / "daemon.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ingest",
                "run",
                "--metrics-host",
                "127.0.0.1",
                "--metrics-port",
                str(port),
                *argv,
            ],
            cwd=ROOT,
            env=clean_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    return proc, log, port


def wait_for_text(proc: subprocess.Popen[str], log: Path, text: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = log.read_text()
        if text in content:
            return content
        assert proc.poll() is None, f"daemon exited {proc.returncode}:\n{content}"
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not logged:\n{log.read_text()}")


def readyz(port: int) -> str:
    import urllib.error  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return str(resp.read().decode())
    except urllib.error.HTTPError as exc:
        return str(exc.read().decode())


def stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_run_says_at_once_that_it_waits_for_mongodb(tmp_path: Path, broker: Broker) -> None:
    """The first line about MongoDB comes within seconds, not after the driver's 30 s, and
    /readyz blames MongoDB, not the broker (which is fine and not contacted yet)."""
    closed = free_port()
    proc, log, port = start_daemon(
        tmp_path, "--mongodb-uri", f"mongodb://127.0.0.1:{closed}", "--mqtt-url", broker.url
    )
    try:
        content = wait_for_text(proc, log, "waiting for MongoDB at", timeout=25)
        assert f"127.0.0.1:{closed}" in content
        assert "Traceback" not in content
        status = readyz(port)
        assert status.startswith("mongodb unreachable"), status
        assert "mqtt disconnected" not in status
        assert http_status(port, "/readyz") == 503
    finally:
        assert stop(proc) == 0


@pytest.mark.process
def test_a_broker_never_reached_is_not_a_lost_connection(tmp_path: Path) -> None:
    closed = free_port()
    proc, log, _ = start_daemon(tmp_path, "--dry-run", "--mqtt-url", f"mqtt://127.0.0.1:{closed}")
    try:
        content = wait_for_text(proc, log, "cannot reach the MQTT broker at")
        assert f"127.0.0.1:{closed}" in content
        assert "lost" not in content
        assert "waiting for it" in content
    finally:
        assert stop(proc) == 0


@pytest.mark.process
def test_a_broker_refusing_the_credentials_stops_the_start(tmp_path: Path) -> None:
    broker = password_broker(tmp_path, "alice", "right")
    broker.start()
    try:
        result = ingest(
            "run",
            "--dry-run",
            "--metrics-port",
            "0",
            "--mqtt-url",
            f"mqtt://alice:wrong@127.0.0.1:{broker.port}",
            timeout=60,
        )
    finally:
        broker.stop()
    line = failure_line(result, 1)
    assert "refused" in line
    assert f"127.0.0.1:{broker.port}" in line
    assert "--mqtt-url" in line
    assert "wrong" not in result.stderr  # the password never appears


# --------------------------------------------------------------------------- Python itself


@pytest.mark.process
def test_an_older_python_gets_one_line() -> None:
    """As the package sees an older interpreter (simulated: any machine can run this)."""
    code = "import sys; sys.version_info = (3, 11, 2, 'final', 0); import ingest.cli"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "needs Python 3.13" in result.stderr
    assert "3.11" in result.stderr


OLD_PYTHONS = [p for p in (shutil.which(f"python3.{minor}") for minor in (11, 12)) if p]


@pytest.mark.process
@pytest.mark.skipif(not OLD_PYTHONS, reason="no python3.11 or python3.12 on PATH")
@pytest.mark.parametrize("package", ["ingest", "loadgen"])
def test_a_real_older_python_gets_one_line(package: str) -> None:
    result = subprocess.run(
        [OLD_PYTHONS[0], "-m", package, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert "SyntaxError" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "needs Python 3.13" in result.stderr


@pytest.mark.process
@pytest.mark.parametrize(
    "argv",
    [
        ["ingest", "run"],
        ["ingest", "init-db"],
        ["ingest", "local"],
        ["loadgen", "publish"],
        ["loadgen", "verify"],
        ["loadgen", "bench"],
    ],
)
def test_no_help_says_default_none(argv: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", argv[0], argv[1], "--help"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert "(default: None)" not in " ".join(result.stdout.split())


async def test_a_mongodb_ping_without_answer_says_so(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not ``MongoDB ping failed: TimeoutError:`` with nothing after it."""
    import asyncio  # noqa: PLC0415

    from ingest.metrics import Health, Metrics  # noqa: PLC0415
    from ingest.pipeline import app  # noqa: PLC0415

    class Silent:
        async def command(self, _name: str) -> None:
            await asyncio.sleep(3600)

    class Client:
        admin = Silent()

    monkeypatch.setattr(app, "PING_INTERVAL", 0.05)
    health = Health(mongodb_ok=True)
    watch = asyncio.create_task(app._watch_mongodb(Client(), health, Metrics("bucket")))  # type: ignore[arg-type]
    deadline = time.monotonic() + 30
    while health.mongodb_ok and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    watch.cancel()
    assert not health.mongodb_ok
    assert "MongoDB ping failed: no answer within" in caplog.text
    assert "TimeoutError" not in caplog.text


def test_a_receive_maximum_too_small_for_the_batches_is_named_at_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from ingest.config import Settings  # noqa: PLC0415
    from ingest.pipeline import app  # noqa: PLC0415

    app.warn_about(Settings())  # the defaults keep the rule
    assert not caplog.records
    app.warn_about(Settings(batch_size=10_000, max_inflight_messages=10_000))
    assert "--max-inflight-messages 10000 is below" in caplog.text
    assert "raise it to 30000" in caplog.text
    caplog.clear()
    app.warn_about(Settings(batch_size=10_000, max_inflight_messages=10_000, qos=0))
    assert not caplog.records  # no Receive Maximum at QoS 0

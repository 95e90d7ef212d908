"""Real processes for the tests: a mosquitto broker, the emulator, the ingest daemon."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ingest import accel
from loadgen.daemons import parse_metrics

ROOT = Path(__file__).resolve().parents[2]


def clean_env() -> dict[str, str]:
    """Our environment without the INGEST_* settings, for a child process under test; it
    keeps INGEST_NO_EXTENSIONS, so a suite run without the accelerators runs the children
    without them too."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INGEST_")}
    return env | accel.inherited(os.environ)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} after {timeout}s")


def password_broker(directory: Path, user: str, password: str, extra: str = "") -> Broker:
    """A Broker (not started) whose password file knows ``user`` with ``password``."""
    passwd = directory / "passwd"
    tool = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
    subprocess.run([tool, "-c", "-b", str(passwd), user, password], check=True, capture_output=True)
    passwd.chmod(0o600)
    return Broker(directory, extra=f"{extra}password_file {passwd}\n")


@dataclass
class Broker:
    """A mosquitto of our own on a free port, restartable with its persistence."""

    directory: Path
    port: int = field(default_factory=free_port)
    persistence: bool = False
    extra: str = ""
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        conf = self.directory / "mosquitto.conf"
        conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            # Unlimited queue for offline/slow persistent sessions: the default (1000)
            # drops QoS 1 messages beyond it.
            "max_queued_messages 1000000\n"
            f"persistence {'true' if self.persistence else 'false'}\n"
            f"persistence_location {self.directory}/\n"
            f"log_dest file {self.directory}/mosquitto.log\n"
            # As root, mosquitto would switch to its own user, who cannot write here.
            "user root\n"
            f"{self.extra}"
        )
        self.process = subprocess.Popen([binary, "-c", str(conf)], stderr=subprocess.DEVNULL)
        wait_port(self.port)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()


def start_emulator(*, loads: bool = False) -> tuple[subprocess.Popen[str], str]:
    """The emulator (tests/support/mongo_emulator.py) and its URI; ``loads``: it also
    takes :func:`emulator_load`'s commands."""
    script = ROOT / "tests" / "support" / "mongo_emulator.py"
    proc = subprocess.Popen(
        [sys.executable, str(script), *(["--loads"] if loads else [])],
        stdin=subprocess.PIPE if loads else None,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    uri = proc.stdout.readline().strip()
    if not uri.startswith("mongodb://"):
        proc.kill()
        raise RuntimeError("the MongoDB emulator did not start (is mongoeco[wire] installed?)")
    return proc, uri


def stop_emulator(proc: subprocess.Popen[str]) -> None:
    """Stop an emulator of :func:`start_emulator` and close its pipes."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # busy in one long command: its loop takes no signal
        proc.kill()
        proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


def emulator_load(proc: subprocess.Popen[str], db: str, collection: str, path: Path) -> int:
    """Have an emulator started with ``loads=True`` insert a file of BSON documents in its
    own process (far faster than its wire ``insert``); the number inserted."""
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(f"load {db} {collection} {path}\n")
    proc.stdin.flush()
    answer = proc.stdout.readline().strip()
    if not answer.startswith("loaded "):
        raise RuntimeError(f"the emulator did not load {path}: {answer or 'it exited'}")
    return int(answer.split()[1])


def metrics_of(port: int) -> dict[str, float]:
    """Scrape a daemon: {'name{label="v"}': value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return parse_metrics(resp.read().decode())


def http_status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@dataclass
class Daemon:
    """``python -m ingest run`` as a real subprocess."""

    args: list[str]
    log: Path
    metrics_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)  # INGEST_* variables to set
    cwd: Path | None = None  # the source tree to run (``python -m ingest`` from there)

    def start(self, wait_ready: bool = True) -> Daemon:
        """Start the daemon (and wait until it is ready). The metrics port is one that was
        free a moment ago: if another test's process took it meanwhile, the daemon exits
        with its one line, and it is started again on another port (three tries)."""
        for attempt in range(3):
            logged = self.log.stat().st_size if self.log.exists() else 0
            self._spawn()
            if not wait_ready:
                return self
            try:
                self.wait_ready()
            except RuntimeError:
                taken = f"cannot listen on 127.0.0.1:{self.metrics_port} (Address already in use)"
                if attempt == 2 or taken.encode() not in self.log.read_bytes()[logged:]:
                    raise
                self.metrics_port = free_port()
            else:
                return self
        return self

    def _spawn(self) -> None:
        env = clean_env() | self.env
        cmd = [
            sys.executable,
            "-m",
            "ingest",
            "run",
            *self.args,
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(self.metrics_port),
        ]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.cwd or ROOT
            )

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.process.returncode}:\n{self.logs()}")
            try:
                if http_status(self.metrics_port, "/readyz") == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"daemon not ready after {timeout}s:\n{self.logs()}")

    def readyz(self) -> int:
        """The status of ``/readyz``; fails with the daemon's log when it cannot answer
        (exited, or not listening), so that such a failure says why."""
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"daemon exited with {self.process.returncode}:\n{self.logs()}")
        try:
            return http_status(self.metrics_port, "/readyz")
        except OSError as exc:
            raise AssertionError(f"daemon's /readyz: {exc}\n{self.logs()}") from exc

    def metrics(self) -> dict[str, float]:
        return metrics_of(self.metrics_port)

    def metric(self, name: str) -> float:
        return self.metrics().get(name, 0.0)

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def stop(self) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.signal(signal.SIGTERM)
        try:
            return self.wait()
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.wait()

    def logs(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


async def eventually(check: Any, timeout: float = 20.0, interval: float = 0.1) -> Any:
    """Await ``check()`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"condition not met after {timeout}s (last value: {last!r})")

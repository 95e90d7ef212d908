"""The ingest daemons ``loadgen bench`` measures: their /metrics counters, and spawning them.

A spawned daemon runs ``python -m ingest run`` in one mode with its own metrics port;
bench waits on ``/readyz`` before publishing and stops it with SIGTERM after. The
counters scraped from ``/metrics`` tell when every published reading was written.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

from prometheus_client.parser import text_string_to_metric_families

from ingest import accel

if TYPE_CHECKING:
    from loadgen.config import BenchSettings

READY_TIMEOUT = 30.0


class BenchError(RuntimeError):
    """The bench cannot run (a daemon does not start, MongoDB unreachable)."""


def scrape(url: str) -> dict[str, float]:
    """One /metrics scrape: ``{'name{label="v"}': value}``."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - the user's URL
            text = resp.read().decode()
    except OSError as exc:
        detail = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise BenchError(f"cannot scrape {url}: {detail}") from None
    return parse_metrics(text)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text as ``{'name{label="v",...}': value}``, labels sorted."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def counters(metrics: dict[str, float], mode: str) -> dict[str, float]:
    """The counters bench uses, for one mode."""
    rejected = sum(v for k, v in metrics.items() if k.startswith("ingest_readings_rejected_total"))
    return {
        "written": metrics.get(f'ingest_readings_written_total{{mode="{mode}"}}', 0.0),
        "rejected": rejected,
        "received": metrics.get("ingest_messages_received_total", 0.0),
        "write_ops": metrics.get(f'ingest_write_ops_total{{mode="{mode}"}}', 0.0),
        "write_requests": metrics.get(f'ingest_write_requests_total{{mode="{mode}"}}', 0.0),
    }


def free_port() -> int:
    """A free TCP port on the loopback interface for a daemon's metrics."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SpawnedDaemon:
    """``python -m ingest run`` in one mode, started and stopped by bench."""

    def __init__(
        self, settings: BenchSettings, mode: str, topic_prefix: str, run_id: str, port: int
    ) -> None:
        s = settings
        self.mode, self.port = mode, port
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.log = s.out / f"daemon-{mode}-{run_id}.log"
        self.cmd = [
            sys.executable,
            "-m",
            "ingest",
            "run",
            "--mode",
            mode,
            "--mongodb-uri",
            s.mongodb_uri,
            "--db",
            s.db,
            "--collection",
            s.collections[mode],
            "--topic",
            f"{topic_prefix}/#",
            "--client-id",
            f"bench-{mode}-{run_id}",
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(port),
            *s.daemon_args,
        ]
        # The URL may hold a password: the environment keeps it out of `ps`.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("INGEST_")}
        self.env |= accel.inherited(os.environ)
        self.env["INGEST_MQTT_URL"] = s.daemon_mqtt_url
        if s.daemon_password_file:
            self.env["INGEST_MQTT_PASSWORD_FILE"] = s.daemon_password_file
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the daemon and wait until /readyz answers 200.

        Its metrics port was free when it was chosen; if another process took it since,
        the daemon exits with its one line and starts again on another (three tries).
        """
        for attempt in range(3):
            logged = self.log.stat().st_size if self.log.exists() else 0
            try:
                self._start()
            except BenchError:
                taken = f"cannot listen on 127.0.0.1:{self.port} (Address already in use)"
                if attempt == 2 or taken.encode() not in self.log.read_bytes()[logged:]:
                    raise
                self._use_port(free_port())
            else:
                return

    def _use_port(self, port: int) -> None:
        self.cmd[self.cmd.index("--metrics-port") + 1] = str(port)
        self.port, self.url = port, f"http://127.0.0.1:{port}/metrics"

    def _start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(  # noqa: S603 - our own interpreter and flags
                self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BenchError(
                    f"the {self.mode} daemon exited with {self.process.returncode} (see {self.log})"
                )
            with contextlib.suppress(OSError):
                ready = f"http://127.0.0.1:{self.port}/readyz"
                with urllib.request.urlopen(ready, timeout=2) as resp:
                    if resp.status == 200:
                        return
            time.sleep(0.1)
        self.stop()
        raise BenchError(
            f"the {self.mode} daemon was not ready after {READY_TIMEOUT:.0f} s (see {self.log})"
        )

    def stop(self) -> None:
        """SIGTERM (drain and flush), then kill after 30 s."""
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_written(
    urls: dict[str, str],
    before: dict[str, dict[str, float]],
    published: int,
    timeout: float,
    topic: str,
) -> dict[str, float | None]:
    """Poll the daemons' metrics until written + rejected reach ``published``.

    Returns per mode the monotonic time of the first scrape that showed it (None on timeout).
    """
    done: dict[str, float | None] = dict.fromkeys(urls)
    deadline = time.monotonic() + timeout
    while any(v is None for v in done.values()) and time.monotonic() < deadline:
        for mode, url in urls.items():
            if done[mode] is not None:
                continue
            at = time.monotonic()
            now = counters(scrape(url), mode)
            if now["received"] == before[mode]["received"] and at > deadline - timeout + 10:
                raise BenchError(
                    f"the {mode} daemon received no message 10 s after the "
                    f"publish: may its MQTT user read {topic}/#? (In the compose "
                    "stack the sensor user may not: use --use-running.)"
                )
            if (
                now["written"]
                - before[mode]["written"]
                + now["rejected"]
                - before[mode]["rejected"]
            ) >= published:
                done[mode] = at
        time.sleep(0.05)
    return done

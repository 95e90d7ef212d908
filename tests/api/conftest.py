"""Fixtures of the read API's tests: ``ingest api`` as a real process."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest

from tests.support.procs import ROOT, clean_env, free_port, http_status

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path


@pytest.fixture
def api_process(tmp_path: Path, mongo_uri: str, db_name: str) -> Iterator[Callable[..., int]]:
    """Factory: start ``ingest api`` on a free port; returns the port once ready."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*extra: str) -> int:
        port = free_port()
        env = clean_env()
        log = (tmp_path / "api.log").open("ab")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ingest",
                "api",
                "--mongodb-uri",
                mongo_uri,
                "--db",
                db_name,
                "--api-host",
                "127.0.0.1",
                "--api-port",
                str(port),
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
        log.close()
        started.append(proc)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "api.log").read_text()
            try:
                if http_status(port, "/readyz") == 200:
                    return port
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError((tmp_path / "api.log").read_text())

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(timeout=10)

"""The page at ``/`` in a real headless Chromium, over readings published a moment before.

Real broker, real daemon, real ``ingest api`` process; Chromium (Debian's package,
installed by ``.ci/run``) loads the page through the DevTools protocol.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import orjson
import pytest

from tests.support.browser import Chromium, chromium_binary
from tests.support.procs import ROOT, eventually, free_port, http_status

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.support.procs import Daemon

pytestmark = pytest.mark.skipif(chromium_binary() is None,
                                reason="needs chromium (apt-get install chromium; .ci/run does)")

# Pixels of the first line's colour (#1f77b4) in the page's canvases: uPlot drew a curve.
CURVE_PIXELS = """
[...document.querySelectorAll('.card canvas')].map((c) => {
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 4) {
    const [r, g, b] = [d[i], d[i + 1], d[i + 2]];
    if (Math.abs(r - 31) < 30 && Math.abs(g - 119) < 30 && Math.abs(b - 180) < 30) n++;
  }
  return n;
})
"""


@pytest.fixture
def api_process(tmp_path: Path, mongo_uri: str, db_name: str
                ) -> Iterator[Callable[..., int]]:
    """Factory: start ``ingest api`` on a free port; returns the port once ready."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*extra: str) -> int:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("INGEST_")}
        log = (tmp_path / "api.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "ingest", "api", "--mongodb-uri", mongo_uri, "--db", db_name,
             "--api-host", "127.0.0.1", "--api-port", str(port),
             "--grafana-url", "http://grafana.example:3000", *extra],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
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


async def test_page_shows_sensors_published_a_moment_before(
        mode: str, daemon: Callable[..., Daemon], publish: Callable[..., Any],
        topic_root: str, db: Any, api_process: Callable[..., int], tmp_path: Path) -> None:
    daemon()
    collection = db.buckets if mode == "bucket" else db.readings
    now = time.time()
    messages: list[tuple[str, bytes | str]] = []
    for n, sensor in enumerate(("kitchen", "cellar")):
        readings = [{"ts": round(now - 60 * (40 - i), 3), "seq": i,
                     "temp": 20 + n * 3 + (i % 10) / 2, "hum": 40 + i % 7}
                    for i in range(40)]
        messages.append((f"{topic_root}/{sensor}", orjson.dumps(readings)))
    messages.append((f"{topic_root}/attic", b"{not json"))
    await publish(messages)

    async def stored() -> bool:
        if mode == "bucket":
            docs = await collection.find({}, {"count": 1}).to_list()
            readings = sum(d["count"] for d in docs)
        else:
            readings = await collection.count_documents({})
        return readings == 80 and await db.rejects.count_documents({}) >= 1
    await eventually(stored)

    port = api_process("--mode", mode)
    async with Chromium(tmp_path / "chromium") as browser:
        await browser.open(f"http://127.0.0.1:{port}/")
        await eventually(lambda: browser.evaluate("document.body.dataset.ready === '1'"))
        cards = await browser.evaluate(
            "[...document.querySelectorAll('.card')].map((c) => c.dataset.sensor)")
        reasons = await browser.evaluate(
            "document.querySelector('#reasons tbody').textContent")
        link = await browser.evaluate("document.getElementById('grafana').href")
        curves = await browser.evaluate(CURVE_PIXELS)
        await browser.screenshot(tmp_path / "page.png")
        errors = list(browser.errors)
    assert cards == ["cellar", "kitchen"]
    assert "invalid_json" in reasons
    assert link == "http://grafana.example:3000/d/iot-sensors/sensors"
    assert len(curves) == 2
    assert all(pixels > 50 for pixels in curves), curves
    assert errors == []
    assert (tmp_path / "page.png").stat().st_size > 10_000

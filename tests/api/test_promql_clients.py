"""Real Prometheus clients against ``ingest api``: ``promtool query range`` and ``query instant``.

A Telegraf host's line protocol goes through mosquitto into the real daemon (both
layouts); ``ingest api`` serves the collection; promtool (the Debian package's) queries
it. Every answer is compared with the reference evaluation over the readings as stored,
read back through ``/api/readings``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import aiohttp
import pytest

from ingest.model import Reading
from tests.api.promql_reference import Reference, close
from tests.support.procs import eventually

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.support.procs import Daemon

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
TOKEN = "promtool-token-0123456789abcdef"


async def stored(
    base: str, start: datetime, end: datetime, sensors: tuple[str, ...] = ("h1", "$evil")
) -> list[Reading]:
    """The stored readings of the window, through ``/api/readings`` (paged)."""
    out: list[Reading] = []
    cursor = None
    window = f"since={quote(start.isoformat())}&until={quote(end.isoformat())}"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        for sensor in sensors:
            while True:
                url = f"{base}/api/readings?sensor={quote(sensor)}&{window}&limit=1000"
                async with http.get(url + (f"&cursor={cursor}" if cursor else "")) as resp:
                    body = await resp.json()
                    assert resp.status == 200, body
                for r in body["readings"]:
                    ts = datetime.fromisoformat(r["ts"])
                    out.append(
                        Reading(
                            r["sensor_id"], ts, ts.timestamp(), r["values"], None, tags=r["tags"]
                        )
                    )
                cursor = body["next"]
                if cursor is None:
                    break
    return out


def promtool(*args: str) -> Any:
    """Run promtool and read its JSON output."""
    done = subprocess.run(
        ["promtool", "query", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_promtool_range_and_instant_queries(
    mode: str,
    daemon: Callable[..., Daemon],
    publish: Callable[..., Any],
    topic_root: str,
    api_process: Callable[..., int],
    tmp_path: Path,
) -> None:
    rules = tmp_path / "lp.toml"
    rules.write_text(
        f'[[rule]]\nname = "lp"\ntopic = "{topic_root}/{{sensor_id}}"\nformat = "influx"\n'
    )
    proc = daemon("--mapping", str(rules))
    start = datetime.fromtimestamp(int(time.time()) // 3600 * 3600 - 3 * 3600, UTC)

    def ns(seconds: int) -> int:
        return int(start.timestamp() + seconds) * 10**9

    h1 = [f"cpu,cpu=cpu0 usage_idle={90 - i % 7}.5 {ns(60 * i)}" for i in range(0, 170, 3)]
    h1 += [f"cpu,cpu=cpu1 usage_idle={80 + i % 5}.25 {ns(60 * i + 30)}" for i in range(0, 170, 4)]
    h1 += [f"net,interface=eth0 bytes_recv={1000 * i + (i % 3)}i {ns(60 * i)}" for i in range(170)]
    evil = [f"env value={20 + i % 9} {ns(120 * i)}" for i in range(80)]
    await publish([(f"{topic_root}/h1", "\n".join(h1)), (f"{topic_root}/$evil", "\n".join(evil))])
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 2)
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKEN + "\n")
    port = api_process("--mode", mode, "--api-tokens-file", str(tokens))
    base = f"http://127.0.0.1:{port}"
    end = start + timedelta(hours=3)
    ref = Reference(await stored(base, start, end))
    header = f"--header=Authorization: Bearer {TOKEN}"
    queries = [
        "cpu_usage_idle",
        'avg by (cpu) (avg_over_time(cpu_usage_idle{sensor_id="h1"}[10m]))',
        "max_over_time(cpu_usage_idle[30m])",
        'rate(net_bytes_recv{interface=~"eth.*"}[15m])',
        'env{sensor_id="$evil"} > 25',
        "sum without (cpu) (cpu_usage_idle) / 2",
    ]
    for query in queries:
        for step, first in (
            ("7m", start + timedelta(minutes=33)),
            ("1h", start + timedelta(hours=1)),
        ):
            step_s = 420 if step == "7m" else 3600
            got = promtool(
                "range",
                "-o",
                "json",
                header,
                f"--start={first.timestamp():.0f}",
                f"--end={end.timestamp():.0f}",
                f"--step={step}",
                base,
                query,
            )
            expected = ref.range(query, first, end, step_s)
            assert expected, query
            assert close(sorted(got, key=lambda s: sorted(s["metric"].items())), expected), (
                query,
                got,
                expected,
            )
    # promtool's instant query sends no header: this API refuses it, one without tokens serves it
    refused = subprocess.run(
        ["promtool", "query", "instant", base, "cpu_usage_idle"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode != 0
    assert "401" in refused.stderr or "token" in refused.stderr, refused.stderr
    open_port = api_process("--mode", mode)
    at = start + timedelta(hours=2, minutes=50)
    for query in queries:
        got = promtool(
            "instant",
            "-o",
            "json",
            f"--time={at.timestamp():.0f}",
            f"http://127.0.0.1:{open_port}",
            query,
        )
        wanted = ref.instant(query, at)["result"]
        assert close(sorted(got, key=lambda s: sorted(s["metric"].items())), wanted), (
            query,
            got,
            wanted,
        )

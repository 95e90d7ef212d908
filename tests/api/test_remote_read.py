"""Prometheus remote read: the distribution's Prometheus server reads sensor data from
``ingest api`` (``remote_read`` with ``read_recent: true`` and the API's bearer token),
answers its own queries over it, and fires an alerting rule on a sensor value.

Readings go through mosquitto into the real daemon (both layouts); the answers are
compared with the reference evaluation of the readings as stored (read back through
``/api/readings``). Reading times are at half seconds and queries at whole seconds, so
Prometheus 2's closed windows and this API's left-open ones hold the same readings.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import aiohttp
import cramjam
import pytest

from ingest.api.remote_read_pb import ReadRequest, ReadResponse
from tests.api.promql_reference import Reference, close
from tests.api.test_promql_clients import TOKEN, stored
from tests.support.procs import eventually, free_port

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.support.procs import Daemon

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="prometheus not installed"
)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[int], int]]:
    """Factory: a Prometheus server reading from ``ingest api`` on a port; returns its port."""
    started: list[subprocess.Popen[bytes]] = []

    def start(api_port: int) -> int:
        port = free_port()
        (tmp_path / "rules.yml").write_text(
            "groups:\n  - name: sensors\n    interval: 1s\n    rules:\n"
            "      - alert: HotSensor\n        expr: env_temp > 30\n"
            "        labels: {severity: page}\n"
        )
        (tmp_path / "prometheus.yml").write_text(
            json.dumps(
                {
                    "global": {"evaluation_interval": "1s"},
                    "rule_files": [str(tmp_path / "rules.yml")],
                    "remote_read": [
                        {
                            "url": f"http://127.0.0.1:{api_port}/api/v1/read",
                            "read_recent": True,
                            "authorization": {"type": "Bearer", "credentials": TOKEN},
                        }
                    ],
                }
            )
        )
        log = (tmp_path / "prometheus.log").open("ab")
        proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        started.append(proc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2):
                    return port
            except OSError:
                time.sleep(0.2)
        raise TimeoutError((tmp_path / "prometheus.log").read_text())

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(timeout=10)


async def prom_query(http: aiohttp.ClientSession, port: int, query: str, at: datetime) -> Any:
    params = urlencode({"query": query, "time": f"{at.timestamp():.0f}"})
    async with http.get(f"http://127.0.0.1:{port}/api/v1/query?{params}") as resp:
        body = await resp.json()
        assert resp.status == 200, body
        return body["data"]


async def test_prometheus_reads_queries_and_alerts_through_remote_read(
    mode: str,
    daemon: Callable[..., Daemon],
    publish: Callable[..., Any],
    topic_root: str,
    api_process: Callable[..., int],
    prometheus: Callable[[int], int],
    tmp_path: Path,
) -> None:
    rules = tmp_path / "lp.toml"
    rules.write_text(
        f'[[rule]]\nname = "lp"\ntopic = "{topic_root}/{{sensor_id}}"\nformat = "influx"\n'
    )
    proc = daemon("--mapping", str(rules))
    now = int(time.time())

    def ns(seconds_ago: int) -> int:
        return (now - seconds_ago) * 10**9 - 500_000_000  # at half seconds

    lines = {
        "h1": [f"env,room=a temp={20 + i % 3}.5 {ns(20 * i)}" for i in range(45)],
        "h2": [f"env,room=b temp={33 + i % 4} {ns(20 * i + 7)}" for i in range(45)],
        "h3": [f"env,room=a temp={18 + i % 5} {ns(30 * i + 3)}" for i in range(30)],
    }
    await publish([(f"{topic_root}/{s}", "\n".join(text)) for s, text in lines.items()])
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 3)
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKEN + "\n")
    api_port = api_process("--mode", mode, "--api-tokens-file", str(tokens))
    start = datetime.fromtimestamp(now - 3600, UTC)
    ref = Reference(
        await stored(
            f"http://127.0.0.1:{api_port}", start, start + timedelta(hours=2), ("h1", "h2", "h3")
        )
    )
    port = prometheus(api_port)
    at = datetime.fromtimestamp(now - 60, UTC)
    async with aiohttp.ClientSession() as http:
        for query in (
            'env_temp{room="a"}',
            "avg_over_time(env_temp[5m])",
            "sum by (room) (env_temp)",
            "max by (room) (max_over_time(env_temp[10m]))",
        ):
            got = await prom_query(http, port, query, at)
            expected = ref.instant(query, at)
            assert expected["result"], query
            got["result"].sort(key=lambda s: sorted(s["metric"].items()))
            assert close(got, expected), (query, got, expected)

        async def firing() -> list[dict[str, Any]]:
            async with http.get(f"http://127.0.0.1:{port}/api/v1/alerts") as resp:
                alerts = (await resp.json())["data"]["alerts"]
            return [a for a in alerts if a["state"] == "firing"]

        alerts = await eventually(firing, timeout=30)
        assert [(a["labels"]["alertname"], a["labels"]["sensor_id"]) for a in alerts] == [
            ("HotSensor", "h2")
        ]


async def test_remote_read_protocol_errors(api_process: Callable[..., int], tmp_path: Path) -> None:
    """What a broken client gets: plain-text errors, never a traceback; and the token."""
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKEN + "\n")
    port = api_process("--mode", "bucket", "--api-tokens-file", str(tokens))
    url = f"http://127.0.0.1:{port}/api/v1/read"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    good = ReadRequest()
    query = good.queries.add(start_timestamp_ms=0, end_timestamp_ms=1000)
    query.matchers.add(type=0, name="__name__", value="temp")
    body = bytes(cramjam.snappy.compress_raw(good.SerializeToString()))
    bad_regex = ReadRequest()
    bad_regex.queries.add(start_timestamp_ms=0, end_timestamp_ms=1).matchers.add(
        type=2, name="room", value="(a)\\1"
    )
    streamed = ReadRequest(accepted_response_types=[1])
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=body) as resp:
            assert resp.status == 401
        async with http.post(url, data=body, headers=auth) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Encoding"] == "snappy"
            answer = ReadResponse()
            answer.ParseFromString(bytes(cramjam.snappy.decompress_raw(await resp.read())))
            assert len(answer.results) == 1
            assert list(answer.results[0].timeseries) == []
        for payload, status, words in (
            (b"not snappy", 400, "snappy"),
            (bytes(cramjam.snappy.compress_raw(b"\xff\xff\xff")), 400, "ReadRequest"),
            (bytes(cramjam.snappy.compress_raw(bad_regex.SerializeToString())), 400, "RE2"),
            (bytes(cramjam.snappy.compress_raw(streamed.SerializeToString())), 400, "SAMPLES"),
        ):
            async with http.post(url, data=payload, headers=auth) as resp:
                text = await resp.text()
                assert resp.status == status, text
                assert words in text, text
    await asyncio.sleep(0)

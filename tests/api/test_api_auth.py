"""Who may read: tokens, the page's login, TLS and the per-caller bound, through a real
``ingest api`` process.

Each test starts the API as a subprocess (tokens passed by file, never on the command
line) over readings stored by the real bucket writer, and talks to it over HTTP(S).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

from ingest.model import Reading
from ingest.store.schema import Schema
from ingest.store.writers.bucket import BucketWriter
from tests.support.procs import ROOT, clean_env, free_port
from tests.support.proxy import Proxy
from tests.support.tls import self_signed

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

# Every route that reads data or describes the API; a token is needed for each.
GUARDED = [
    "/api/sensors?since=now-1h",
    "/api/readings?sensor=guarded-s1&since=now-1h",
    "/api/series?sensor=guarded-s1&measurement=temp&since=now-1h",
    "/api/rejects",
    "/api/info",
    "/api/v1/query?query=temp",
    "/api/v1/query_range?query=temp&start=0&end=60&step=15",
    "/api/v1/series?match[]=temp",
    "/api/v1/labels",
    "/api/v1/label/sensor_id/values",
    "/api/v1/metadata",
    "/openapi.json",
    "/metrics",
    "/api/nothing",
]


@dataclass
class Api:
    """A running ``ingest api`` process."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"


@pytest.fixture
def api(tmp_path: Path, mongo_uri: str, db_name: str) -> Iterator[Callable[..., Api]]:
    """Factory: start ``ingest api`` with extra flags; returns it once /healthz answers."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*extra: str, mongodb_uri: str = mongo_uri, cafile: Path | None = None) -> Api:
        port = free_port()
        log = tmp_path / f"api-{len(started)}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ingest",
                    "api",
                    "--mongodb-uri",
                    mongodb_uri,
                    "--db",
                    db_name,
                    "--api-port",
                    str(port),
                    "--log-level",
                    "debug",
                    *extra,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=clean_env(),
                cwd=ROOT,
            )
        started.append(proc)
        running = Api(proc, port, log, "https" if cafile else "http")
        context = ssl.create_default_context(cafile=cafile) if cafile else None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(
                    f"{running.url}/healthz", timeout=2, context=context
                ) as resp,
            ):
                if resp.status == 200:
                    return running
            time.sleep(0.1)
        raise TimeoutError(log.read_text())

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(timeout=10)


def token_file(tmp_path: Path, **tokens: str) -> Path:
    """A TOML tokens file: name = "token"."""
    path = tmp_path / "tokens.toml"
    path.write_text("".join(f'{name} = "{token}"\n' for name, token in tokens.items()))
    return path


async def store(db: Any) -> None:
    """Three readings of one sensor, in the last few minutes."""
    now = time.time()
    readings = [
        Reading(
            "guarded-s1",
            datetime.fromtimestamp(now - 60 * i, UTC),
            now - 60 * i,
            {"temp": 20.0 + i},
            i,
        )
        for i in range(3)
    ]
    schema = Schema(
        db,
        "buckets",
        rejects_collection="rejects",
        rejects_max_bytes=1 << 20,
        retention_days=None,
        span_seconds=3600,
    )
    writer = BucketWriter(db.buckets, schema, 3600, max_readings=1000)
    await writer.ensure_schema()
    assert (await writer.write(writer.plan(readings))).written == 3


def run_api(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingest", "api", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        env=clean_env() | (env or {}),
        cwd=ROOT,
        check=False,
    )


@pytest.mark.process
@pytest.mark.parametrize("how", ["flag", "env"])
def test_an_api_on_a_non_loopback_address_without_tokens_refuses_to_start(how: str) -> None:
    port = str(free_port())
    if how == "flag":
        result = run_api("--api-host", "0.0.0.0", "--api-port", port)
    else:
        result = run_api(env={"INGEST_API_HOST": "0.0.0.0", "INGEST_API_PORT": port})
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    line = result.stderr
    assert line.startswith("ingest: error: --api-host 0.0.0.0: not a loopback address")
    assert "--api-tokens-file" in line
    assert "python -c 'import secrets; print(secrets.token_urlsafe(32))' > tokens" in line
    assert "--api-insecure" in line


@pytest.mark.process
@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "holds no token"),
        ("short\n", "shorter than 16 characters"),
        ('page = "' + "x" * 30 + '"\ngrafana = "' + "x" * 30 + '"\n', "the same token twice"),
        ("[tokens]\npage = 3\n", 'name = "token" pairs'),
    ],
)
def test_a_bad_tokens_file_is_one_line_naming_the_flag(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "tokens"
    path.write_text(content)
    result = run_api("--api-tokens-file", str(path))
    assert result.returncode == 2
    assert result.stderr.startswith("ingest: error: --api-tokens-file: ")
    assert message in result.stderr
    assert result.stderr.count("\n") == 1
    assert "x" * 30 not in result.stderr


def test_an_insecure_api_on_any_address_serves_without_tokens(api: Callable[..., Api]) -> None:
    running = api("--api-host", "0.0.0.0", "--api-insecure")
    with urllib.request.urlopen(f"{running.url}/api/info", timeout=5) as resp:
        assert resp.status == 200
    assert "no --api-tokens-file: anyone who reaches 0.0.0.0" in running.log.read_text()


async def get(
    http: aiohttp.ClientSession, url: str, token: str | None = None, scheme: str = "Bearer"
) -> tuple[int, dict[str, str], str]:
    headers = {"Authorization": f"{scheme} {token}"} if token is not None else {}
    async with http.get(url, headers=headers) as resp:
        return resp.status, dict(resp.headers), await resp.text()


async def test_tokens_guard_every_data_route_and_never_leak(
    api: Callable[..., Api], db: Any, tmp_path: Path
) -> None:
    await store(db)
    grafana, page = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    tokens = token_file(tmp_path, grafana=grafana, page=page)
    running = api("--api-host", "0.0.0.0", "--api-tokens-file", str(tokens))
    async with aiohttp.ClientSession() as http:
        for path in GUARDED:
            url = running.url + path
            for token, scheme in [
                (None, "Bearer"),
                ("wrong-" + grafana, "Bearer"),
                (grafana, "Basic"),
                (grafana[:-1], "Bearer"),
                ("", "Bearer"),
            ]:
                status, headers, body = await get(http, url, token, scheme)
                assert status == 401, (path, token, body)
                assert headers["WWW-Authenticate"].startswith('Bearer realm="ingest api"')
                assert headers["Content-Type"].startswith("application/json")
                assert "guarded-s1" not in body
                assert "ingest_api" not in body
                assert body.startswith('{"error":{"message":"this API needs a token')
            status, _, body = await get(http, url, grafana)
            assert status == (404 if path == "/api/nothing" else 200), (path, body)
        # the right token reads the data (either token, any case of the scheme)
        status, _, body = await get(http, running.url + GUARDED[1], page, "bearer")
        assert status == 200
        assert '"sensor_id":"guarded-s1"' in body
        assert body.count('"temp"') == 3
        # health, the page and its files stay open and say nothing about the data
        for path, text in [("/healthz", "ok\n"), ("/readyz", "ready\n")]:
            status, _, body = await get(http, running.url + path)
            assert (status, body) == (200, text)
        for path in ("/", "/static/page.js"):
            status, _, body = await get(http, running.url + path)
            assert status == 200
            assert "guarded-s1" not in body
        _, _, metrics = await get(http, running.url + "/metrics", grafana)
    log = running.log.read_text()
    cmdline = Path(f"/proc/{running.proc.pid}/cmdline").read_bytes()
    for token in (grafana, page):
        assert token not in log
        assert token not in metrics
        assert token.encode() not in cmdline
    assert str(tokens).encode() in cmdline  # passed by file
    assert "2 API tokens (grafana, page)" in log
    assert "GET /api/readings by token page" in log  # names may be logged
    assert 'ingest_api_request_seconds_count{endpoint="sensors",status="4xx"} 5.0' in metrics


async def login(
    http: aiohttp.ClientSession, url: str, token: str, origin: str | None
) -> tuple[int, str, dict[str, str]]:
    headers = {"Accept": "application/json"}
    if origin is not None:
        headers["Origin"] = origin
    async with http.post(f"{url}/login", data={"token": token}, headers=headers) as resp:
        return (
            resp.status,
            await resp.text(),
            {k.lower(): v for k, v in resp.headers.items() if k.lower() == "set-cookie"},
        )


async def test_the_page_login_is_a_session_cookie_and_refuses_other_sites(
    api: Callable[..., Api], db: Any, tmp_path: Path
) -> None:
    await store(db)
    token = secrets.token_urlsafe(32)
    running = api("--api-tokens-file", str(token_file(tmp_path, page=token)))
    own = running.url
    jar = aiohttp.CookieJar(unsafe=True)  # cookies of an IP address
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        # another site's form, no Origin at all, and a wrong token get no session
        for origin in ("http://evil.example", "null", None):
            status, body, cookies = await login(http, own, token, origin)
            assert (status, cookies) == (403, {}), body
        status, body, cookies = await login(http, own, "x" * 43, own)
        assert (status, cookies) == (401, {})
        assert (await get(http, own + "/api/sensors"))[0] == 401
        # the right token: an HttpOnly, SameSite=Strict cookie (not Secure over plain HTTP)
        status, body, cookies = await login(http, own, token, own)
        assert (status, body) == (200, '{"name":"page"}')
        cookie = cookies["set-cookie"]
        session = re.match(r"ingest_session=([\w-]+);", cookie)
        assert session is not None
        assert token not in cookie
        assert "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        assert "Path=/" in cookie
        assert "Secure" not in cookie
        assert "Max-Age=43200" in cookie
        status, _, body = await get(http, own + "/api/sensors?since=now-1h")
        assert status == 200
        assert "guarded-s1" in body
        # logout ends the session on the server: the old cookie is refused afterwards
        async with http.post(f"{own}/logout", headers={"Origin": own}) as resp:
            assert resp.status == 200
    async with (
        aiohttp.ClientSession() as fresh,
        fresh.get(
            f"{own}/api/sensors", headers={"Cookie": f"ingest_session={session.group(1)}"}
        ) as resp,
    ):
        assert resp.status == 401
    log = running.log.read_text()
    assert "page login with token page" in log
    assert "page login refused" in log
    assert token not in log
    assert session.group(1) not in log


async def test_tls_with_a_self_signed_certificate(
    api: Callable[..., Api], db: Any, tmp_path: Path
) -> None:
    await store(db)
    cert, key = self_signed(tmp_path, "api")
    token = secrets.token_urlsafe(32)
    running = api(
        "--api-tokens-file",
        str(token_file(tmp_path, page=token)),
        "--api-tls-cert",
        str(cert),
        "--api-tls-key",
        str(key),
        cafile=cert,
    )
    assert running.url.startswith("https://")
    trusting = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=cert))
    async with aiohttp.ClientSession(
        connector=trusting, cookie_jar=aiohttp.CookieJar(unsafe=True)
    ) as http:
        status, _, body = await get(
            http, running.url + "/api/readings?sensor=guarded-s1&since=now-1h", token
        )
        assert status == 200
        assert "guarded-s1" in body
        assert (await get(http, running.url + "/api/info"))[0] == 401
        status, _, cookies = await login(http, running.url, token, running.url)
        assert status == 200
        assert "Secure" in cookies["set-cookie"]
    # a client that does not trust the certificate, and plain HTTP, get nothing
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await get(http, running.url + "/healthz")
        with pytest.raises(aiohttp.ClientError):
            await get(http, f"http://127.0.0.1:{running.port}/api/info", token)
    assert f"on https://127.0.0.1:{running.port}/" in running.log.read_text()


async def test_a_caller_over_its_concurrent_queries_gets_429(
    api: Callable[..., Api], db: Any, mongo_uri: str, tmp_path: Path
) -> None:
    """MongoDB held by a proxy: a caller's first query waits, its second is answered 429
    at once, naming the limit; another token's query is not refused."""
    await store(db)
    target = mongo_uri.split("//", 1)[1].split("/", 1)[0]
    host, port = target.rsplit(":", 1)
    proxy = Proxy(host, int(port)).start()
    try:
        a, b = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        running = api(
            "--api-tokens-file",
            str(token_file(tmp_path, a=a, b=b)),
            "--api-max-concurrent-queries",
            "1",
            mongodb_uri=f"mongodb://127.0.0.1:{proxy.port}/?directConnection=true",
        )
        url = running.url + "/api/readings?sensor=guarded-s1&since=now-1h"
        async with aiohttp.ClientSession() as http:
            assert (await get(http, url, a))[0] == 200  # connected
            proxy.cut()
            first = asyncio.create_task(get(http, url, a))
            other = asyncio.create_task(get(http, url, b))
            await asyncio.sleep(1)
            assert not first.done()
            status, headers, body = await get(http, url, a)
            assert status == 429
            assert headers["Retry-After"] == "1"
            assert "--api-max-concurrent-queries 1" in body
            # the Prometheus query API shares the caller's slots
            promql = running.url + "/api/v1/query?query=temp"
            assert (await get(http, promql, a))[0] == 429
            assert (await get(http, running.url + "/api/info", a))[0] == 200  # no query
            proxy.heal()
            assert (await first)[0] == 200
            assert (await other)[0] == 200
            assert (await get(http, url, a))[0] == 200  # the slot is back
    finally:
        proxy.heal()
        proxy.stop()

"""The daemon's /metrics behind a bearer token and TLS (--metrics-tokens-file, -tls-*)."""

from __future__ import annotations

import secrets
import ssl
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

import pytest

from tests.support.tls import self_signed

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.support.procs import Daemon


def get(
    url: str, token: str | None = None, context: ssl.SSLContext | None = None
) -> tuple[int, str]:
    """Status and body of a GET (errors included)."""
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.parametrize("workers", [1, 2])
def test_metrics_need_a_token_and_health_stays_open(
    daemon: Callable[..., Daemon], tmp_path: Path, workers: int
) -> None:
    token = secrets.token_urlsafe(32)
    tokens = tmp_path / "tokens"
    tokens.write_text(f'prometheus = "{token}"\n')
    proc = daemon("--metrics-tokens-file", str(tokens), "--workers", str(workers))
    base = f"http://127.0.0.1:{proc.metrics_port}"
    for presented in (None, "wrong-" + token, token[:-1]):
        status, body = get(f"{base}/metrics", presented)
        assert status == 401, (presented, body)
        assert "ingest_" not in body
    status, body = get(f"{base}/metrics", token)
    assert status == 200
    assert "ingest_messages_received_total" in body
    assert get(f"{base}/healthz")[0] == 200
    assert get(f"{base}/readyz")[0] == 200
    assert token not in proc.logs()
    assert proc.stop() == 0


def test_metrics_over_tls(daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, "metrics")
    proc = daemon("--metrics-tls-cert", str(cert), "--metrics-tls-key", str(key), wait_ready=False)
    trusted = ssl.create_default_context(cafile=str(cert))
    base = f"https://127.0.0.1:{proc.metrics_port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if get(f"{base}/readyz", context=trusted)[0] == 200:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, proc.logs()
        time.sleep(0.2)
    status, body = get(f"{base}/metrics", context=trusted)
    assert status == 200
    assert "ingest_messages_received_total" in body
    with pytest.raises(urllib.error.URLError):  # a client that does not trust it
        get(f"{base}/metrics")
    assert proc.stop() == 0


def test_half_a_tls_pair_is_one_line_naming_both_flags(
    daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    cert, _ = self_signed(tmp_path, "metrics")
    proc = daemon("--metrics-tls-cert", str(cert), wait_ready=False)
    assert proc.wait() == 2
    assert "--metrics-tls-cert and --metrics-tls-key: give both or neither" in proc.logs()

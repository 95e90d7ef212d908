"""This host's lock on a client id's session (ingest/mqtt/client_lock.py), without a broker."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from ingest.config import Settings, parse_mqtt_url
from ingest.mqtt import client_lock
from tests.support.procs import ROOT

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the lock is an abstract Unix socket (Linux)"
)


def settings(url: str = "mqtt://127.0.0.1:1883") -> Settings:
    return Settings(mqtt=parse_mqtt_url(url))


def test_a_held_client_id_is_refused_with_the_holders_pid_and_freed_on_release() -> None:
    client_id = f"c-{uuid.uuid4().hex[:8]}"
    held = client_lock.claim_all(settings(), [client_id, f"{client_id}-w1"])
    try:
        with pytest.raises(client_lock.SessionInUseError) as info:
            client_lock.claim(settings(), f"{client_id}-w1")
        assert info.value.pid == os.getpid()
        assert str(info.value).startswith(
            f"--client-id: another ingest daemon (pid {os.getpid()}) on this host uses "
            f"client id {client_id}-w1 with the broker at 127.0.0.1:1883"
        )
        # Another broker, or another client id: not the same session.
        client_lock.release(
            [
                sock
                for sock in (
                    client_lock.claim(settings("mqtt://127.0.0.1:1884"), client_id),
                    client_lock.claim(settings(), f"{client_id}-w2"),
                )
                if sock is not None
            ]
        )
    finally:
        client_lock.release(held)
    client_lock.release([sock for sock in [client_lock.claim(settings(), client_id)] if sock])


def test_claim_all_is_all_or_nothing() -> None:
    client_id = f"c-{uuid.uuid4().hex[:8]}"
    taken = client_lock.claim(settings(), f"{client_id}-w1")
    assert taken is not None
    try:
        with pytest.raises(client_lock.SessionInUseError):
            client_lock.claim_all(settings(), [client_id, f"{client_id}-w1"])
        again = client_lock.claim(settings(), client_id)  # the first was given back
        assert again is not None
        again.close()
    finally:
        taken.close()


@pytest.mark.process
def test_a_killed_holder_leaves_no_lock_behind() -> None:
    """The kernel frees the name when the process ends, however it ends."""
    client_id = f"c-{uuid.uuid4().hex[:8]}"
    code = (
        "import os, signal, sys\n"
        "from ingest.mqtt import client_lock\n"
        "from ingest.config import Settings, parse_mqtt_url\n"
        "held = client_lock.claim(Settings(mqtt=parse_mqtt_url('mqtt://127.0.0.1:1883')), "
        "sys.argv[1])\n"
        "print('held', flush=True)\n"
        "sys.stdin.readline()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code, client_id],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdin is not None
        assert child.stdout is not None
        assert child.stdout.readline() == "held\n"
        with pytest.raises(client_lock.SessionInUseError) as info:
            client_lock.claim(settings(), client_id)
        assert info.value.pid == child.pid
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.wait(timeout=10) == -9
    sock = client_lock.claim(settings(), client_id)
    assert sock is not None
    sock.close()

"""This host's claim on an MQTT session: one live process per client id and broker.

The broker gives a client id's session to whoever connects last, closing the connection
of the client that held it (a takeover). Two daemons that derive the same client id (the
default is ``ingest-<mode>-<hostname>``) would take the session from each other, and a
daemon that retires the sessions of workers it no longer has
(ingest/pipeline/worker_sessions.py) would take those of a live daemon's workers. So each
process holds a lock per client id it uses, and a process that finds one held refuses to
start (or leaves that session alone).

The lock is a Unix socket in Linux's abstract namespace, named after the broker's address
and the client id: only one socket can be bound to a name, and the kernel unbinds it when
the last process holding it exits, however it ends (SIGKILL included), so a lock is never
left behind by a dead daemon. The holder's pid is read from a connection to it
(SO_PEERCRED). The namespace belongs to the network namespace: daemons in separate
containers do not see each other's locks (each container is a host of its own, with its
own hostname and so its own default client id). Elsewhere than Linux there is no lock.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import socket
import struct
import sys
from typing import TYPE_CHECKING

from ingest.errors import StartupError

if TYPE_CHECKING:
    from ingest.config import Settings

logger = logging.getLogger(__name__)

PREFIX = b"\0iot-ingest-session/"
# Connections asking for the holder's pid wait in the backlog (never accepted); past
# this many the pid is not found and the error names no pid.
BACKLOG = 64


class SessionInUseError(StartupError):
    """A live process on this host uses the client id (with the same broker)."""

    def __init__(self, client_id: str, address: str, pid: int | None) -> None:
        self.client_id, self.pid = client_id, pid
        holder = f"another ingest daemon (pid {pid})" if pid else "another ingest daemon"
        super().__init__(
            f"--client-id: {holder} on this host uses client id {client_id} with the broker "
            f"at {address}; one client id cannot serve two processes (each would take the "
            f"session from the other): stop that daemon, or give this one its own "
            f"--client-id"
        )


def lock_name(address: str, client_id: str) -> bytes:
    """The abstract socket name of a session's lock (hashed: names are short)."""
    digest = hashlib.sha256(f"{address}\n{client_id}".encode()).hexdigest()[:40]
    return PREFIX + digest.encode()


def claim(settings: Settings, client_id: str) -> socket.socket | None:
    """Take this host's lock on ``client_id``'s session; held while the socket is open.

    Raises :class:`SessionInUseError` if a live process holds it; None where there is no
    abstract namespace (not Linux).
    """
    if not sys.platform.startswith("linux"):
        return None
    address = f"{settings.mqtt.host}:{settings.mqtt.port}"
    name = lock_name(address, client_id)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(name)
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        if exc.errno != errno.EADDRINUSE:
            raise StartupError(
                f"--client-id: cannot take this host's lock on client id {client_id} ({exc})"
            ) from None
        raise SessionInUseError(client_id, address, holder(name)) from None
    return sock


def claim_all(settings: Settings, client_ids: list[str]) -> list[socket.socket]:
    """Claim several client ids, all or none."""
    held: list[socket.socket] = []
    try:
        for client_id in client_ids:
            sock = claim(settings, client_id)
            if sock is not None:
                held.append(sock)
    except BaseException:
        release(held)
        raise
    return held


def release(held: list[socket.socket]) -> None:
    """Give the locks up (the kernel does it anyway when the process exits)."""
    for sock in held:
        sock.close()


def holder(name: bytes) -> int | None:
    """The pid of the process that bound the socket ``name``, if it can be asked."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(name)
            creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError as exc:
            logger.debug("cannot ask who holds the session lock: %s", exc)
            return None
    pid, _uid, _gid = struct.unpack("3i", creds)
    return pid or None

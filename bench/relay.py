"""The benchmarks' outside clock: ``mqttrelay`` (C) between a consumer and the broker.

Every consumer of ``bench.e2e`` (``mosquitto_sub`` or the daemon) connects to the
broker through the relay, which forwards bytes unchanged and reports, from the broker's
side of the connection, when each connection was accepted and with which client id, how
many PUBLISH packets the broker sent and how many PUBACK packets reached the broker's
socket, and when the broker had processed the PUBACK that made the target (the answer
to a PINGREQ the relay sends right after it). No consumer times or counts itself; the
relay's own CPU is reported beside the figures (``cpu_seconds``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path


@dataclass
class Relay:
    """A running ``mqttrelay`` and what it has reported so far (monotonic seconds)."""

    process: subprocess.Popen[bytes]
    port: int
    connects: dict[int, float] = field(default_factory=dict)  # connection -> accepted at
    clients: dict[int, str] = field(default_factory=dict)  # connection -> client id
    pubacks: int = 0  # PUBACKs the broker's socket took, all connections
    publishes: int = 0  # PUBLISHes the broker sent, all connections
    moved: float = 0.0  # when the relay last reported a count that moved
    processed: float | None = None  # when the broker had processed the target's PUBACKs
    closed: dict[int, float] = field(default_factory=dict)  # connection -> both ends shut
    final: dict[str, Any] = field(default_factory=dict)  # the report at its end
    cpu_seconds: float = 0.0
    _pending: bytes = b""

    @classmethod
    def start(cls, binary: Path, broker_port: int, target: int) -> Relay:
        """A relay to 127.0.0.1:``broker_port``; ``target``: PUBACKs that end the clock."""
        proc = subprocess.Popen(
            [str(binary), str(broker_port), str(target)], stdout=subprocess.PIPE
        )
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.isdigit():
            proc.kill()
            proc.wait()
            raise RuntimeError(f"mqttrelay did not start: {line!r}")
        return cls(proc, int(line))

    @property
    def url(self) -> str:
        """Where a consumer connects."""
        return f"mqtt://127.0.0.1:{self.port}"

    def poll(self, timeout: float, also: list[int] | None = None) -> list[int]:
        """Read what the relay reports within ``timeout`` seconds (all of it, if any);
        those of ``also`` (file descriptors) that are readable by then."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        ready, _, _ = select.select([fd, *(also or [])], [], [], timeout)
        while fd in ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            *lines, self._pending = (self._pending + chunk).split(b"\n")
            for line in lines:
                self._line(line.decode())
            ready = [*select.select([fd], [], [], 0)[0], *(r for r in ready if r != fd)]
        return [r for r in ready if r != fd]

    def _line(self, line: str) -> None:
        kind, _, rest = line.partition(" ")
        if kind == "connect":
            index, ns = rest.split()
            self.connects[int(index)] = int(ns) / 1e9
        elif kind == "client":
            index, _, client_id = rest.partition(" ")
            self.clients[int(index)] = client_id
        elif kind == "processed":
            self.processed = int(rest) / 1e9
        elif kind == "closed":
            index, ns = rest.split()
            self.closed[int(index)] = int(ns) / 1e9
        elif kind == "progress":
            acks, pubs, ns = rest.split()
            self.pubacks, self.publishes, self.moved = int(acks), int(pubs), int(ns) / 1e9

    def connected(self, client_ids: list[str]) -> float | None:
        """When the first of these clients connected, or None."""
        times = [self.connects[i] for i, cid in self.clients.items() if cid in client_ids]
        return min(times) if times else None

    def wait_closed(self, timeout: float) -> bool:
        """Wait until every connection has ended on both sides (the broker has read all
        the consumer sent, to its end); whether they all did within ``timeout``."""
        deadline = time.monotonic() + timeout
        while set(self.closed) != set(self.connects):
            if time.monotonic() > deadline:
                return False
            self.poll(0.05)
        return True

    def stop(self) -> dict[str, Any]:
        """End the relay; its final report (totals, ``reached_ns``, every connection)."""
        if self.final:
            return self.final
        self.process.send_signal(signal.SIGTERM)
        assert self.process.stdout is not None
        rest = self._pending + self.process.stdout.read()
        _, _, usage = os.wait4(self.process.pid, 0)
        self.process.returncode = 0  # reaped above
        self.process.stdout.close()
        self.cpu_seconds = usage.ru_utime + usage.ru_stime
        lines = rest.decode().strip().splitlines()
        for line in lines[:-1]:
            self._line(line)
        self.final = json.loads(lines[-1])
        self.pubacks = int(self.final["pubacks"])
        self.publishes = int(self.final["publishes"])
        return self.final

    def kill(self) -> None:
        """End it without a report (cleaning up after a failure)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()

    def mine(self, client_ids: list[str]) -> list[dict[str, Any]]:
        """The final report's connections of these clients."""
        return [c for c in self.final.get("connections", []) if c["client_id"] in client_ids]

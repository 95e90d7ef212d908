"""Memory during a MongoDB outage: large invalid messages against the daemon's bounds.

Starts mosquitto, the MongoDB wire emulator and ``ingest run`` with its default settings
(or ``--daemon-arg``), makes MongoDB refuse every insert (``failCommand``), publishes N
invalid messages of a given size (no reading is accepted, so only the byte bounds hold
them), waits, and prints the daemon's RSS before and after with the metrics that
explain it. The messages' rejects are not written (the outage lasts to the end).

    .venv/bin/python -m bench.outage --qos 1 --messages 2000 --size 200000
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import aiomqtt
from pymongo import MongoClient

from tests.support.procs import Broker, Daemon, start_emulator

SHOWN = (
    "ingest_messages_received_total",
    "ingest_buffered_bytes",
    "ingest_inbox_bytes",
    "ingest_mqtt_read_paused",
    "ingest_mqtt_read_pauses_total",
)


def rss_mib(pid: int) -> float:
    """The process's resident set size, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


async def publish(port: int, qos: int, messages: int, size: int) -> None:
    async with aiomqtt.Client("127.0.0.1", port) as client:
        for _ in range(messages):
            await client.publish("outage/s1/readings", b"{" + b"x" * size, qos=qos)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--qos", type=int, default=1)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--size", type=int, default=200_000, help="payload bytes")
    parser.add_argument("--wait", type=float, default=15.0, help="seconds after publishing")
    parser.add_argument(
        "--daemon-arg",
        action="append",
        default=[],
        help="extra argument for ingest run (repeatable)",
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    emulator, uri = start_emulator()
    broker = Broker(tmp)
    broker.start()
    daemon = None
    try:
        # One process (its RSS is what is measured); --daemon-arg=--workers=N overrides.
        daemon = Daemon(
            [
                "--workers",
                "1",
                "--mqtt-url",
                broker.url,
                "--topic",
                "outage/#",
                "--mongodb-uri",
                uri,
                "--db",
                "outage",
                "--client-id",
                "outage",
                "--log-level",
                "warning",
                "--qos",
                str(args.qos),
                *args.daemon_arg,
            ],
            tmp / "daemon.log",
        ).start()
        assert daemon.process is not None
        time.sleep(2)
        before = rss_mib(daemon.process.pid)
        with MongoClient[dict[str, Any]](uri) as mongo:
            mongo.admin.command(
                {
                    "configureFailPoint": "failCommand",
                    "mode": "alwaysOn",
                    "data": {"failCommands": ["insert"], "errorCode": 91},
                }
            )
        asyncio.run(publish(broker.port, args.qos, args.messages, args.size))
        peak = before
        deadline = time.monotonic() + args.wait
        while time.monotonic() < deadline:
            time.sleep(0.5)
            peak = max(peak, rss_mib(daemon.process.pid))
        metrics = daemon.metrics()
        print(
            f"QoS {args.qos}, {args.messages} x {args.size} B invalid messages during an "
            f"outage: RSS {before:.0f} MiB before, {peak:.0f} MiB at most after"
        )
        for name in SHOWN:
            if name in metrics:
                print(f"  {name} {metrics[name]:.0f}")
    finally:
        if daemon is not None and daemon.process is not None:
            daemon.process.kill()
            daemon.process.wait()
        broker.stop()
        emulator.terminate()
        emulator.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``ingest discover`` as a user runs it: on a broker, then its advice followed to the letter."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from typing import TYPE_CHECKING, Any

import aiomqtt

from tests.support.mongo import COLLECTION
from tests.support.procs import ROOT

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from tests.support.procs import Broker, Daemon

type Messages = Sequence[tuple[str, bytes]]


async def send(broker: Broker, messages: Messages, *, retain: bool = False) -> None:
    """Publish at QoS 1, each acknowledged."""
    async with aiomqtt.Client(
        "127.0.0.1", broker.port, identifier=f"pub-{uuid.uuid4().hex[:8]}"
    ) as client:
        for topic, payload in messages:
            await client.publish(topic, payload, qos=1, retain=retain)


async def discover(
    broker: Broker, retained: Messages, live: Messages, *flags: str
) -> tuple[str, str]:
    """Run ``ingest discover``: ``retained`` published (retained) before it starts,
    ``live`` once it listens; it stops when it has them all. (stdout, stderr)."""
    await send(broker, retained, retain=True)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ingest",
        "discover",
        "--mqtt-url",
        broker.url,
        "--seconds",
        "20",
        "--max-messages",
        str(len(retained) + len(live)),
        *flags,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    first = await asyncio.wait_for(proc.stderr.readline(), 20)
    assert first.startswith(b"listening to #"), first
    await send(broker, live)
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 40)
    report = first.decode() + stderr.decode()
    assert proc.returncode == 0, report
    return stdout.decode(), report


def advised(report: str, mapping: Path) -> list[str]:
    """The flags of discover's advice (``run with --preset ... --mapping <this file>``),
    the proposal's path in place of ``<this file>``."""
    line = next(x for x in report.splitlines() if x.startswith("  - run with"))
    flags = line.split("run with", 1)[1].split(" (", 1)[0].split(":", 1)[0]
    return flags.replace("<this file>", str(mapping)).split()


def report_table(report: str) -> dict[str, tuple[int, int, int]]:
    """discover's per-rule table: rule -> (accepted, rejected, ignored)."""
    lines = report.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("rule ") and "accepted" in x)
    rows = {}
    for line in lines[start + 1 :]:
        if not line.strip() or line.startswith("("):
            break
        name, *_, accepted, rejected, ignored = line.split()
        rows[name] = (int(accepted), int(rejected), int(ignored))
    return rows


def daemon_table(proc: Daemon, rules: Sequence[str]) -> dict[str, tuple[int, int, int]]:
    """The daemon's per-rule counts, as discover's table gives them."""
    metrics = proc.metrics()

    def get(name: str) -> int:
        return int(metrics.get(name, 0))

    return {
        rule: (
            get(f'ingest_rule_messages_total{{outcome="accepted",rule="{rule}"}}'),
            get(f'ingest_rule_messages_total{{outcome="rejected",rule="{rule}"}}'),
            get(f'ingest_messages_ignored_total{{rule="{rule}"}}'),
        )
        for rule in rules
    }


async def units(db: Any, mode: str) -> dict[str, dict[str, str]]:
    """The units stored for each sensor, in either layout."""
    out: dict[str, dict[str, str]] = {}
    async for doc in db[COLLECTION[mode]].find({}):
        sensor = doc["sensor_id"] if mode == "bucket" else doc["meta"]["sensor_id"]
        out.setdefault(sensor, {}).update(doc.get("units", {}))
    return out

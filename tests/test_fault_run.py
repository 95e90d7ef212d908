"""A randomised fault run: loadgen publishes a known fleet while faults hit the daemon's
MQTT side at random moments; the end state is checked with ``loadgen verify``.

Faults (docs/fault-model.md): a partition that heals, a partition that ends with the
connection dropped (PUBACKs held in it are lost), refused reconnects (CONNACK 0x87, 0x88,
0x89), SIGKILL and SIGTERM of the daemon with a restart, MongoDB refusing or delaying
writes for a while, and, once the publisher is done, broker restarts (with persistence). The daemon
reaches the broker through a TCP proxy; loadgen publishes to the broker directly.

The end state: nothing missing or wrong in either mode; bucket mode exact; time-series
mode may hold duplicates only from a process exit (messages written but not yet
acknowledged at the broker when the process ended: at most Receive Maximum messages per
SIGKILL, or per SIGTERM that finds the broker unreachable), and no more.

Seeded and reproducible in its choices (the moments depend on the machine): the seed is
printed. ``INGEST_FAULT_SEED=n`` replays one, ``INGEST_FAULT_SECONDS=s`` runs longer (the
default keeps the run in the normal suite short), ``INGEST_FAULT_KINDS=drop,refuse``
limits the faults to some kinds, e.g.::

    INGEST_FAULT_SECONDS=600 scripts/test -m fault -s
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

from tests.support.mongo import failpoint
from tests.support.procs import ROOT, eventually
from tests.support.proxy import Proxy

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.support.procs import Broker, Daemon

pytestmark = pytest.mark.fault

SECONDS = float(os.environ.get("INGEST_FAULT_SECONDS", "10"))
FAULTS = ["partition", "drop", "refuse", "kill", "term", "writes", "slow", "broker"]
KINDS = os.environ.get("INGEST_FAULT_KINDS", ",".join(FAULTS)).split(",")
RECEIVE_MAXIMUM = 40
PER_MESSAGE = 2
RATE = 24  # readings/s published while the faults run (the emulator is slow)
WRITE_COMMAND = {"bucket": "update", "timeseries": "insert"}


class FaultRun:
    """The daemon behind a proxy, restarted as the faults require; a log of what was done."""

    def __init__(self, start: Callable[..., Daemon], proxy: Proxy, broker: Broker,
                 mongo: Any, mode: str, rng: random.Random) -> None:
        self.start, self.proxy, self.broker = start, proxy, broker
        self.mongo, self.mode, self.rng = mongo, mode, rng
        self.done: Counter[str] = Counter()
        self.proc = self._daemon()
        self.reacked = self.adopted = 0.0

    def _daemon(self) -> Daemon:
        # Refusals still pending from a "refuse" fault are meant for reconnects: a new
        # process's first connection refused (0x87) is a start-up failure by design.
        self.proxy.refuse(0)
        return self.start("--max-inflight-messages", str(RECEIVE_MAXIMUM), "--batch-size", "20",
                          broker_url=f"mqtt://127.0.0.1:{self.proxy.port}")

    def pause(self, low: float = 0.2, high: float = 1.5) -> None:
        time.sleep(self.rng.uniform(low, high))

    async def one(self, publisher_done: bool) -> None:
        faults = [f for f in KINDS if publisher_done or f != "broker"] or ["partition"]
        fault = self.rng.choice(faults)
        self.done[fault] += 1
        await getattr(self, f"_{fault}")()

    async def _partition(self) -> None:
        self.proxy.cut()
        self.pause()
        self.proxy.heal()

    async def _drop(self) -> None:
        self.proxy.cut()  # PUBACKs queued from now on are held...
        self.pause()
        self.proxy.drop()  # ...and lost with the connection
        self.proxy.heal()

    async def _refuse(self) -> None:
        self.proxy.refuse(self.rng.randint(1, 3), self.rng.choice([0x87, 0x88, 0x89]))
        self.proxy.drop()

    async def _kill(self) -> None:
        self._scrape()
        self.proc.signal(signal.SIGKILL)
        self.proc.wait()
        self.pause(0.0, 1.0)
        self.proc = self._daemon()

    async def _term(self) -> None:
        self._scrape()
        self.proc.signal(signal.SIGTERM)
        assert self.proc.wait(timeout=60) == 0, self.proc.logs()[-3000:]
        self.proc = self._daemon()

    async def _writes(self) -> None:
        async with failpoint(self.mongo, [WRITE_COMMAND[self.mode]]):
            self.pause()

    async def _slow(self) -> None:
        """Every write waits (blockTimeMS) before it runs, for a while (the emulator
        then refuses it as not primary, a real server runs it)."""
        command = {"configureFailPoint": "failCommand", "mode": "alwaysOn",
                   "data": {"failCommands": [WRITE_COMMAND[self.mode]],
                            "blockConnection": True,
                            "blockTimeMS": self.rng.randint(100, 1500)}}
        await self.mongo.admin.command(command)
        try:
            self.pause()
        finally:
            await self.mongo.admin.command({"configureFailPoint": "failCommand",
                                            "mode": "off"})

    async def _broker(self) -> None:
        self.broker.restart()

    def _scrape(self) -> None:
        """Keep the counters of a process about to end (SIGKILL loses what follows)."""
        try:
            metrics = self.proc.metrics()
        except OSError:
            return
        self.reacked += metrics.get("ingest_redeliveries_reacked_total", 0.0)
        self.adopted += metrics.get("ingest_redeliveries_adopted_total", 0.0)


def verify(manifest: Path, mongo_uri: str, db_name: str, mode: str) -> dict[str, Any]:
    run = subprocess.run([sys.executable, "-m", "loadgen", "verify", "--manifest",
                          str(manifest), "--mongodb-uri", mongo_uri, "--db", db_name,
                          "--mode", mode, "--json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert run.stdout, run.stderr
    report: dict[str, Any] = json.loads(run.stdout)["modes"][0]
    return report


async def test_random_faults_lose_nothing_and_duplicate_only_what_a_kill_explains(
        daemon: Callable[..., Daemon], mode: str, persistent: Broker, topic_root: str,
        mongo: Any, mongo_uri: str, db_name: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    seed = int(os.environ.get("INGEST_FAULT_SEED", random.randrange(10**6)))
    with capsys.disabled():
        print(f"\nfault run: mode {mode}, seed {seed}, {SECONDS:.0f} s "  # noqa: T201
              f"(replay: INGEST_FAULT_SEED={seed})")
    rng = random.Random(seed)
    proxy = Proxy("127.0.0.1", persistent.port).start()
    manifest = tmp_path / "run.json"
    count = int(RATE * SECONDS * 0.6)  # the publisher ends before the faults do
    # The daemon first: its subscription must exist before anything is published.
    run = FaultRun(daemon, proxy, persistent, mongo, mode, rng)
    publisher = subprocess.Popen(
        [sys.executable, "-m", "loadgen", "publish", "--mqtt-url", persistent.url,
         "--topic-prefix", topic_root, "--sensors", "12", "--count", str(count),
         "--per-message", str(PER_MESSAGE), "--qos", "1", "--rate", str(RATE),
         "--start", "now-6h", "--time-step", "30", "--seed", str(seed),
         "--manifest", str(manifest), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            run.pause(0.1, 1.0)
            await run.one(publisher_done=publisher.poll() is not None)
        out, err = publisher.communicate(timeout=120)
        assert publisher.returncode == 0, err
        summary = json.loads(out)
        assert (summary["readings"], summary["errors"]) == (count, 0), summary
        proc = run.proc

        last: list[Any] = []

        async def caught_up() -> dict[str, Any] | None:
            report = verify(manifest, mongo_uri, db_name, mode)
            metrics = proc.metrics()
            last[:] = [report, {k: v for k, v in metrics.items() if "messages" in k
                                or "buffered" in k or "redeliver" in k or "mqtt" in k}]
            settled = (metrics["ingest_buffered_readings"] == 0
                       and metrics["ingest_messages_received_total"]
                       == metrics["ingest_messages_acked_total"])
            return report if report["missing"] == 0 and settled else None

        try:
            report = await eventually(caught_up, timeout=60 + 6 * SECONDS, interval=1.0)
        except AssertionError:
            pytest.fail(f"seed {seed}: not caught up; faults {dict(run.done)}; {last}\n"
                        f"{proc.logs()[-4000:]}")
        run._scrape()
    finally:
        publisher.kill()
        proxy.stop()
    faults = dict(sorted(run.done.items()))
    with capsys.disabled():
        print(f"fault run: {mode}: faults {faults}; expected {report['expected']}, "  # noqa: T201
              f"missing {report['missing']}, duplicated {report['duplicated']}, "
              f"wrong {report['wrong']}; PUBACKs re-sent for {run.reacked:.0f} DUPs, "
              f"{run.adopted:.0f} DUPs adopted by writes in flight")
    assert (report["expected"], report["missing"], report["wrong"],
            report["unexpected"], report["bad_documents"]) == (count, 0, 0, 0, 0), report
    if mode == "bucket":
        assert report["duplicated"] == 0, report
    else:
        # Each process exit can leave Receive Maximum messages written and unacknowledged
        # at the broker: SIGKILL at any moment, SIGTERM while the broker is unreachable.
        exits = run.done["kill"] + run.done["term"]
        assert report["duplicated"] <= exits * RECEIVE_MAXIMUM * PER_MESSAGE, (faults, report)

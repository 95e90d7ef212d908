"""A randomised fault run: loadgen publishes a known fleet while faults hit the daemon's
MQTT side at random moments; the end state is checked with ``loadgen verify``.

Faults (docs/fault-model.md): a partition that heals, a partition that ends with the
connection dropped (PUBACKs held in it are lost), the connection ended from the broker's
side (``hangup``: the daemon reconnects), refused reconnects (CONNACK 0x87, 0x88, 0x89),
SIGKILL and SIGTERM of the daemon with a restart, a restart subscribed to other filters for
the same topics (``retopic``: the old subscription must neither deliver a second copy nor
lose what was queued under it), a second daemon started with the same client id
(``twin``: it must refuse to start), MongoDB refusing or delaying writes for a while, and,
once the publisher is done, broker restarts (with persistence). The daemon reaches the
broker through a TCP proxy; loadgen publishes to the broker directly.

Half the fleet sends no time, as most devices do (``loadgen publish --untimed-every 2``):
the daemon times those readings at arrival, and a redelivery after a crash must be given
the time its first delivery got. A second run per mode has two workers on one shared
subscription and the other half of the fleet publishing some messages twice
(``--repeat-every``): the two copies of one reading reach the two workers at about the
same moment and must be stored once.

Run at QoS 1 and at QoS 0. The end state: nothing missing or wrong in either mode; bucket
mode exact; time-series mode may hold duplicates only from a process exit (messages
written but not yet acknowledged at the broker when the process ended: at most Receive
Maximum messages per SIGKILL, or per SIGTERM that finds the broker unreachable), and no
more.

At QoS 0 "missing" needs care: nothing is resent, so a message is lost wherever it is
when the bytes carrying it are thrown away. The broker is configured to queue QoS 0 for
the daemon's session while it is away (``queue_qos0_messages``): what it would drop past
its limits it counts itself, and these runs stay far below them. What the daemon has read
must be stored, or counted in ``ingest_messages_lost_total`` (a stop; none here). The
faults that throw bytes away where no one can count them are left out of the QoS 0 run:
a connection dropped by the network (its bytes in flight), a process killed, a broker
restart. What is left (partitions that heal, reconnects the broker ends, write outages
that pause reading and fill the daemon's inbox, a twin) must then lose nothing at all:
missing, duplicated and wrong are 0 in both modes.

Beside the fleet, a Sparkplug B edge node of the test's own goes through refused rebirths
(``rebirth``, drawn from a random stream of its own, so a seed's other faults are the same
with or without it): DATA, then an NBIRTH the daemon refuses whole (too many metrics, too
large or broken) that moves alias 1 to another metric, DATA that must be refused
(``no_birth``, never stored under the old alias), a usable NBIRTH and DATA stored under
its new name. With it, the fleet goes through a rule of its own that makes its topic's
last level a tag: every reading of the run is of a tagged series (a sensor and its tags).

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
import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

import aiomqtt
import pytest

from loadgen import sparkplug as enc
from loadgen.sparkplug import Metric
from tests.support.mongo import COLLECTION, failpoint
from tests.support.procs import ROOT, Broker, eventually
from tests.support.proxy import Proxy

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.support.procs import Daemon

pytestmark = pytest.mark.fault

SECONDS = float(os.environ.get("INGEST_FAULT_SECONDS", "10"))
FAULTS = [
    "partition",
    "drop",
    "hangup",
    "refuse",
    "kill",
    "term",
    "retopic",
    "twin",
    "writes",
    "slow",
    "broker",
]
QOS0_FAULTS = ["partition", "hangup", "twin", "writes", "slow"]  # see the docstring
KINDS = os.environ.get("INGEST_FAULT_KINDS", ",".join([*FAULTS, "rebirth"])).split(",")
# With two workers: the supervisor's SIGKILL leaves its workers to drain and stop by
# themselves (they notice the orphaning), and a restart meanwhile meets their client-id
# locks; a twin is the single-worker runs' business.
WORKER_FAULTS = ["partition", "drop", "hangup", "refuse", "term", "retopic", "writes", "slow"]
UNTIMED_EVERY = 2  # half the fleet sends no time
REPEAT_EVERY = 3  # with two workers: every third message of a timed sensor twice
REBIRTH_CHANCE = 0.25  # after each fault, of a refused rebirth (at least one per run)
# The daemon's limits with the Sparkplug node: above any loadgen message, below a refused
# rebirth.
SPARKPLUG_LIMITS = ("--max-readings-per-message", "50", "--max-message-bytes", "65536")
# The fleet through a rule of its own beside the node's preset; its topic's last level
# ("readings") becomes a tag, so every reading of the fleet is of a tagged series.
FLEET_RULE = """
[[rule]]
name = "fleet"
topic = "{root}/{{sensor_id}}/{{stream}}"
format = "ingest"
"""
RECEIVE_MAXIMUM = 40
READY_SECONDS = 90.0  # a restarted daemon's wait for /readyz
PER_MESSAGE = 2
RATE = 24  # readings/s published while the faults run (the emulator is slow)
WRITE_COMMAND = {"bucket": "update", "timeseries": "insert"}
# Counters summed over the daemon's processes (each scraped before it ends).
COUNTED = [
    "ingest_redeliveries_reacked_total",
    "ingest_redeliveries_adopted_total",
    "ingest_messages_lost_total",
    'ingest_duplicate_readings_total{{mode="{mode}"}}',
    'ingest_duplicate_checked_readings_total{{mode="{mode}"}}',
    'ingest_duplicate_check_seconds_total{{mode="{mode}"}}',
    'ingest_batch_write_seconds_sum{{mode="{mode}"}}',
    'ingest_readings_written_total{{mode="{mode}"}}',
]


class FaultRun:
    """The daemon behind a proxy, restarted as the faults require; a log of what was done."""

    def __init__(
        self,
        start: Callable[..., Daemon],
        proxy: Proxy,
        broker: Broker,
        mongo: Any,
        mode: str,
        rng: random.Random,
        qos: int,
        root: str,
        node: SparkplugNode | None = None,
        workers: int = 1,
    ) -> None:
        self.start, self.proxy, self.broker = start, proxy, broker
        self.mongo, self.mode, self.rng, self.qos = mongo, mode, rng, qos
        self.node, self.root = node, root
        self.flags = [
            "--max-inflight-messages",
            str(RECEIVE_MAXIMUM),
            "--batch-size",
            "20",
            "--workers",
            str(workers),
        ]
        # The fleet's filter: "retopic" switches between two that match the same topics.
        self.topics = [f"{root}/#", f"{root}/+/+"]
        if qos == 0:
            # A small pipeline: write outages fill it, so messages wait in the inbox when
            # the broker ends the connection (what a reconnect must not lose at QoS 0).
            self.flags += ["--max-buffered-readings", "40"]
        allowed = WORKER_FAULTS if workers > 1 else FAULTS
        self.kinds = [k for k in KINDS if k in allowed and (qos or k in QOS0_FAULTS)] or [
            "partition"
        ]
        self.done: Counter[str] = Counter()
        self.proc = self._daemon()
        self.counted: defaultdict[str, float] = defaultdict(float)  # metrics are floats

    def _daemon(self, wait_ready: bool = True) -> Daemon:
        # A refusal still pending from a "refuse" fault would meet the new process's first
        # connection, which the daemon rightly takes as a configuration error (exit 1).
        self.proxy.refuse(0)
        extra = () if self.node is None else self.node.daemon_args
        proc = self.start(
            *self.flags,
            "--topic",
            self.topics[0],
            *extra,
            broker_url=f"mqtt://127.0.0.1:{self.proxy.port}",
            wait_ready=False,
            rule_topics=True,
        )
        if wait_ready:
            # Ready once its backlog lets the SUBACK through: with MongoDB refusing or
            # holding writes, each BIRTH of the backlog waits for its store
            # (docs/sparkplug.md).
            proc.wait_ready(timeout=READY_SECONDS)
        return proc

    async def maybe_rebirth(self) -> None:
        """Now and then a refused rebirth of the Sparkplug node (:class:`SparkplugNode`).

        Drawn from the node's random stream; the first time always.
        """
        node = self.node
        if node is not None and (not self.done["rebirth"] or node.rng.random() < REBIRTH_CHANCE):
            if not self.done["rebirth"]:
                await node.birth()
            self.done["rebirth"] += 1
            await node.refused_rebirth()

    def pause(self, low: float = 0.2, high: float = 1.5) -> None:
        time.sleep(self.rng.uniform(low, high))

    async def one(self, publisher_done: bool) -> None:
        faults = [f for f in self.kinds if publisher_done or f != "broker"] or ["partition"]
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

    async def _hangup(self) -> None:
        self.proxy.hang_up()

    async def _twin(self) -> None:
        """A second daemon with the same client id (and broker) refuses to start."""
        twin = self._daemon(wait_ready=False)
        assert twin.wait(timeout=60) == 1, twin.logs()[-2000:]
        assert "--client-id: another ingest daemon (pid" in twin.logs(), twin.logs()[-2000:]

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

    async def _retopic(self) -> None:
        """A restart subscribed to another filter for the same topics (SIGTERM first)."""
        self._scrape()
        self.proc.signal(signal.SIGTERM)
        assert self.proc.wait(timeout=60) == 0, self.proc.logs()[-3000:]
        self.topics.reverse()
        self.proc = self._daemon()

    async def _writes(self) -> None:
        async with failpoint(self.mongo, [WRITE_COMMAND[self.mode]]):
            self.pause()

    async def _slow(self) -> None:
        """Every write waits (blockTimeMS) before it runs, for a while (the emulator
        then refuses it as not primary, a real server runs it)."""
        command = {
            "configureFailPoint": "failCommand",
            "mode": "alwaysOn",
            "data": {
                "failCommands": [WRITE_COMMAND[self.mode]],
                "blockConnection": True,
                "blockTimeMS": self.rng.randint(100, 1500),
            },
        }
        await self.mongo.admin.command(command)
        try:
            self.pause()
        finally:
            await self.mongo.admin.command({"configureFailPoint": "failCommand", "mode": "off"})

    async def _broker(self) -> None:
        self.broker.restart()

    def _scrape(self) -> None:
        """Keep the counters of a process about to end (SIGKILL loses what follows)."""
        try:
            metrics = self.proc.metrics()
        except OSError:
            return
        for name in COUNTED:
            self.counted[name] += metrics.get(name.format(mode=self.mode), 0.0)


class SparkplugNode:
    """An edge node publishing to the broker directly (QoS 1, like the fleet), and the
    readings the daemon must store from it: exactly these, under these names."""

    def __init__(self, broker: Broker, group: str, mapping: Path, rng: random.Random) -> None:
        self.broker, self.group, self.rng = broker, group, rng
        self.sensor = f"{group}/E"
        self.daemon_args = (
            "--mapping",
            str(mapping),
            "--preset",
            "sparkplug",
            "--topic",
            f"spBv1.0/{group}/#",
            *SPARKPLUG_LIMITS,
        )
        self.t0 = int(time.time() * 1000) - 3_600_000
        self.step = 0
        self.name = "temp"
        self.expected: dict[int, dict[str, float]] = {}  # ts ms -> values
        self.refused: list[int] = []  # ts of DATA that must not be stored
        self.reasons: Counter[str] = Counter()

    def _next(self) -> int:
        self.step += 1
        return self.t0 + self.step

    def _birth(self, name: str, at: int) -> bytes:
        return enc.nbirth([Metric(name, 1, at, enc.DOUBLE, is_null=True)], bd_seq=0, timestamp=at)

    def _data(self, at: int) -> bytes:
        return enc.payload(
            [Metric(alias=1, timestamp=at, datatype=enc.DOUBLE, value=float(at - self.t0))],
            at,
            (at - self.t0) % 256,
        )

    async def _send(self, messages: list[tuple[str, bytes]]) -> None:
        async with aiomqtt.Client(
            "127.0.0.1", self.broker.port, identifier=f"edge-{self.group}"
        ) as client:
            for topic, payload in messages:
                await client.publish(topic, payload, qos=1)

    async def birth(self) -> None:
        """The node's first NBIRTH."""
        await self._send(
            [(enc.topic(self.group, "NBIRTH", "E"), self._birth(self.name, self._next()))]
        )

    async def refused_rebirth(self) -> None:
        """DATA; a refused NBIRTH moving alias 1; DATA to refuse; a usable NBIRTH; DATA."""
        other = "pressure" if self.name == "temp" else "temp"
        reason = self.rng.choice(["too_many_readings", "too_large", "invalid_protobuf"])
        self.reasons[reason] += 1
        before, at = self._next(), self._next()
        refused = {
            "too_many_readings": enc.nbirth(
                [Metric(other, 1, at, enc.DOUBLE, is_null=True)]
                + [Metric(f"x{i}", 2 + i, at, enc.DOUBLE, is_null=True) for i in range(60)],
                bd_seq=0,
                timestamp=at,
            ),
            "too_large": enc.nbirth(
                [
                    Metric(other, 1, at, enc.DOUBLE, is_null=True),
                    Metric("note", 2, at, enc.STRING, "x" * 70_000),
                ],
                bd_seq=0,
                timestamp=at,
            ),
            "invalid_protobuf": enc.nbirth(
                [Metric(other, 1, at, enc.DOUBLE, is_null=True)], bd_seq=0, timestamp=at
            )
            + b"\xff",
        }[reason]
        during, reborn, after = (self._next() for _ in range(3))
        node = enc.topic(self.group, "NBIRTH", "E"), enc.topic(self.group, "NDATA", "E")
        await self._send(
            [
                (node[1], self._data(before)),
                (node[0], refused),
                (node[1], self._data(during)),
                (node[0], self._birth(other, reborn)),
                (node[1], self._data(after)),
            ]
        )
        self.expected[before] = {self.name: float(before - self.t0)}
        self.refused.append(during)
        self.expected[after] = {other: float(after - self.t0)}
        self.name = other

    async def stored(self, db: Any, mode: str) -> list[tuple[int, dict[str, Any]]]:
        """(ts ms, values) of every reading stored for the node."""
        coll = db[COLLECTION[mode]]
        out: list[tuple[int, dict[str, Any]]] = []
        if mode == "bucket":
            async for doc in coll.find({"sensor_id": self.sensor}):
                out.extend(
                    (_ms(r["ts"]), {k: v for k, v in r.items() if k != "ts"})
                    for r in doc["readings"]
                )
        else:
            out.extend(
                [
                    (
                        _ms(doc["ts"]),
                        {k: v for k, v in doc.items() if k not in ("_id", "ts", "meta")},
                    )
                    async for doc in coll.find({"meta.sensor_id": self.sensor})
                ]
            )
        return sorted(out, key=lambda r: r[0])

    def check(self, stored: list[tuple[int, dict[str, Any]]]) -> dict[str, int]:
        """Missing, duplicated and wrong readings of the node (as ``loadgen verify``)."""
        seen = Counter(ts for ts, _ in stored)
        wrong = sum(1 for ts, values in stored if self.expected.get(ts) != values)
        return {
            "expected": len(self.expected),
            "missing": sum(1 for ts in self.expected if not seen[ts]),
            "duplicated": sum(n - 1 for ts, n in seen.items() if ts in self.expected),
            "wrong": wrong,
        }


def sparkplug_node(broker: Broker, group: str, tmp_path: Path, seed: int) -> SparkplugNode | None:
    """The Sparkplug node of the run (with its rule for the fleet), unless left out."""
    if "rebirth" not in KINDS:
        return None
    rules = tmp_path / "fleet.toml"
    rules.write_text(FLEET_RULE.format(root=group))
    # A random stream of its own: the seed's other faults are the same with or without it.
    return SparkplugNode(broker, group, rules, random.Random(seed + 1))


async def check_node(
    node: SparkplugNode | None,
    run: FaultRun,
    db: Any,
    mode: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The node's readings: all there, none wrong, none of the refused DATA; bucket mode
    exactly once (time-series duplicates fall under the run's bound of process exits)."""
    if node is None:
        return
    stored = await node.stored(db, mode)
    found = node.check(stored)
    with capsys.disabled():
        print(  # noqa: T201
            f"fault run: {mode}: Sparkplug node: {run.done['rebirth']} refused "
            f"rebirths {dict(sorted(node.reasons.items()))}; {found}"
        )
    assert (found["missing"], found["wrong"]) == (0, 0), (
        found,
        [
            (ts - node.t0, values, node.expected.get(ts))
            for ts, values in stored
            if node.expected.get(ts) != values
        ],
    )
    assert not set(node.refused) & {ts for ts, _ in stored}, stored
    if mode == "bucket":
        assert found["duplicated"] == 0, (found, stored)
    else:
        exits = run.done["kill"] + run.done["term"]
        assert found["duplicated"] <= exits * RECEIVE_MAXIMUM, (found, stored)


def _ms(value: Any) -> int:
    return int(value.timestamp() * 1000)


def verify(manifest: Path, mongo_uri: str, db_name: str, mode: str) -> dict[str, Any]:
    """``loadgen verify``'s report, or ``{"error": ...}`` if it could not run (MongoDB
    busy or unreachable: the caller waits and tries again)."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadgen",
            "verify",
            "--manifest",
            str(manifest),
            "--mongodb-uri",
            mongo_uri,
            "--db",
            db_name,
            "--mode",
            mode,
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    if not run.stdout:
        return {"error": run.stderr[-1000:], "missing": None}
    report: dict[str, Any] = json.loads(run.stdout)["modes"][0]
    return report


def retopic_copies(report: dict[str, Any], faults: dict[str, int], workers: int) -> int:
    """The duplicates a restart on another filter explains (docs/delivery.md): a message
    published between today's SUBACK and the old filter's UNSUBACK comes through both, so
    a reading without a time of its own is stored twice (at each copy's arrival). Only such
    readings, at most one message per worker and restart; else 0 (bucket mode is exact)."""
    if not faults.get("retopic") or report["duplicated"] > len(report["examples"]):
        return 0
    untimed = all(
        re.fullmatch(r".*-(\d+) seq \d+: duplicated", example)
        and int(example.split(" seq ")[0].rsplit("-", 1)[1]) % UNTIMED_EVERY == 0
        for example in report["examples"]
    )
    if not untimed or report["duplicated"] > faults["retopic"] * workers * PER_MESSAGE:
        return 0
    return int(report["duplicated"])


def check_duplicates(
    report: dict[str, Any], faults: dict[str, int], mode: str, qos: int, workers: int, run: str
) -> None:
    """The readings stored twice are only those the faults explain (docs/delivery.md)."""
    # What a failure needs to be explained: the faults and the first duplicates.
    why = f"{run}: faults {faults}; examples {report['examples']}"
    window = retopic_copies(report, faults, workers)
    if mode == "bucket" or qos == 0:
        assert report["duplicated"] == window, why
        return
    # Each process exit can leave Receive Maximum messages written and unacknowledged at
    # the broker: SIGKILL at any moment, SIGTERM (a retopic's too) while the broker is
    # unreachable. And a restart on another filter has its SUBACK-UNSUBACK window.
    exits = faults.get("kill", 0) + faults.get("term", 0) + faults.get("retopic", 0)
    assert report["duplicated"] <= exits * RECEIVE_MAXIMUM * PER_MESSAGE + window, why


def summarise(
    run: str,
    faults: dict[str, int],
    report: dict[str, Any],
    c: dict[str, float],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Print what a run did: its faults, the verify result and the daemon's counters."""
    with capsys.disabled():
        print(  # noqa: T201
            f"fault run: {run}: faults {faults}; expected {report['expected']}, "
            f"missing {report['missing']}, duplicated {report['duplicated']}, "
            f"wrong {report['wrong']}; PUBACKs re-sent for "
            f"{c['redeliveries_reacked_total']:.0f} DUPs, "
            f"{c['redeliveries_adopted_total']:.0f} DUPs adopted by writes in flight; "
            f"{c['readings_written_total']:.0f} readings written, "
            f"{c['duplicate_readings_total']:.0f} not written again as duplicates; "
            f"duplicate lookups: {c['duplicate_checked_readings_total']:.0f} readings in "
            f"{c['duplicate_check_seconds_total']:.3f} s (batch writes "
            f"{c['batch_write_seconds_sum']:.3f} s in all)"
        )
        if report.get("examples"):
            print(f"fault run: {run}: examples: {report['examples']}")  # noqa: T201


def start_publisher(
    broker: Broker, root: str, count: int, qos: int, seed: int, manifest: Path, workers: int
) -> subprocess.Popen[str]:
    """The fleet's publisher: half of it without a time; with two workers, some messages
    of the other half twice."""
    repeat = ["--repeat-every", str(REPEAT_EVERY)] if workers > 1 else []
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loadgen",
            "publish",
            "--mqtt-url",
            broker.url,
            "--topic-prefix",
            root,
            "--sensors",
            "12",
            "--count",
            str(count),
            "--per-message",
            str(PER_MESSAGE),
            "--qos",
            str(qos),
            "--rate",
            str(RATE),
            "--start",
            "now-6h",
            "--time-step",
            "30",
            "--seed",
            str(seed),
            "--untimed-every",
            str(UNTIMED_EVERY),
            *repeat,
            "--manifest",
            str(manifest),
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


@pytest.fixture
def persistent(tmp_path: Path) -> Iterator[Broker]:
    """A broker of the run's own, with persistence, that queues QoS 0 messages for the
    daemon's session while it is away, as it does QoS 1 ones (see the module docstring)."""
    directory = tmp_path / "persistent"
    directory.mkdir()
    broker = Broker(directory, persistence=True, extra="queue_qos0_messages true\n")
    broker.start()
    yield broker
    broker.stop()


@pytest.mark.parametrize(
    ("qos", "workers"), [(1, 1), (0, 1), (1, 2)], ids=["qos1", "qos0", "qos1-2workers"]
)
async def test_random_faults_lose_nothing_and_duplicate_only_what_a_kill_explains(
    daemon: Callable[..., Daemon],
    mode: str,
    qos: int,
    workers: int,
    persistent: Broker,
    topic_root: str,
    mongo: Any,
    mongo_uri: str,
    db_name: str,
    db: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed = int(os.environ.get("INGEST_FAULT_SEED", random.randrange(10**6)))
    with capsys.disabled():
        print(  # noqa: T201
            f"\nfault run: mode {mode}, QoS {qos}, {workers} worker(s), seed {seed}, "
            f"{SECONDS:.0f} s (replay: INGEST_FAULT_SEED={seed})"
        )
    rng = random.Random(seed)
    proxy = Proxy("127.0.0.1", persistent.port).start()
    manifest = tmp_path / "run.json"
    count = int(RATE * SECONDS * 0.6)  # the publisher ends before the faults do
    # Sparkplug's state is per session: its preset refuses a shared subscription (workers).
    node = sparkplug_node(persistent, topic_root, tmp_path, seed) if workers == 1 else None
    # The daemon first: its subscription must exist before anything is published.
    run = FaultRun(daemon, proxy, persistent, mongo, mode, rng, qos, topic_root, node, workers)
    publisher = start_publisher(persistent, topic_root, count, qos, seed, manifest, workers)
    try:
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            run.pause(0.1, 1.0)
            await run.one(publisher_done=publisher.poll() is not None)
            await run.maybe_rebirth()
        out, err = publisher.communicate(timeout=120)
        assert publisher.returncode == 0, err
        summary = json.loads(out)
        assert (summary["readings"], summary["errors"]) == (count, 0), summary
        proc = run.proc

        last: list[Any] = []

        async def caught_up() -> dict[str, Any] | None:
            report = verify(manifest, mongo_uri, db_name, mode)
            metrics = proc.metrics()
            last[:] = [
                report,
                {
                    k: v
                    for k, v in metrics.items()
                    if "messages" in k or "buffered" in k or "redeliver" in k or "mqtt" in k
                },
            ]
            settled = (
                metrics["ingest_buffered_readings"] == 0
                and metrics["ingest_messages_received_total"]
                == metrics["ingest_messages_acked_total"]
            )
            if node is not None:  # the node's readings are all there too
                last.append(node.check(await node.stored(db, mode)))
                settled = settled and last[-1]["missing"] == 0
            return report if report["missing"] == 0 and settled else None

        try:
            report = await eventually(caught_up, timeout=60 + 6 * SECONDS, interval=1.0)
        except AssertionError:
            pytest.fail(
                f"seed {seed}: not caught up; faults {dict(run.done)}; {last}\n"
                f"{proc.logs()[-4000:]}"
            )
        run._scrape()
    finally:
        publisher.kill()
        proxy.stop()
    faults = dict(sorted(run.done.items()))
    c = {name.split("{")[0].removeprefix("ingest_"): value for name, value in run.counted.items()}
    summarise(f"{mode}, QoS {qos}, {workers} worker(s)", faults, report, c, capsys)
    assert (
        report["expected"],
        report["missing"],
        report["wrong"],
        report["unexpected"],
        report["bad_documents"],
    ) == (count, 0, 0, 0, 0), report
    # A QoS 0 message read and lost by a stop would be counted here (none is published
    # in the runs with stops).
    assert c["messages_lost_total"] == 0, c
    await check_node(node, run, db, mode, capsys)
    check_duplicates(report, faults, mode, qos, workers, f"seed {seed}")

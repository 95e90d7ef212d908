"""Publish benchmark: ``loadgen publish`` against ``qos1pub`` (C), whole command against
whole command, every message confirmed.

Both publish the same single-reading QoS 1 messages (loadgen's own payloads, on its
topics, one per sensor) to a fresh mosquitto with no subscriber. Each rate is messages
over the wall time of the whole command, from its start to its exit (connect, publish,
wait for every PUBACK, disconnect; loadgen's also includes its Python start-up). What the
broker received is checked three ways: qos1pub exits 0 only with a PUBACK for every
message, loadgen's summary must count one for every message, and the broker's own
``$SYS/broker/publish/messages/received`` must reach the count. (``mosquitto_pub -l`` is
not used: at QoS 1 it can exit 0 having delivered a fraction of its input.) Each round
runs qos1pub, then loadgen with 1 and 2 processes; the ratios are taken within a round.

    .venv/bin/python -m bench.publish [--messages 200000] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.e2e import tools
from loadgen import payloads
from tests.support.procs import ROOT, Broker

SENSORS = 1000
PREFIX = "bench"


def lines_file(path: Path, messages: int, start_ms: int) -> None:
    """``topic<TAB>payload`` lines of the loadgen run below, for qos1pub."""
    run = payloads.Run(1, PREFIX, SENSORS, 1, start_ms, 1000)
    model = payloads.Model(run.seed)
    shapes = [model.shape(i) for i in range(SENSORS)]
    with path.open("wb") as out:
        for n in range(messages):
            index = n % SENSORS
            message = payloads.message(run, model, shapes[index], n // SENSORS, 1)
            out.write(run.topic(index).encode() + b"\t" + message + b"\n")


def received(broker: Broker, at_least: int) -> int:
    """PUBLISH packets the broker counts as received ($SYS, updated every second)."""
    value = 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        out = subprocess.run(
            [
                "mosquitto_sub",
                "-p",
                str(broker.port),
                "-t",
                "$SYS/broker/publish/messages/received",
                "-C",
                "1",
                "-W",
                "3",
            ],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        value = int(out.strip() or 0)
        if value >= at_least:
            return value
        time.sleep(0.5)
    return value


def run_qos1pub(broker: Broker, qos1pub: Path, path: Path, messages: int) -> float:
    """Wall seconds of the C publisher; every message PUBACKed and counted by the broker."""
    started = time.perf_counter()
    proc = subprocess.run(
        [str(qos1pub), "127.0.0.1", str(broker.port), str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    result = json.loads(proc.stdout) if proc.stdout.strip() else {}
    if proc.returncode != 0 or result.get("acked") != messages:
        raise RuntimeError(f"qos1pub: the broker did not confirm every message: {result}")
    if (seen := received(broker, messages)) < messages:
        raise RuntimeError(f"qos1pub: the broker received {seen} of {messages}")
    return wall


def run_loadgen(broker: Broker, messages: int, processes: int) -> tuple[float, float]:
    """(wall seconds of the whole command, messages/s as loadgen measured it itself)."""
    started = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadgen",
            "publish",
            "--mqtt-url",
            broker.url,
            "--sensors",
            str(SENSORS),
            "--count",
            str(messages),
            "--rate",
            "0",
            "--qos",
            "1",
            "--processes",
            str(processes),
            "--start",
            "now-1h",
            "--time-step",
            "1",
            "--seed",
            "1",
            "--sensor-prefix",
            PREFIX,
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    wall = time.perf_counter() - started
    summary = json.loads(proc.stdout)
    if summary["messages"] != messages or summary["acked"] != messages or not summary["ok"]:
        raise RuntimeError(f"loadgen: not every message confirmed: {summary}")
    if (seen := received(broker, messages)) < messages:
        raise RuntimeError(f"loadgen: the broker received {seen} of {messages}")
    return wall, float(summary["confirmed_messages_per_s"])


def one_round(workdir: Path, path: Path, messages: int, qos1pub: Path) -> dict[str, float]:
    """qos1pub, loadgen -P1 and -P2, each on a fresh broker: wall msg/s and loadgen's own."""
    row: dict[str, float] = {}
    for name in ("qos1pub", "loadgen_p1", "loadgen_p2"):
        broker = Broker(workdir, extra="sys_interval 1\n")
        broker.start()
        try:
            if name == "qos1pub":
                row[name] = messages / run_qos1pub(broker, qos1pub, path, messages)
            else:
                wall, own = run_loadgen(broker, messages, int(name[-1]))
                row[name], row[f"{name}_self_timed"] = messages / wall, own
        finally:
            broker.stop()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not shutil.which("mosquitto_sub"):
        print("needs mosquitto-clients (mosquitto_sub)", file=sys.stderr)
        return 2
    qos1pub = tools()["qos1pub"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "lines.txt"
        lines_file(path, args.messages, int((time.time() - 3600) * 1000))
        for round_no in range(1, args.rounds + 1):
            row = one_round(Path(tmp), path, args.messages, qos1pub)
            rows.append(
                {
                    "round": round_no,
                    "messages": args.messages,
                    **{k: round(v) for k, v in row.items()},
                    "ratio_p1": round(row["loadgen_p1"] / row["qos1pub"], 3),
                    "ratio_p2": round(row["loadgen_p2"] / row["qos1pub"], 3),
                }
            )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        "| round | messages | qos1pub msg/s | loadgen -P1 msg/s | ratio "
        "| loadgen -P2 msg/s | ratio | loadgen's own figure (P1, P2) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['round']} | {r['messages']:,} | {r['qos1pub']:,} | {r['loadgen_p1']:,} "
            f"| {r['ratio_p1']:.2f} | {r['loadgen_p2']:,} | {r['ratio_p2']:.2f} "
            f"| {r['loadgen_p1_self_timed']:,}, {r['loadgen_p2_self_timed']:,} |"
        )
    print(
        f"\nmedian ratio, whole commands: -P1 "
        f"{statistics.median(r['ratio_p1'] for r in rows):.2f}, -P2 "
        f"{statistics.median(r['ratio_p2'] for r in rows):.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

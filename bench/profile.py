"""Where the daemon's CPU goes: one drain into fakemongo, sampled with py-spy.

A fresh mosquitto and ``fakemongo`` (as in ``bench.e2e``), ``ingest run`` connected and
ready, then ``qos1pub`` publishes the backlog (1,000 sensors, the same payloads as
``bench.e2e``) while ``py-spy record`` samples the daemon, until the daemon has
acknowledged every message. Prints the daemon's CPU per reading over that window, the
garbage collector's share (from ``gc.callbacks``, installed through a
``sitecustomize`` on the daemon's ``PYTHONPATH``) and the functions with the most
samples, by their own time and including what they call.

    .venv/bin/pip install py-spy     # once; without it only the CPU figures are printed
    .venv/bin/python -m bench.profile --mode bucket --per-message 100 --messages 10000

The publisher runs during the drain here (the backlog is not queued first), so the
daemon takes messages as they come and its batches may be smaller than in
``bench.e2e``: use this for shares of the CPU, ``bench.e2e`` for rates.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.e2e import backlog, cpu_of, metrics_text, publish, scrape, session, tools
from tests.support.procs import Broker, Daemon

GC_HOOK = """import atexit, gc, sys, time
_spent = [0.0, 0.0]
_by_gen = [[0, 0.0], [0, 0.0], [0, 0.0]]
def _hook(phase, info):
    if phase == "start":
        _spent[1] = time.process_time()
    else:
        took = time.process_time() - _spent[1]
        _spent[0] += took
        _by_gen[info["generation"]][0] += 1
        _by_gen[info["generation"]][1] += took
gc.callbacks.append(_hook)
atexit.register(lambda: sys.stderr.write(
    f"GC_SECONDS {_spent[0]:.3f} " + " ".join(
        f"gen{g}:{n}x/{s:.2f}s" for g, (n, s) in enumerate(_by_gen)) + "\\n"))
"""


def top(samples: Path, count: int) -> str:
    """The ``count`` functions with the most samples, self and inclusive (py-spy raw)."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in samples.read_text().splitlines():
        stack, _, number = line.rpartition(" ")
        n = int(number)
        total += n
        frames = [re.sub(r":\d+\)", ")", frame) for frame in stack.split(";")]
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    lines = [f"{total} samples", "", "own time:"]
    lines += [f"  {n / total:6.1%}  {f}" for f, n in own.most_common(count)]
    lines += ["", "including callees:"]
    lines += [f"  {n / total:6.1%}  {f}" for f, n in inclusive.most_common(count)]
    return "\n".join(lines)


def report(
    args: argparse.Namespace, cpu: float, daemon: Daemon, spy: str | None, samples: Path
) -> None:
    """Print the CPU per reading, the collector's time and the top functions."""
    readings = args.messages * args.per_message
    print(
        f"{args.mode}, {args.per_message} readings a message, {args.sensors} sensors: "
        f"{cpu * 1e6 / readings:.1f} µs of daemon CPU per reading "
        f"({cpu:.2f} s for {readings:,} readings); 1-minute load {os.getloadavg()[0]:.2f}"
    )
    found = re.search(r"GC_SECONDS ([0-9.]+) (.*)", daemon.logs())
    if found:  # over the daemon's whole life, start-up included
        print(
            f"garbage collector: {float(found.group(1)):.2f} s "
            f"(collections/time by generation: {found.group(2)})"
        )
    if spy and samples.exists():
        print(top(samples, args.top))
    elif not spy:
        print("py-spy not found: .venv/bin/pip install py-spy")


def drain(
    args: argparse.Namespace, work: Path, broker: Broker, uri: str, spy: str | None, samples: Path
) -> None:
    """Start the daemon, publish the backlog while sampling, wait for the last ack."""
    helpers = tools()
    lines = work / "backlog.txt"
    backlog(lines, args.messages, args.per_message, args.sensors)
    session(broker, "profile", 1)
    os.environ["PYTHONPATH"] = str(work / "hook")
    daemon = Daemon(
        [
            "--mqtt-url",
            broker.url,
            "--topic",
            "sensors/#",
            "--client-id",
            "profile",
            "--qos",
            "1",
            "--log-level",
            "warning",
            "--db",
            "bench",
            "--mode",
            args.mode,
            "--mongodb-uri",
            uri,
            "--workers",
            "1",
        ],
        work / "daemon.log",
    )
    try:
        daemon.start(wait_ready=True)
        assert daemon.process is not None
        pid = daemon.process.pid
        recorder = None
        if spy:
            recorder = subprocess.Popen(
                [
                    spy,
                    "record",
                    "--pid",
                    str(pid),
                    "--rate",
                    "400",
                    "--format",
                    "raw",
                    "--output",
                    str(samples),
                    # --native: C and Cython frames too (the process is paused for each
                    # sample, which slows it); else sampled without pausing it.
                    "--native" if args.native else "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        cpu_start = cpu_of(pid)
        publish(broker, helpers["qos1pub"], lines, args.messages)
        while scrape(daemon.metrics_port).get("ingest_messages_acked_total", 0) < args.messages:
            time.sleep(0.1)
        cpu = cpu_of(pid) - cpu_start
        batches = _batches(daemon.metrics_port)
        if recorder is not None:
            recorder.send_signal(signal.SIGINT)
            recorder.wait(timeout=60)
    finally:
        daemon.stop()
    report(args, cpu, daemon, spy, samples)
    print(
        f"batches written: {batches[0]:,.0f}, {batches[1] / max(batches[0], 1):,.0f} readings each"
    )


def _batches(port: int) -> tuple[float, float]:
    """The batches the daemon wrote, and their readings (its ``batch_readings`` histogram)."""
    found = dict(
        re.findall(
            r"^ingest_batch_readings_(count|sum)(?:\{[^}]*\})? (\S+)$",
            metrics_text(port),
            re.MULTILINE,
        )
    )
    return float(found.get("count", 0)), float(found.get("sum", 0))


def main() -> int:
    """Run one profiled drain; print the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--mode", choices=("bucket", "timeseries"), default="bucket")
    parser.add_argument("--per-message", type=int, default=1)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--sensors", type=int, default=1000)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path, help="keep py-spy's raw samples here")
    parser.add_argument(
        "--native",
        action="store_true",
        help="sample compiled frames too (pauses the daemon for each sample: shares only)",
    )
    args = parser.parse_args()
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    work = Path(tempfile.mkdtemp(prefix="ingest-profile-"))
    (work / "hook").mkdir()
    (work / "hook" / "sitecustomize.py").write_text(GC_HOOK)
    broker = Broker(work, extra="queue_qos0_messages true\n")
    broker.start()
    sink = subprocess.Popen([str(tools()["fakemongo"])], stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout is not None
        drain(
            args,
            work,
            broker,
            sink.stdout.readline().strip(),
            spy,
            args.out or work / "samples.txt",
        )
    finally:
        sink.terminate()
        sink.communicate()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Memory per series: the daemon's RSS as its fleet grows, and the slope (bytes per series).

Starts mosquitto, ``fakemongo`` (the C stand-in for MongoDB that keeps nothing) and one
``ingest run`` per mode (QoS 1, one worker, its default settings or ``--daemon-arg``).
First a warm-up of ``--warmup`` single-reading messages from ``--warm-sensors`` sensors
(20,000: two batches' worth, so its batches are as the fleet's), so that the pipeline's
buffers, the driver and the interpreter have reached their working size; then
the fleet grows step by step to each of ``--fleet`` sensors, one message from each new
sensor (``qos1pub`` publishes, every message PUBACKed by the broker), and once the daemon
has acknowledged every message its RSS is read from ``/proc/<pid>/status`` (VmRSS). The
slope between two steps is the memory each new series costs; past the caches' bound
(``--max-cached-series``) it falls to about nothing.

Payloads carry no ``ts`` (``--timed`` gives them one): readings timed at arrival keep
their sensor's last arrival time in memory, the larger case. Every reading must reach the
sink (fakemongo's count), or the run fails.

    .venv/bin/python -m bench.memory [--fleet 50000,100000,200000,400000]
        [--modes bucket,timeseries] [--timed] [--daemon-arg=--max-cached-series=N]
    .venv/bin/python -m bench.memory --structures 100000   # bytes per entry of each cache
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.e2e import tools
from bench.outage import rss_mib
from ingest import caches
from ingest.devices import _decode_py, decode
from ingest.devices.formats import homie, sparkplug
from ingest.devices.mapping import Mapping
from ingest.devices.rules import load_preset
from ingest.store import deliveries
from loadgen import sparkplug as enc
from tests.support.procs import Broker, Daemon

TOPIC = "fleet/{}/readings"
# Warm-up sensors: two batches' worth (--batch-size), so that the warm-up's batches are as
# the fleet's (one statement per reading) and the pipeline's working memory peaks there.
WARM_SENSORS = 20_000
TIMEOUT = 600.0  # for the daemon to acknowledge one step
SPARKPLUG_METRICS = 50  # metrics per BIRTH in --structures


@dataclass
class Step:
    """The daemon after its fleet reached ``sensors``."""

    sensors: int
    rss_bytes: int
    messages: int
    seconds: float
    gauges: dict[str, float] = field(default_factory=dict)


def lines(path: Path, first: int, last: int, timed: bool, every: int | None = None) -> int:
    """``topic<TAB>payload`` lines for sensors ``first`` to ``last - 1``; the count.

    ``every``: that many messages cycling over the sensors (the warm-up) instead of one each.
    """
    count = every if every is not None else last - first
    span = last - first
    now = int(time.time()) - 3600
    with path.open("w") as out:
        for i in range(count):
            sensor = first + i % span
            ts = f'"ts":{now + i // span},' if timed else ""
            out.write(f'{TOPIC.format(f"s{sensor:07d}")}\t{{{ts}"temp":{i % 400 / 10}}}\n')
    return count


def publish(qos1pub: Path, port: int, path: Path, count: int) -> None:
    """Every line published at QoS 1, each PUBACKed by the broker."""
    proc = subprocess.run(
        [str(qos1pub), "127.0.0.1", str(port), str(path)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    result = json.loads(proc.stdout) if proc.stdout.strip() else {}
    if proc.returncode != 0 or result.get("acked") != count:
        raise RuntimeError(f"the broker did not confirm {count} messages: {result} {proc.stderr}")


def acked(daemon: Daemon, target: int) -> None:
    """Wait until the daemon has acknowledged ``target`` messages in all."""
    deadline = time.monotonic() + TIMEOUT
    while daemon.metric("ingest_messages_acked_total") < target:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the daemon did not acknowledge {target} messages")
        time.sleep(0.2)


def rss_bytes(pid: int) -> int:
    """VmRSS of ``pid``, read a second after the step (the last batch's memory settles)."""
    time.sleep(1.0)
    return int(rss_mib(pid) * 1024 * 1024)


def cache_gauges(daemon: Daemon) -> dict[str, float]:
    """``ingest_cached_entries`` by cache."""
    return {
        key.split('"')[1]: value
        for key, value in daemon.metrics().items()
        if key.startswith("ingest_cached_entries{")
    }


def run_mode(mode: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One daemon in ``mode`` through the warm-up and every fleet size."""
    helpers = tools()
    broker = Broker(workdir)
    broker.start()
    sink = subprocess.Popen([str(helpers["fakemongo"])], stdout=subprocess.PIPE, text=True)
    assert sink.stdout is not None
    uri = sink.stdout.readline().strip()
    daemon = Daemon(
        [
            "--mode",
            mode,
            "--mqtt-url",
            broker.url,
            "--mongodb-uri",
            uri,
            "--db",
            "bench",
            "--topic",
            "fleet/#",
            "--client-id",
            f"memory-{mode}",
            "--log-level",
            "warning",
            "--workers",
            "1",
            *args.daemon_arg,
        ],
        workdir / f"daemon-{mode}.log",
    )
    steps: list[Step] = []
    try:
        daemon.start()
        assert daemon.process is not None
        path = workdir / "lines.txt"
        total = lines(path, 0, args.warm_sensors, args.timed, every=args.warmup)
        publish(helpers["qos1pub"], broker.port, path, total)
        acked(daemon, total)
        steps.append(Step(args.warm_sensors, rss_bytes(daemon.process.pid), total, 0.0))
        fleet = args.warm_sensors
        for size in args.fleet:
            count = lines(path, fleet, size, args.timed)
            started = time.monotonic()
            publish(helpers["qos1pub"], broker.port, path, count)
            total += count
            acked(daemon, total)
            seconds = time.monotonic() - started
            fleet = size
            rss = rss_bytes(daemon.process.pid)
            steps.append(Step(size, rss, count, seconds, cache_gauges(daemon)))
            print(f"{mode}: {size:,} sensors, RSS {rss / 2**20:.1f} MiB", file=sys.stderr)
        written = daemon.metric(f'ingest_readings_written_total{{mode="{mode}"}}')
    finally:
        daemon.stop()
        sink.terminate()
        out = sink.communicate(timeout=30)[0]
        broker.stop()
    stats = json.loads(out.strip().splitlines()[-1])
    seen = stats["insertedDocuments"] if mode == "timeseries" else stats["pushedElements"]
    return {
        "mode": mode,
        "messages": total,
        "written": written,
        "at_sink": seen,
        "steps": [step.__dict__ for step in steps],
    }


def structures(count: int) -> dict[str, float]:
    """Bytes per entry of each fleet-sized cache, filled in this process (tracemalloc).

    Each cache is filled with ``count`` new sensors or topics the way the daemon fills it,
    from strings made as the wire makes them (one per message), so the bytes include the
    key the cache keeps alive; the Sparkplug alias tables with BIRTHs of 50 metrics, the
    Homie devices with 10 properties each (per metric, per property).
    """
    saved = caches.limit
    # no bound in the way: the process's caches may already hold entries (a test process's
    # earlier tests), and a full cache would be cleared or refuse new ones mid-measurement
    caches.set_limit(sys.maxsize)
    limits = decode.Limits()
    now = time.time()
    mapping = Mapping(load_preset("zigbee2mqtt"))
    arrivals = decode.Arrivals()  # as the process's own (decode.ARRIVALS), left untouched
    nodes = sparkplug.SparkplugFormat(max_tables=count, max_metrics=count)
    devices = homie.HomieFormat(max_devices=count, max_properties=count)

    def birth(i: int) -> None:
        """Every SPARKPLUG_METRICS entries: one edge node's NBIRTH, as many metrics."""
        if i % SPARKPLUG_METRICS == 0:
            metrics = [
                enc.Metric(f"Inputs/Sensor {m} temperature", m, 0, enc.DOUBLE, 1.0)
                for m in range(SPARKPLUG_METRICS - 2)  # and bdSeq, Node Control/Rebirth
            ]
            node = f"E{i // SPARKPLUG_METRICS}"
            nodes.parse(enc.topic("G", "NBIRTH", node), enc.nbirth(metrics, 0, 0), limits)

    fills = {
        # the pure-Python decoder's (compiled, an id is checked in C and none is held)
        "sensor_ids": lambda i: _decode_py.decode(
            f"fleet/s{i:07d}/readings", b'{"ts": %d, "temp": 1}' % now, now, limits
        ),
        "arrival_times": lambda i: arrivals.next(f"s{i:07d}", int(now * 1000)),
        # what deliveries.pack() calls for a message's topic
        "topic_checksums": lambda i: deliveries._topic_crc(f"fleet/s{i:07d}/readings"),  # noqa: SLF001
        "mapped_topics": lambda i: mapping.match(f"zigbee2mqtt/s{i:07d}"),
        "sparkplug_metrics": birth,
        "homie_properties": lambda i: devices.parse(
            f"homie/d{i // 10}/n/p{i % 10}/$datatype", b"float", limits
        ),
    }
    out = {}
    for name, fill in fills.items():
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(count):
            fill(i)
        out[name] = (tracemalloc.get_traced_memory()[0] - before) / count
        tracemalloc.stop()
    caches.set_limit(saved)
    return out


def markdown(results: list[dict[str, Any]]) -> str:
    """One table per mode: RSS at each fleet size and the bytes per series since the last."""
    out = []
    for result in results:
        out.append(
            f"\n{result['mode']}: {result['messages']:,} messages, "
            f"{result['written']:,.0f} readings written, {result['at_sink']:,} at the sink\n"
        )
        out.append(
            "| sensors | RSS (MiB) | bytes per series since the row above | cached entries |"
        )
        out.append("|---|---|---|---|")
        last: dict[str, Any] | None = None
        for step in result["steps"]:
            slope = "-"
            if last is not None:
                grown = step["rss_bytes"] - last["rss_bytes"]
                slope = f"{grown / (step['sensors'] - last['sensors']):,.0f}"
            gauges = ", ".join(f"{k} {v:,.0f}" for k, v in sorted(step["gauges"].items())) or "-"
            rss = step["rss_bytes"] / 2**20
            out.append(f"| {step['sensors']:,} | {rss:.1f} | {slope} | {gauges} |")
            last = step
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 1 unless every reading reached the sink exactly once."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--fleet",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[50_000, 100_000, 200_000, 400_000],
        help="fleet sizes, increasing (sensors)",
    )
    parser.add_argument("--modes", default="bucket,timeseries")
    parser.add_argument("--warmup", type=int, default=100_000, help="warm-up messages")
    parser.add_argument("--warm-sensors", type=int, default=WARM_SENSORS, help="their sensors")
    parser.add_argument("--timed", action="store_true", help="payloads with their own ts")
    parser.add_argument("--daemon-arg", action="append", default=[])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--structures",
        type=int,
        metavar="N",
        help="instead: each cache's bytes per entry, N entries filled in this process",
    )
    args = parser.parse_args(argv)
    if args.structures:
        print("| cache | bytes per entry |\n|---|---|")
        for name, size in structures(args.structures).items():
            print(f"| {name} | {size:,.0f} |")
        return 0
    results = []
    exact = True
    for mode in args.modes.split(","):
        workdir = Path(tempfile.mkdtemp(prefix=f"memory-{mode}-"))
        try:
            result = run_mode(mode, args, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        exact = exact and result["written"] == result["at_sink"] == result["messages"]
        results.append(result)
    print(markdown(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if not exact:
        print("not every reading reached the sink exactly once", file=sys.stderr)
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())

"""Sparkplug B against JSON: readings/s of the daemon (--dry-run) over the same readings.

For each payload format, a backlog of QoS 1 messages, each acknowledged by the broker, is
queued at a real mosquitto for the daemon's persistent session while it is offline; the
daemon then connects and is timed with bench.e2e's clock, from its connect to the moment
the broker has processed its last acknowledgement (bench.backlog). --dry-run: decode, batch and plan
the writes, no MongoDB (a BIRTH's alias table stays in memory). The readings are the same
in every format: ``--sensors`` sensors (a fleet: message i comes from sensor i mod N), two
measurements (hum, temp) each, ``--per-message`` per message. Formats: ``ingest`` (the
default path, no mapping), ``json`` (a mapping rule of format json), ``sparkplug``
(--preset sparkplug: one NBIRTH per edge node, then NDATA with aliases only). The rounds
interleave the formats on one machine: compare the ratios.

    .venv/bin/python -m bench.sparkplug [--messages 20000] [--per-message 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.backlog import drain
from loadgen import sparkplug as spb
from tests.support.procs import Broker

JSON_RULE = """
[[rule]]
name = "bench-json"
topic = "bench/{sensor_id}/readings"
format = "json"
[rule.time]
field = "ts"
format = "epoch_s"
"""


def readings(
    messages: int, per_message: int, sensors: int
) -> list[tuple[int, list[tuple[Any, ...]]]]:
    """(sensor, [(ts_ms, seq, hum, temp)...]) per message, the same for every format."""
    start = int(time.time() * 1000) - 3_600_000
    out = []
    for i in range(messages):
        batch = []
        for j in range(per_message):
            seq = (i // sensors) * per_message + j
            batch.append((start + seq * 10, seq, 40.0 + seq % 7, 20.0 + (seq % 50) / 10))
        out.append((i % sensors, batch))
    return out


def encode(
    fmt: str, plan: list[tuple[int, list[tuple[Any, ...]]]], sensors: int
) -> list[tuple[str, bytes]]:
    """The messages of one format: topic and payload (Sparkplug: NBIRTHs first)."""
    out: list[tuple[str, bytes]] = []
    if fmt == "sparkplug":
        start = plan[0][1][0][0]
        out = [
            (spb.fleet_topic("bench", s, "NBIRTH"), spb.fleet_birth(start)) for s in range(sensors)
        ]
        seqs = [0] * sensors
        for sensor, batch in plan:
            seqs[sensor] = (seqs[sensor] + 1) % 256
            data = [(ts, hum, temp) for ts, _seq, hum, temp in batch]
            out.append((spb.fleet_topic("bench", sensor), spb.fleet_data(data, seqs[sensor])))
        return out
    for sensor, batch in plan:
        items = [
            {"ts": ts / 1000, "hum": hum, "temp": temp} | ({"seq": seq} if fmt == "ingest" else {})
            for ts, seq, hum, temp in batch
        ]
        body = (
            items[0]
            if len(items) == 1
            else ({"sensor_id": f"s{sensor}", "readings": items} if fmt == "ingest" else items)
        )
        out.append((f"bench/s{sensor}/readings", orjson.dumps(body)))
    return out


def consume(fmt: str, messages: list[tuple[str, bytes]], workdir: Path) -> float:
    """Readings/s of a --dry-run daemon draining ``messages`` queued for it."""
    broker = Broker(workdir)
    broker.start()
    args = [
        "--dry-run",
        "--mqtt-url",
        broker.url,
        "--mongodb-uri",
        "mongodb://127.0.0.1:1",
        "--client-id",
        f"bench-{fmt}",
        "--log-level",
        "warning",
        # The backlog fills batches by size; a short linger only closes the last one
        # (Sparkplug's 100 extra BIRTH messages would otherwise wait a whole second).
        "--flush-interval",
        "0.05",
    ]
    if fmt == "sparkplug":
        args += ["--preset", "sparkplug"]
    elif fmt == "json":
        rule = workdir / "json.toml"
        rule.write_text(JSON_RULE, encoding="utf-8")
        args += ["--mapping", str(rule)]
    else:
        args += ["--topic", "bench/#"]
    try:
        seconds, counters = drain(broker, args, workdir, messages, f"daemon-{fmt}")
        return counters["ingest_readings_written_total"] / seconds
    finally:
        broker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--per-message", type=int, default=1)
    parser.add_argument("--sensors", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3, help="runs per format, interleaved")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    plan = readings(args.messages, args.per_message, args.sensors)
    formats = ("ingest", "json", "sparkplug")
    encoded = {fmt: encode(fmt, plan, args.sensors) for fmt in formats}
    rates: dict[str, list[float]] = {fmt: [] for fmt in formats}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for fmt in formats:
                workdir = Path(tmp) / f"{fmt}-{round_}"
                workdir.mkdir()
                rates[fmt].append(consume(fmt, encoded[fmt], workdir))
    result = {
        fmt: {
            "readings_per_s": round(statistics.median(r)),
            "runs": [round(x) for x in r],
            "payload_bytes_per_reading": round(
                sum(len(p) for _, p in encoded[fmt]) / (args.messages * args.per_message), 1
            ),
        }
        for fmt, r in rates.items()
    }
    base = result["ingest"]["readings_per_s"]
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"{args.messages} messages x {args.per_message} readings, {args.sensors} sensors, "
        f"median of {args.rounds} interleaved runs, --dry-run"
    )
    print("| format | readings/s | / ingest default | payload bytes/reading |")
    print("|---|---|---|---|")
    for fmt, r in result.items():
        print(
            f"| {fmt} | {r['readings_per_s']:,} | {r['readings_per_s'] / base:.2f} "
            f"| {r['payload_bytes_per_reading']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Mapping benchmark: the default path and a Zigbee2MQTT stream through its rule, one run.

All streams are single-reading messages drained by the daemon (--dry-run) from a
pre-loaded, confirmed backlog in a real mosquitto, timed with bench.e2e's clock
(bench.backlog): the default stream (``{"ts", "seq", "temp", "hum"}``), once on one topic and once
spread over the same ``--sensors`` topics as the Zigbee2MQTT stream (in bucket mode, the
number of sensors in a batch sets the number of upserts, whatever the format); that one
is ``{"battery":100,"battery_low":false,"occupancy":true,"temperature":21.7,
"linkquality":134,"update":{"state":"idle"}}`` on ``zigbee2mqtt/Sensor <n>`` for
``--sensors`` sensors, decoded by the zigbee2mqtt rule (the shipped preset when there is
one, else the minimal rule below). The rounds alternate, and the ratio compares readings/s
of the two streams within the same run (the machine may be shared and noisy).

    .venv/bin/python -m bench.mapping [--messages 50000] [--sensors 1000] [--rounds 2]
    .venv/bin/python -m bench.mapping --in-process    # decode + plan only, CPU time
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from bench.backlog import payloads, run_daemon
from ingest.decode import Limits, decode
from ingest.mapping import Mapping
from ingest.rules import parse, preset_names
from ingest.writers.bucket import BucketWriter
from tests.support.procs import Broker

if TYPE_CHECKING:
    from ingest.model import Reading

RULE = """
[[rule]]
name = "z2m-bridge"
topic = "zigbee2mqtt/bridge/#"
ignore = true

[[rule]]
name = "zigbee2mqtt"
topic = "zigbee2mqtt/{sensor_id}"
format = "json"
[rule.values]
ON = true
OFF = false
"""


def zigbee2mqtt(messages: int, sensors: int) -> tuple[list[bytes], list[str]]:
    """Zigbee2MQTT-shaped state messages and their topics."""
    lines, topics = [], []
    for i in range(messages):
        lines.append(orjson.dumps({
            "battery": 100 - i % 50, "battery_low": i % 7 == 0, "occupancy": i % 2 == 0,
            "temperature": 20 + (i % 50) / 10, "linkquality": 100 + i % 100,
            "update": {"state": "idle"}}))
        topics.append(f"zigbee2mqtt/Sensor {i % sensors}")
    return lines, topics


def in_process(messages: int, sensors: int, rounds: int) -> dict[str, float]:
    """CPU microseconds per reading to decode and plan bucket writes, best of ``rounds``.

    The daemon's share of the work that differs between the two streams, without the
    broker, the MQTT client and the machine's other load (process time, not wall time).
    """
    default_lines = payloads(messages, 1)
    z2m_lines, z2m_topics = zigbee2mqtt(messages, sensors)
    mapping = Mapping(parse(RULE, "bench"))
    limits = Limits()
    writer = BucketWriter(defaultdict(lambda: None), None, 3600, 3600)  # type: ignore[arg-type]
    now = time.time()

    def default() -> list[Reading]:
        out: list[Reading] = []
        for line in default_lines:
            out.extend(decode("bench/s0/readings", line, now, limits).readings)
        return out

    fleet_topics = [f"bench/s{i % sensors}/readings" for i in range(messages)]

    def fleet() -> list[Reading]:
        out: list[Reading] = []
        for line, topic in zip(default_lines, fleet_topics, strict=True):
            out.extend(decode(topic, line, now, limits).readings)
        return out

    def mapped() -> list[Reading]:
        out: list[Reading] = []
        for line, topic in zip(z2m_lines, z2m_topics, strict=True):
            out.extend(mapping.decode(topic, line, now, limits).decoded.readings)
        return out

    best = {"default": float("inf"), "default_fleet": float("inf"),
            "zigbee2mqtt": float("inf")}
    for _ in range(rounds):
        for name, run in (("default", default), ("default_fleet", fleet),
                          ("zigbee2mqtt", mapped)):
            started = time.process_time()
            readings = run()
            for start in range(0, len(readings), 2000):
                writer.plan(readings[start:start + 2000])
            spent = (time.process_time() - started) / len(readings) * 1e6
            best[name] = min(best[name], spent)
    return best


def one_run(workdir: Path, lines: list[bytes], batch: int, extra: tuple[str, ...],
            topics: list[str] | None) -> float:
    broker = Broker(workdir)
    broker.start()
    try:
        _msg_rate, reading_rate = run_daemon(broker, lines, workdir, batch, extra, topics)
    finally:
        broker.stop()
    return reading_rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--sensors", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--in-process", action="store_true",
                        help="only decode and plan in this process (CPU time per reading)")
    args = parser.parse_args()
    if args.in_process:
        best = in_process(args.messages, args.sensors, max(args.rounds, 3))
        print(f"CPU µs per reading (decode + bucket plan, best of {max(args.rounds, 3)}): "
              f"default, one sensor {best['default']:.2f}; default, {args.sensors} sensors "
              f"{best['default_fleet']:.2f}; zigbee2mqtt, {args.sensors} sensors "
              f"{best['zigbee2mqtt']:.2f}. Readings/s ratio zigbee2mqtt / default: "
              f"{best['default'] / best['zigbee2mqtt']:.2f} (one sensor), "
              f"{best['default_fleet'] / best['zigbee2mqtt']:.2f} ({args.sensors} sensors)")
        return 0
    default_lines = payloads(args.messages, 1)
    fleet_topics = [f"bench/s{i % args.sensors}/readings" for i in range(args.messages)]
    z2m_lines, z2m_topics = zigbee2mqtt(args.messages, args.sensors)
    rates: dict[str, list[float]] = {"default": [], "default_fleet": [], "zigbee2mqtt": []}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if "zigbee2mqtt" in preset_names():
            rule_args: tuple[str, ...] = ("--preset", "zigbee2mqtt")
            source = "preset zigbee2mqtt"
        else:
            (workdir / "z2m.toml").write_text(RULE)
            rule_args = ("--mapping", str(workdir / "z2m.toml"))
            source = "bench/mapping.py's minimal rule"
        for _ in range(args.rounds):
            rates["default"].append(one_run(workdir, default_lines, args.batch_size,
                                            ("--topic", "bench/#"), None))
            rates["default_fleet"].append(one_run(workdir, default_lines, args.batch_size,
                                                  ("--topic", "bench/#"), fleet_topics))
            rates["zigbee2mqtt"].append(one_run(workdir, z2m_lines, args.batch_size,
                                                rule_args, z2m_topics))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    z2m = medians["zigbee2mqtt"]
    result = {"messages": args.messages, "sensors": args.sensors, "rounds": args.rounds,
              "rule": source,
              **{f"{name}_readings_per_s": [round(r) for r in values]
                 for name, values in rates.items()},
              "ratio_to_default": round(z2m / medians["default"], 3),
              "ratio_to_default_fleet": round(z2m / medians["default_fleet"], 3)}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    labels = {"default": "default format, one sensor",
              "default_fleet": f"default format, the same payloads on {args.sensors} sensors",
              "zigbee2mqtt": f"Zigbee2MQTT through {source}, {args.sensors} sensors"}
    print("| stream (1 reading/message) | readings/s, each round | median |\n|---|---|---|")
    for name, values in rates.items():
        print(f"| {labels[name]} | {', '.join(f'{r:,.0f}' for r in values)} "
              f"| {medians[name]:,.0f} |")
    print(f"\nratio zigbee2mqtt / default, one sensor: {result['ratio_to_default']:.2f}; "
          f"/ default, {args.sensors} sensors: {result['ratio_to_default_fleet']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Consumption benchmark: the daemon (--dry-run) against mosquitto_sub on the same stream.

Both consumers drain the same pre-loaded backlog from a real mosquitto: N QoS 1 messages
queued for a persistent session while the consumer is offline. The consumer then connects
and the clock runs until the last message is taken (mosquitto_sub: until it exits after N
messages; the daemon: from its first received message until the last one is acknowledged,
read from its metrics). That isolates the consumer from the publisher's speed.

    .venv/bin/python -m bench.consume [--messages 100000] [--batch-messages 4000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion

from tests.support.procs import Broker, Daemon, metrics_of

TOPIC = "bench/{sensor}/readings"


def payloads(messages: int, per_message: int) -> list[bytes]:
    now = time.time() - 3600
    out = []
    for i in range(messages):
        sensor = f"s{i % 1000}"
        readings = [{"ts": now + (i * per_message + j) * 0.001, "seq": i * per_message + j,
                     "temp": 20.0 + (j % 50) / 10, "hum": 40 + j % 7} for j in range(per_message)]
        if per_message == 1:
            out.append(orjson.dumps(readings[0]))
        else:
            out.append(orjson.dumps({"sensor_id": sensor, "readings": readings}))
    return out


def preload(broker: Broker, lines: list[bytes], topics: list[str] | None = None) -> None:
    """Publish every payload at QoS 1 and wait until the broker has acknowledged each.

    ``topics``: the topic of each payload (default: all on one sensor's topic).
    """
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="bench-pub",
                         protocol=paho.MQTTv5)
    client.max_inflight_messages_set(1000)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        # In windows: paho scans its whole outgoing queue on every PUBACK.
        for start in range(0, len(lines), 1000):
            infos = [client.publish(topics[i] if topics else TOPIC.format(sensor="s0"),
                                    lines[i], qos=1)
                     for i in range(start, min(start + 1000, len(lines)))]
            for info in infos:
                info.wait_for_publish(timeout=60)
                if not info.is_published():
                    raise RuntimeError("the broker did not acknowledge the preload")
    finally:
        client.disconnect()
        client.loop_stop()


def make_session(broker: Broker, client_id: str) -> None:
    """Connect once with a persistent session and subscribe, so messages queue for it."""
    subprocess.run(["mosquitto_sub", "-p", str(broker.port), "-i", client_id, "-c", "-q", "1",
                    "-V", "mqttv5", "-x", "3600", "-t", "bench/#", "-W", "1"],
                   check=False, capture_output=True)


def run_mosquitto_sub(broker: Broker, lines: list[bytes]) -> float:
    make_session(broker, "bench-sub")
    preload(broker, lines)
    started = time.perf_counter()
    subprocess.run(["mosquitto_sub", "-p", str(broker.port), "-i", "bench-sub", "-c", "-q", "1",
                    "-V", "mqttv5", "-x", "3600", "-t", "bench/#", "-C", str(len(lines))],
                   check=True, stdout=subprocess.DEVNULL)
    return len(lines) / (time.perf_counter() - started)


def run_daemon(
    broker: Broker, lines: list[bytes], workdir: Path, batch: int,
    extra: tuple[str, ...] = ("--topic", "bench/#"), topics: list[str] | None = None,
) -> tuple[float, float]:
    args = ["--dry-run", "--mqtt-url", broker.url, *extra,
            "--mongodb-uri", "mongodb://127.0.0.1:1", "--client-id", "bench-ingest",
            "--batch-size", str(batch), "--log-level", "warning"]
    first = Daemon(args, workdir / "daemon.log").start()
    first.stop()  # the persistent session now exists and queues messages
    preload(broker, lines, topics)
    daemon = Daemon(args, workdir / "daemon.log").start(wait_ready=False)
    try:
        seconds, readings = drain(daemon, len(lines))
    finally:
        daemon.stop()
    return len(lines) / seconds, readings / seconds


def drain(daemon: Daemon, messages: int) -> tuple[float, float]:
    """Scrape a starting daemon until it has acked ``messages``: (seconds from its first
    received message to the scrape that shows them all, bucket readings written)."""
    t0 = 0.0
    while True:
        try:
            metrics = metrics_of(daemon.metrics_port)
        except OSError:
            time.sleep(0.02)
            continue
        now = time.perf_counter()
        if not t0 and metrics.get("ingest_messages_received_total", 0) > 0:
            t0 = now
        if metrics.get("ingest_messages_acked_total", 0) >= messages:
            return now - t0, metrics['ingest_readings_written_total{mode="bucket"}']
        time.sleep(0.02)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=100_000,
                        help="single-reading messages (the 100-reading run uses a 20th)")
    parser.add_argument("--batch-size", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not shutil.which("mosquitto_sub"):
        print("needs mosquitto-clients (mosquitto_sub, mosquitto_pub)", file=sys.stderr)
        return 2
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for per_message, count in ((1, args.messages), (100, args.messages // 20)):
            lines = payloads(count, per_message)
            broker = Broker(Path(tmp))
            broker.start()
            try:
                sub_rate = run_mosquitto_sub(broker, lines)
                msg_rate, reading_rate = run_daemon(broker, lines, Path(tmp), args.batch_size)
            finally:
                broker.stop()
            results[per_message] = {
                "messages": count, "mosquitto_sub_msg_per_s": round(sub_rate),
                "ingest_msg_per_s": round(msg_rate), "ingest_readings_per_s": round(reading_rate),
                "ratio": round(msg_rate / sub_rate, 3)}
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print("| readings/message | messages | mosquitto_sub msg/s | ingest msg/s "
              "| ingest readings/s | ingest / mosquitto_sub |")
        print("|---|---|---|---|---|---|")
        for per_message, r in results.items():
            print(f"| {per_message} | {r['messages']} | {r['mosquitto_sub_msg_per_s']:,} "
                  f"| {r['ingest_msg_per_s']:,} | {r['ingest_readings_per_s']:,} "
                  f"| {r['ratio']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

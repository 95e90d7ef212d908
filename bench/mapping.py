"""Mapping benchmark: the default path and a device stream through its preset, one run.

All streams are single-reading messages drained by the daemon (--dry-run) from a
pre-loaded, confirmed backlog in a real mosquitto, timed with bench.e2e's clock
(bench.backlog): the default stream (``{"ts", "seq", "temp", "hum"}``), once on one topic and once
spread over the same ``--sensors`` topics as the device stream (in bucket mode, the
number of sensors in a batch sets the number of upserts, whatever the format). The device
stream (``--stream``) is one of:

- ``zigbee2mqtt`` (default): ``{"battery":100,"battery_low":false,"occupancy":true,
  "temperature":21.7,"linkquality":134,"update":{"state":"idle"}}`` on
  ``zigbee2mqtt/Sensor <n>``, decoded by the zigbee2mqtt rule (the shipped preset when
  there is one, else the minimal rule below);
- ``ttn``: The Things Stack v3 uplinks as its MQTT server publishes them (about 1 KB:
  device ids, correlation ids, one gateway's ``rx_metadata``, settings, four values in
  ``decoded_payload``) on ``v3/bench-app@ttn/devices/sensor-<n>/up``, through the shipped
  ``ttn`` preset;
- ``chirpstack``: ChirpStack v4 ``up`` events as its MQTT integration publishes them
  (about 1 KB: device info, one gateway's ``rxInfo``, ``txInfo``, four values in
  ``object``) on ``application/<id>/device/<devEui>/event/up``, through the shipped
  ``chirpstack`` preset.

The rounds alternate, and the ratio compares readings/s of the streams within the same
run (the machine may be shared and noisy). With ``--c-client`` each round also times
``mosquitto_sub`` at full speed (C, writing each message to a file: bench.e2e's baseline,
with its clock) on each stream's same backlog, a reference that does not move with the
daemon: what the broker relaying that stream allows a consumer, and the daemon's share.

    .venv/bin/python -m bench.mapping [--messages 50000] [--sensors 1000] [--rounds 2]
    .venv/bin/python -m bench.mapping --stream ttn    # The Things Stack uplinks instead
    .venv/bin/python -m bench.mapping --stream chirpstack    # ChirpStack v4 uplinks
    .venv/bin/python -m bench.mapping --in-process    # decode + plan only, CPU time
    .venv/bin/python -m bench.mapping --stream ttn --c-client    # and mosquitto_sub on each
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from bench.backlog import payloads, run_daemon, run_sub
from ingest.devices.decode import Limits, decode
from ingest.devices.mapping import Mapping
from ingest.devices.rules import parse, preset_names
from ingest.store.writers.bucket import BucketWriter
from tests.support.procs import Broker

if TYPE_CHECKING:
    from collections.abc import Callable

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
        lines.append(
            orjson.dumps(
                {
                    "battery": 100 - i % 50,
                    "battery_low": i % 7 == 0,
                    "occupancy": i % 2 == 0,
                    "temperature": 20 + (i % 50) / 10,
                    "linkquality": 100 + i % 100,
                    "update": {"state": "idle"},
                }
            )
        )
        topics.append(f"zigbee2mqtt/Sensor {i % sensors}")
    return lines, topics


def ttn(messages: int, sensors: int) -> tuple[list[bytes], list[str]]:
    """The Things Stack v3 uplinks (data-formats/_index.md's full example) and topics.

    ``uplink_message.received_at`` (the preset's time) a millisecond apart per message,
    an hour ago, as the default stream's ``ts``; four decoded values.
    """
    start = round(time.time() * 1000) - 3_600_000  # whole milliseconds
    lines, topics = [], []
    for i in range(messages):
        device, eui = f"sensor-{i % sensors}", f"70B3D57ED00{i % sensors:05X}"
        at = datetime.fromtimestamp((start + i) / 1000, UTC)
        ns = at.strftime("%Y-%m-%dT%H:%M:%S.%f") + "339Z"  # nine fraction digits
        later = (at + timedelta(milliseconds=230)).strftime("%Y-%m-%dT%H:%M:%S.%f") + "143Z"
        lines.append(
            orjson.dumps(
                {
                    "end_device_ids": {
                        "device_id": device,
                        "application_ids": {"application_id": "bench-app"},
                        "dev_eui": eui,
                        "join_eui": "70B3D57ED0000000",
                        "dev_addr": f"260B{i % sensors:04X}",
                    },
                    "correlation_ids": [
                        f"as:up:01J{i:023d}",
                        f"gs:conn:01J{i:021d}",
                        f"gs:uplink:01J{i:023d}",
                        f"ns:uplink:01J{i:023d}",
                        f"rpc:/ttn.lorawan.v3.GsNs/HandleUplink:01J{i:023d}",
                    ],
                    "received_at": later,
                    "uplink_message": {
                        "session_key_id": "AXA50tHUGUucuzS/bCGMNw==",
                        "f_port": 2,
                        "f_cnt": i // sensors,
                        "frm_payload": "CWgBGgEQ",
                        "decoded_payload": {
                            "temperature": 20 + (i % 50) / 10,
                            "humidity": 40 + i % 30 / 2,
                            "battery": 3.0 + i % 7 / 10,
                            "light": 100 + i % 900,
                        },
                        "rx_metadata": [
                            {
                                "gateway_ids": {"gateway_id": "gtw-1", "eui": "9C5C8E00001A05C4"},
                                "time": ns,
                                "timestamp": 2463457000 + i,
                                "rssi": -35 - i % 80,
                                "channel_rssi": -35 - i % 80,
                                "snr": 5.2,
                                "uplink_token": "ChIKEAoEZ3R3MRIInFyOAAAaBcQQ6L3Vlgk=",
                                "channel_index": 2,
                                "received_at": ns,
                            }
                        ],
                        "settings": {
                            "data_rate": {
                                "lora": {
                                    "bandwidth": 125000,
                                    "spreading_factor": 7,
                                    "coding_rate": "4/5",
                                }
                            },
                            "frequency": "868300000",
                            "timestamp": 2463457000 + i,
                        },
                        "received_at": ns,
                        "consumed_airtime": "0.056576s",
                        "network_ids": {
                            "net_id": "000013",
                            "tenant_id": "ttn",
                            "cluster_id": "eu1",
                        },
                    },
                }
            )
        )
        topics.append(f"v3/bench-app@ttn/devices/{device}/up")
    return lines, topics


def chirpstack(messages: int, sensors: int) -> tuple[list[bytes], list[str]]:
    """ChirpStack v4 ``up`` events (integrations/events.md's example as v4.19 sends it,
    every field emitted) and their topics.

    ``time`` (the preset's time) a millisecond apart per message, an hour ago, with nine
    fraction digits and ``+00:00``; four decoded values, doubles as google.protobuf.Struct
    gives them.
    """
    start = round(time.time() * 1000) - 3_600_000  # whole milliseconds
    app = "17c82e96-be03-4f38-aef3-f83d48582d97"
    lines, topics = [], []
    for i in range(messages):
        eui = f"70b3d57ed00{i % sensors:05x}"
        at = datetime.fromtimestamp((start + i) / 1000, UTC)
        ns = at.strftime("%Y-%m-%dT%H:%M:%S.%f") + "242+00:00"  # nine fraction digits
        lines.append(
            orjson.dumps(
                {
                    "deduplicationId": f"3ac7e3c4-4401-4b8d-9386-{i:012x}",
                    "time": ns,
                    "deviceInfo": {
                        "tenantId": "52f14cd4-c6f1-4fbd-8f87-4025e1d49242",
                        "tenantName": "ChirpStack",
                        "applicationId": app,
                        "applicationName": "bench-app",
                        "deviceProfileId": "14855bf7-d10d-4aee-b618-ebfcb64dc7ad",
                        "deviceProfileName": "bench-profile",
                        "deviceName": f"sensor-{i % sensors}",
                        "devEui": eui,
                        "deviceClassEnabled": "CLASS_A",
                        "tags": {},
                    },
                    "devAddr": f"0018{i % sensors:04x}",
                    "adr": True,
                    "dr": 5,
                    "fCnt": i // sensors,
                    "fPort": 2,
                    "confirmed": False,
                    "data": "CWgBGgEQ",
                    "object": {
                        "temperature": 20 + (i % 50) / 10,
                        "humidity": 40 + i % 30 / 2,
                        "battery": 3.0 + i % 7 / 10,
                        "light": float(100 + i % 900),
                    },
                    "rxInfo": [
                        {
                            "gatewayId": "0016c001f153a14c",
                            "uplinkId": 4217106255 - i,
                            "nsTime": ns,
                            "rssi": -35 - i % 80,
                            "snr": 10.5,
                            "channel": 2,
                            "rfChain": 1,
                            "context": "E3OWOQ==",
                            "metadata": {
                                "region_config_id": "eu868",
                                "region_common_name": "EU868",
                            },
                            "crcStatus": "CRC_OK",
                        }
                    ],
                    "txInfo": {
                        "frequency": 867100000,
                        "modulation": {
                            "lora": {
                                "bandwidth": 125000,
                                "spreadingFactor": 7,
                                "codeRate": "CR_4_5",
                            }
                        },
                    },
                    "regionConfigId": "eu868",
                }
            )
        )
        topics.append(f"application/{app}/device/{eui}/event/up")
    return lines, topics


# --stream: (messages, sensors) -> payloads and topics, the preset, a fallback rule.
STREAMS: dict[str, tuple[Callable[[int, int], tuple[list[bytes], list[str]]], str, str | None]] = {
    "zigbee2mqtt": (zigbee2mqtt, "zigbee2mqtt", RULE),
    "ttn": (ttn, "ttn", None),
    "chirpstack": (chirpstack, "chirpstack", None),
}
LABELS = {
    "zigbee2mqtt": "Zigbee2MQTT",
    "ttn": "The Things Stack v3 uplinks",
    "chirpstack": "ChirpStack v4 uplinks",
}


def stream_mapping(stream: str) -> tuple[Mapping, str]:
    """The stream's rules (its preset, else the fallback rule) and where they come from."""
    _, preset, rule = STREAMS[stream]
    if preset in preset_names():
        return Mapping.load(None, [preset]), f"preset {preset}"
    if rule is None:
        raise SystemExit(f"bench.mapping: --stream {stream} needs the {preset} preset")
    return Mapping(parse(rule, "bench")), "bench/mapping.py's minimal rule"


def in_process(
    messages: int, sensors: int, rounds: int, stream: str = "zigbee2mqtt"
) -> dict[str, float]:
    """CPU microseconds per reading to decode and plan bucket writes, best of ``rounds``.

    The daemon's share of the work that differs between the two streams, without the
    broker, the MQTT client and the machine's other load (process time, not wall time).
    """
    default_lines = payloads(messages, 1)
    z2m_lines, z2m_topics = STREAMS[stream][0](messages, sensors)
    mapping, _ = stream_mapping(stream)
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

    best = {"default": float("inf"), "default_fleet": float("inf"), stream: float("inf")}
    for _ in range(rounds):
        for name, run in (("default", default), ("default_fleet", fleet), (stream, mapped)):
            started = time.process_time()
            readings = run()
            for start in range(0, len(readings), 2000):
                writer.plan(readings[start : start + 2000])
            spent = (time.process_time() - started) / len(readings) * 1e6
            best[name] = min(best[name], spent)
    return best


def one_run(
    workdir: Path,
    lines: list[bytes],
    batch: int,
    extra: tuple[str, ...],
    topics: list[str] | None,
    c_client: bool = False,
) -> float:
    """Readings/s of the daemon draining ``lines`` on a fresh broker; with ``c_client``,
    messages/s of mosquitto_sub instead (the same as readings/s: one reading a message)."""
    broker = Broker(workdir)
    broker.start()
    try:
        if c_client:
            return run_sub(broker, lines, workdir, topics)
        _msg_rate, reading_rate = run_daemon(broker, lines, workdir, batch, extra, topics)
    finally:
        broker.stop()
    return reading_rate


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (``argv``: its arguments, default the command line's)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--stream",
        choices=sorted(STREAMS),
        default="zigbee2mqtt",
        help="the device stream compared with the default path",
    )
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--sensors", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="only decode and plan in this process (CPU time per reading)",
    )
    parser.add_argument(
        "--c-client",
        action="store_true",
        help="also time mosquitto_sub at full speed on each stream",
    )
    args = parser.parse_args(argv)
    stream = args.stream
    if args.in_process:
        best = in_process(args.messages, args.sensors, max(args.rounds, 3), stream)
        print(
            f"CPU µs per reading (decode + bucket plan, best of {max(args.rounds, 3)}): "
            f"default, one sensor {best['default']:.2f}; default, {args.sensors} sensors "
            f"{best['default_fleet']:.2f}; {stream}, {args.sensors} sensors "
            f"{best[stream]:.2f}. Readings/s ratio {stream} / default: "
            f"{best['default'] / best[stream]:.2f} (one sensor), "
            f"{best['default_fleet'] / best[stream]:.2f} ({args.sensors} sensors)"
        )
        return 0
    default_lines = payloads(args.messages, 1)
    fleet_topics = [f"bench/s{i % args.sensors}/readings" for i in range(args.messages)]
    make, preset, rule = STREAMS[stream]
    device_lines, device_topics = make(args.messages, args.sensors)
    rates: dict[str, list[float]] = {"default": [], "default_fleet": [], stream: []}
    clients: dict[str, list[float]] = {name: [] for name in rates}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        _, source = stream_mapping(stream)
        if preset in preset_names():
            rule_args: tuple[str, ...] = ("--preset", preset)
        else:
            (workdir / "rule.toml").write_text(rule or "")
            rule_args = ("--mapping", str(workdir / "rule.toml"))
        runs = {
            "default": (default_lines, ("--topic", "bench/#"), None),
            "default_fleet": (default_lines, ("--topic", "bench/#"), fleet_topics),
            stream: (device_lines, rule_args, device_topics),
        }
        for _ in range(args.rounds):
            for name, (lines, extra, topics) in runs.items():
                rates[name].append(one_run(workdir, lines, args.batch_size, extra, topics))
                if args.c_client:
                    clients[name].append(
                        one_run(workdir, lines, args.batch_size, extra, topics, c_client=True)
                    )
    result = report(args, source, device_lines, rates, clients if args.c_client else None)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(table(result, rates, clients if args.c_client else None))
    return 0


def report(
    args: argparse.Namespace,
    source: str,
    device_lines: list[bytes],
    rates: dict[str, list[float]],
    clients: dict[str, list[float]] | None,
) -> dict[str, object]:
    """The figures of a run: each stream's rates, the ratios of medians within it."""
    stream = args.stream
    medians = {name: statistics.median(values) for name, values in rates.items()}
    device = medians[stream]
    result: dict[str, object] = {
        "stream": stream,
        "messages": args.messages,
        "sensors": args.sensors,
        "rounds": args.rounds,
        "rule": source,
        "bytes_per_message": round(sum(map(len, device_lines)) / len(device_lines)),
        **{f"{name}_readings_per_s": [round(r) for r in values] for name, values in rates.items()},
        "ratio_to_default": round(device / medians["default"], 3),
        "ratio_to_default_fleet": round(device / medians["default_fleet"], 3),
    }
    if clients is not None:
        result["c_client_msgs_per_s"] = {
            name: [round(r) for r in values] for name, values in clients.items()
        }
        result["ratio_to_c_client"] = {
            name: round(medians[name] / statistics.median(values), 3)
            for name, values in clients.items()
        }
    return result


def table(
    result: dict[str, object], rates: dict[str, list[float]], clients: dict[str, list[float]] | None
) -> str:
    """The report as a Markdown table and a line of ratios."""
    stream, sensors = result["stream"], result["sensors"]
    labels = {
        "default": "default format, one sensor",
        "default_fleet": f"default format, the same payloads on {sensors} sensors",
        str(stream): f"{LABELS[str(stream)]} through {result['rule']}, {sensors} sensors",
    }
    head = "| stream (1 reading/message) | readings/s, each round | median |"
    rule = "|---|---|---|"
    if clients is not None:
        head += " mosquitto_sub msg/s, each round | median | ratio to mosquitto_sub |"
        rule += "---|---|---|"
    lines = [head, rule]
    for name, values in rates.items():
        row = (
            f"| {labels[name]} | {', '.join(f'{r:,.0f}' for r in values)} "
            f"| {statistics.median(values):,.0f} |"
        )
        if clients is not None:
            ratios: dict[str, float] = result["ratio_to_c_client"]  # type: ignore[assignment]
            row += (
                f" {', '.join(f'{r:,.0f}' for r in clients[name])} "
                f"| {statistics.median(clients[name]):,.0f} | {ratios[name]:.2f} |"
            )
        lines.append(row)
    lines.append(
        f"\nratio {stream} / default, one sensor: {result['ratio_to_default']:.2f}; "
        f"/ default, {sensors} sensors: {result['ratio_to_default_fleet']:.2f} "
        f"({result['bytes_per_message']} bytes per {stream} message)"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())

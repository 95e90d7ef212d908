"""A confirmed backlog queued for a daemon, drained and timed with bench.e2e's clock.

Shared by bench.mapping and bench.sparkplug, which compare payload formats through the
daemon (``--dry-run``: decode, batch, plan the writes, acknowledge). The daemon first
connects once, so its persistent session exists; then every message is published at QoS 1
and each PUBACK is required, so the backlog is known to be at the broker; then the daemon
starts again, through bench.e2e's relay, and drains it. It is timed as bench.e2e times
it: from its connect to the moment the broker has processed its last PUBACK, both dated
by the relay on the broker's side of the socket, so nothing in the daemon takes the time.
:func:`run_sub` times ``mosquitto_sub`` (C, writing each message to a file) on the same
backlog with the same clock: the reference no consumer of that stream beats. For the write
path against a MongoDB sink, use bench.e2e.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import orjson
from paho.mqtt import client as paho
from paho.mqtt.enums import CallbackAPIVersion

from bench import e2e
from bench.relay import Relay
from tests.support.procs import Daemon

if TYPE_CHECKING:
    from pathlib import Path

    from tests.support.procs import Broker

WINDOW = 1000  # messages in flight while preloading


def payloads(messages: int, per_message: int, sensors: int = 1000) -> list[bytes]:
    """Default-format messages: message i from sensor i % ``sensors`` (in the payload when
    it holds several readings; single readings take the sensor from the topic)."""
    now = time.time() - 3600
    out = []
    for i in range(messages):
        sensor, tick = i % sensors, i // sensors
        readings = [
            {
                "ts": now + (tick * per_message + j) * 0.001,
                "seq": tick * per_message + j,
                "temp": 20.0 + (j % 50) / 10,
                "hum": 40 + j % 7,
            }
            for j in range(per_message)
        ]
        if per_message == 1:
            out.append(orjson.dumps(readings[0]))
        else:
            out.append(orjson.dumps({"sensor_id": f"s{sensor}", "readings": readings}))
    return out


def fleet_topics(messages: int, sensors: int) -> list[str]:
    """The topic of each of :func:`payloads`' messages."""
    return [f"bench/s{i % sensors}/readings" for i in range(messages)]


def preload(broker: Broker, messages: list[tuple[str, bytes]]) -> None:
    """Publish every message at QoS 1; fail unless the broker acknowledged each one."""
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="bench-pub", protocol=paho.MQTTv5)
    client.max_inflight_messages_set(WINDOW)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        # In windows: paho scans its whole outgoing queue on every PUBACK.
        for start in range(0, len(messages), WINDOW):
            infos = [
                client.publish(topic, payload, qos=1)
                for topic, payload in messages[start : start + WINDOW]
            ]
            for info in infos:
                info.wait_for_publish(timeout=60)
                if not info.is_published():
                    raise RuntimeError("the broker did not acknowledge the backlog")
    finally:
        client.disconnect()
        client.loop_stop()


def drain(
    broker: Broker,
    args: list[str],
    workdir: Path,
    messages: list[tuple[str, bytes]],
    name: str = "daemon",
) -> tuple[float, dict[str, float]]:
    """(seconds from its connect to the broker's processing of its last ack, the daemon's
    counters at the end).

    ``args``: ``ingest run`` arguments (``--mqtt-url``, topics or a mapping, ``--dry-run``
    ...) with a fixed ``--client-id``. Raises if the daemon did not ack every message.
    """
    log = workdir / f"{name}.log"
    # One process, as bench.e2e's default: these compare formats per worker (and
    # --workers auto would make the figures depend on the machine's CPUs).
    args = ["--workers", "1", *args]
    first = Daemon(args, log).start()
    first.stop()  # the persistent session now exists and queues the backlog
    preload(broker, messages)
    client_id = args[args.index("--client-id") + 1]
    relay = Relay.start(e2e.tools()["mqttrelay"], broker.port, len(messages))
    try:
        url = args.index("--mqtt-url") + 1
        daemon = Daemon([*args[:url], relay.url, *args[url + 1 :]], log).start(wait_ready=False)
        try:
            watch, counters = e2e.watch_daemon(daemon, relay, len(messages), 1, [client_id])
        finally:
            daemon.stop()
        relay.wait_closed(e2e.CLOSE_TIMEOUT)
        relay.stop()
    finally:
        relay.kill()
    run = e2e.Run(name, 0, 1, 1, len(messages), published=len(messages))
    e2e.settle(run, relay, client_id, 1)
    e2e.timed(run, watch)
    if run.pubacks < len(messages):
        raise RuntimeError(
            f"the broker has {run.pubacks} PUBACKs of {len(messages)} "
            f"messages:\n{daemon.logs()[-2000:]}"
        )
    return run.seconds, counters


def run_daemon(
    broker: Broker,
    lines: list[bytes],
    workdir: Path,
    batch: int,
    extra: tuple[str, ...] = ("--topic", "bench/#"),
    topics: list[str] | None = None,
) -> tuple[float, float]:
    """(messages/s, readings/s) of a ``--dry-run`` daemon draining ``lines`` (on
    ``topics``, default all on one sensor's topic)."""
    args = [
        "--dry-run",
        "--mqtt-url",
        broker.url,
        *extra,
        "--mongodb-uri",
        "mongodb://127.0.0.1:1",
        "--client-id",
        "bench-ingest",
        "--batch-size",
        str(batch),
        "--log-level",
        "warning",
    ]
    messages = list(zip(topics or ["bench/s0/readings"] * len(lines), lines, strict=True))
    seconds, counters = drain(broker, args, workdir, messages)
    return len(lines) / seconds, counters.get("ingest_readings_written_total", 0.0) / seconds


def run_sub(
    broker: Broker, lines: list[bytes], workdir: Path, topics: list[str] | None = None
) -> float:
    """Messages/s of ``mosquitto_sub`` at full speed (bench.e2e's baseline, writing to a
    file) draining ``lines`` (on ``topics``, default all on one sensor's topic).

    The same backlog as :func:`run_daemon` gives the daemon, preloaded and confirmed the
    same way, timed by the relay from the client's connect to the broker's processing of
    its last PUBACK. Raises unless the broker got a PUBACK for every message.
    """
    client_id = "bench-sub"
    e2e.session(broker, client_id, 1, base="#")
    messages = list(zip(topics or ["bench/s0/readings"] * len(lines), lines, strict=True))
    preload(broker, messages)
    run = e2e.Run("mosquitto_sub", 0, 1, 1, len(messages), published=len(messages))
    relay = Relay.start(e2e.tools()["mqttrelay"], broker.port, len(messages))
    try:
        e2e.measure_sub(run, relay, client_id, workdir, base="#")
        relay.wait_closed(e2e.CLOSE_TIMEOUT)
        relay.stop()
    finally:
        relay.kill()
    e2e.settle(run, relay, client_id, 1)
    if run.pubacks < len(messages) or run.received < len(messages) or run.seconds <= 0:
        raise RuntimeError(
            f"mosquitto_sub wrote {run.received} of {len(messages)} messages; "
            f"the broker has {run.pubacks} PUBACKs"
        )
    return len(messages) / run.seconds

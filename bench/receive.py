"""Cost of the MQTT receive and acknowledgement path per message, in process.

A real aiomqtt/paho client with the daemon's hooks reads 100,000 single-reading PUBLISH
packets (1,000 sensors, the payloads of ``bench.e2e``) from an in-memory socket, in
64 KiB reads; the source's own consumer hands each message to a sink that does nothing
but keep it, and the messages are acknowledged in batches of 500 (PUBACK bytes queued to
a paho client that sends nothing). Prints the CPU time per message of each stage
(receive: parse and inbox; consume: inbox to sink; ack: bookkeeping and PUBACK bytes),
median of several rounds, at QoS 1 and QoS 0. Decoding, batching and writing are not
included: ``bench.e2e`` measures the whole daemon. With ``--subscription-identifier``
each packet carries the Subscription Identifier of the daemon's subscription to
``sensors/#``, as the broker sends every message to the daemon.

    .venv/bin/python -m bench.receive [--rounds 7] [--subscription-identifier]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from typing import TYPE_CHECKING, Any

import aiomqtt
import uvloop

from bench.wire import identifier_property
from ingest.config import Settings
from ingest.metrics import Health, Metrics
from ingest.mqtt.source import MqttSource
from tests.mqtt.test_paho_contract import KernelSocket, publish_packet

if TYPE_CHECKING:
    from ingest.model import Inbound

MESSAGES = 100_000
SENSORS = 1000
BATCH = 500


def stream(qos: int, props: bytes = b"") -> bytes:
    """The PUBLISH packets of a single-reading backlog, as the broker sends them."""
    start = int(time.time()) - 7200
    packets = []
    for i in range(MESSAGES):
        sensor, seq = i % SENSORS, i // SENSORS
        payload = (
            f'{{"ts":{start + seq},"seq":{seq},'
            f'"temp":{18 + (seq * 7 + sensor) % 100 / 10:.1f},'
            f'"hum":{40 + (seq + sensor) % 30}}}'
        ).encode()
        packets.append(
            publish_packet(
                f"sensors/s{sensor:05d}/readings",
                payload,
                i % 65535 + 1 if qos else 0,
                qos,
                props=props,
            )
        )
    return b"".join(packets)


async def one_round(data: bytes) -> tuple[float, float, float]:
    """Seconds per message to receive, consume and acknowledge the stream."""
    gc.collect()
    settings = Settings(max_inflight_messages=MESSAGES * 2, max_buffered_bytes=1 << 40)
    source = MqttSource(settings, Metrics("bucket"), Health())
    client = aiomqtt.Client("127.0.0.1", protocol=aiomqtt.ProtocolVersion.V5)
    inbox = source._receiver(client)  # noqa: SLF001
    paho: Any = client._client  # noqa: SLF001
    sock = KernelSocket(65536)
    paho._sock = sock  # noqa: SLF001
    paho._packet_queue = lambda *_a, **_k: 0  # noqa: SLF001
    source._connected(client)  # noqa: SLF001
    sock.feed(data)
    started = time.process_time()
    while sock.queue:
        paho.loop_read()
    received = time.process_time()
    taken: list[Inbound] = []
    done = asyncio.Event()

    async def sink(message: Inbound) -> bool:
        taken.append(message)
        if len(taken) == MESSAGES:
            done.set()
        return True

    consume = asyncio.create_task(source._consume(inbox, sink))  # noqa: SLF001
    await done.wait()
    consumed = time.process_time()
    for i in range(0, len(taken), BATCH):
        source.ack_all(taken[i : i + BATCH])
    acked = time.process_time()
    consume.cancel()
    return received - started, consumed - received, acked - consumed


async def main(rounds: int, props: bytes) -> None:
    for qos in (1, 0):
        data = stream(qos, props)
        results = [await one_round(data) for _ in range(rounds)]
        receive, consume, ack = (
            statistics.median(r[i] for r in results) / MESSAGES * 1e6 for i in range(3)
        )
        print(
            f"QoS {qos}, median of {rounds} rounds of {MESSAGES:,} messages: "
            f"{receive + consume + ack:.2f} us/message (receive {receive:.2f}, "
            f"consume {consume:.2f}, ack {ack:.2f})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--subscription-identifier",
        action="store_true",
        help="packets carry the identifier of the subscription to sensors/#",
    )
    args = parser.parse_args()
    uvloop.run(main(args.rounds, identifier_property() if args.subscription_identifier else b""))

"""Cost of the acknowledgement ledger per QoS 1 message, in process.

Drives the source's :class:`~ingest.mqtt.acks.AckLedger` directly (arrival, then
acknowledged in batches of 500 as the pipeline does; PUBACK bytes queued to a paho client
that sends nothing, through the source's own callback) for 100,000 messages, with and
without remembering sent PUBACKs for DUP redeliveries, and prints the fastest of several
rounds of each.

    .venv/bin/python -m bench.acks [--rounds 12]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from unittest import mock

import aiomqtt
from paho.mqtt.enums import MQTTErrorCode

from ingest.config import Settings
from ingest.metrics import Health, Metrics
from ingest.model import Inbound
from ingest.mqtt.source import MqttSource

MESSAGES = 100_000
BATCH = 500


def queue_nothing(*_args: object, **_kwargs: object) -> MQTTErrorCode:
    """paho's packet queue, sending nothing."""
    return MQTTErrorCode.MQTT_ERR_SUCCESS


def forget(_messages: list[Inbound]) -> None:
    """The ledger's memory of sent PUBACKs, keeping nothing."""


async def per_message_us(*, remember: bool) -> float:
    source = MqttSource(Settings(), Metrics("bucket"), Health())
    ledger = source._ledger  # noqa: SLF001
    client = aiomqtt.Client("127.0.0.1")
    with contextlib.ExitStack() as stubs:
        stubs.enter_context(mock.patch.object(client._client, "_packet_queue", queue_nothing))  # noqa: SLF001
        if not remember:
            stubs.enter_context(mock.patch.object(ledger, "_remember", forget))
        return timed(source, client)


def timed(source: MqttSource, client: aiomqtt.Client) -> float:
    """Microseconds per message: arrivals, then acknowledgements in batches."""
    ledger = source._ledger  # noqa: SLF001
    source._client, source._generation = client, 1  # noqa: SLF001
    ledger.connected(1)
    messages = [
        Inbound(
            f"sensors/s{i % 1000}/readings",
            b'{"ts": 1700000000.5, "temp": 21.5, "seq": %d}' % i,
            i % 65535 + 1,
            1,
            1,
            0.0,
        )
        for i in range(MESSAGES)
    ]
    arrived, written = ledger.arrived, ledger.written
    started = time.perf_counter()
    for i in range(0, MESSAGES, BATCH):
        batch = messages[i : i + BATCH]
        for message in batch:
            arrived(message)
        written(batch)
    return (time.perf_counter() - started) / MESSAGES * 1e6


async def main(rounds: int) -> None:
    with_memory, without = [], []
    for _ in range(rounds):
        with_memory.append(await per_message_us(remember=True))
        without.append(await per_message_us(remember=False))
    print(
        f"acknowledgement ledger, fastest of {rounds} rounds of {MESSAGES:,} messages: "
        f"{min(with_memory):.2f} us/message remembering PUBACKs, "
        f"{min(without):.2f} us/message without"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    asyncio.run(main(parser.parse_args().rounds))

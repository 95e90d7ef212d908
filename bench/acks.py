"""Cost of the acknowledgement ledger per QoS 1 message, in process.

Drives the source's :class:`~ingest.mqtt.acks.AckLedger` directly (arrival, then
acknowledged in batches of 500 as the pipeline does; PUBACK bytes queued to a paho client
that sends nothing, through the source's own callback) for 100,000 messages, and prints
the fastest of several rounds: the compiled ledger (where built) and the Python one, the
Python one also without remembering sent PUBACKs for DUP redeliveries (the compiled
ledger's methods cannot be replaced to leave that out).

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

from ingest import accel
from ingest.config import Settings
from ingest.metrics import Health, Metrics
from ingest.model import Inbound
from ingest.mqtt import _acks_py, source
from ingest.mqtt.source import MqttSource

MESSAGES = 100_000
BATCH = 500


def queue_nothing(*_args: object, **_kwargs: object) -> MQTTErrorCode:
    """paho's packet queue, sending nothing."""
    return MQTTErrorCode.MQTT_ERR_SUCCESS


def forget(_messages: list[Inbound]) -> None:
    """The ledger's memory of sent PUBACKs, keeping nothing."""


async def per_message_us(ledger_class: type[_acks_py.AckLedger], *, remember: bool) -> float:
    with mock.patch.object(source, "AckLedger", ledger_class):
        mqtt = MqttSource(Settings(), Metrics("bucket"), Health())
    ledger = mqtt._ledger  # noqa: SLF001
    client = aiomqtt.Client("127.0.0.1")
    with contextlib.ExitStack() as stubs:
        stubs.enter_context(mock.patch.object(client._client, "_packet_queue", queue_nothing))  # noqa: SLF001
        if not remember:
            stubs.enter_context(mock.patch.object(ledger, "_remember", forget))
        return timed(mqtt, client)


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
    compiled_class = accel.pick(None, "ingest.mqtt._acks_c", "AckLedger")  # None: not built
    compiled: list[float] = []
    python: list[float] = []
    without: list[float] = []
    for _ in range(rounds):
        if compiled_class is not None:
            compiled.append(await per_message_us(compiled_class, remember=True))
        python.append(await per_message_us(_acks_py.AckLedger, remember=True))
        without.append(await per_message_us(_acks_py.AckLedger, remember=False))
    first = f"compiled {min(compiled):.2f} us/message; " if compiled else "compiled: not built; "
    print(
        f"acknowledgement ledger, fastest of {rounds} rounds of {MESSAGES:,} messages: "
        f"{first}Python {min(python):.2f} us/message remembering PUBACKs, "
        f"{min(without):.2f} without"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    asyncio.run(main(parser.parse_args().rounds))

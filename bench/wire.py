"""CPU per packet of the MQTT read buffer's scan, compiled twin against Python twin.

A 64 KiB read buffer of single-reading QoS 1 PUBLISH packets (the topics and payloads of
``bench.e2e``), scanned by ``ingest.mqtt._wire_py.scan`` and by its compiled twin, in
interleaved rounds, into a delivery that does nothing; the best round of each is kept.
With ``--subscription-identifier`` each packet carries the Subscription Identifier of
the daemon's subscription to ``sensors/#``, as the broker sends every message to the
daemon (a property block of 6 bytes).

    .venv/bin/python -m bench.wire --rounds 20 [--subscription-identifier]
"""

from __future__ import annotations

import argparse
import importlib
import time
from typing import TYPE_CHECKING

from ingest.mqtt import _wire_py, wire

if TYPE_CHECKING:
    from collections.abc import Callable

BUFFER = 65536


def publish(topic: str, payload: bytes, mid: int, props: bytes = b"") -> bytes:
    """A QoS 1 MQTT 5 PUBLISH with these properties (a length under 128), as mosquitto
    sends it."""
    name = topic.encode()
    body = len(name).to_bytes(2) + name + mid.to_bytes(2) + bytes((len(props),)) + props + payload
    return bytes((0x32, len(body))) + body  # a body under 128 bytes


def identifier_property() -> bytes:
    """The property of the Subscription Identifier of ``sensors/#`` (a variable byte
    integer after the property's id, 0x0B)."""
    from ingest.mqtt.subscriptions import identifier  # noqa: PLC0415 - with the flag only

    value, out = identifier("sensors/#"), bytearray((0x0B,))
    while True:
        value, byte = value >> 7, value & 0x7F
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def buffer(props: bytes = b"") -> tuple[bytes, int]:
    """As many whole packets as fit in :data:`BUFFER` bytes, and how many."""
    packets: list[bytes] = []
    size = i = 0
    while True:
        sensor, seq = i % 1000, i // 1000
        packet = publish(
            f"sensors/s{sensor:05d}/readings",
            (
                f'{{"ts":{1_790_000_000 + seq},"seq":{seq},'
                f'"temp":{18 + (seq * 7 + sensor) % 100 / 10:.1f},'
                f'"hum":{40 + (seq + sensor) % 30}}}'
            ).encode(),
            i % 0xFFFF + 1,
            props,
        )
        if size + len(packet) > BUFFER:
            return b"".join(packets), len(packets)
        packets.append(packet)
        size += len(packet)
        i += 1


class Reader:
    """The position and pause flag :func:`wire.scan` reads and moves."""

    def __init__(self) -> None:
        self._pos = 0
        self._paused = False


def nothing(
    _topic: str,
    _payload: bytes,
    _mid: int,
    _qos: int,
    _dup: bool,
    _retain: bool,
    _subscription: wire.Subscription,
) -> None:
    """A delivery that does nothing: what is measured is the scan itself."""


def best(
    scan: Callable[[bytes, Reader, wire.Deliver], int], data: bytes, count: int, repeat: int
) -> float:
    """Seconds per packet of one round: ``repeat`` scans of the whole buffer."""
    start = time.perf_counter()
    for _ in range(repeat):
        reader = Reader()
        if scan(data, reader, nothing) != count:
            raise AssertionError("the scan did not take every packet")
    return (time.perf_counter() - start) / (repeat * count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=20, help="scans of the buffer a round")
    parser.add_argument(
        "--subscription-identifier",
        action="store_true",
        help="packets carry the identifier of the subscription to sensors/#",
    )
    args = parser.parse_args()
    data, count = buffer(identifier_property() if args.subscription_identifier else b"")
    twins = {
        "python": _wire_py.scan,
        "compiled": importlib.import_module("ingest.mqtt._wire_c").scan,
    }
    times: dict[str, list[float]] = {name: [] for name in twins}
    for _ in range(args.rounds):
        for name, scan in twins.items():
            times[name].append(best(scan, data, count, args.repeat))
    python, compiled = min(times["python"]), min(times["compiled"])
    print(f"{count} packets in {len(data)} bytes, best of {args.rounds} rounds:")
    print(f"  python   {python * 1e9:7.1f} ns/packet")
    print(
        f"  compiled {compiled * 1e9:7.1f} ns/packet ({compiled / python:.2f} of python, "
        f"{python / compiled:.1f}x faster)"
    )


if __name__ == "__main__":
    main()

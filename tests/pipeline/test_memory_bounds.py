"""A fleet larger than --max-cached-series: the caches stay at the bound, the data exact.

The daemon remembers each sensor's last arrival time so that readings without their own
time never meet at one instant; with many more sensors than it may remember, it must
forget only what no longer matters. Readings of a sensor given times ahead of the clock
(several in one message) and a second message of that sensor right after, with other
sensors in between that fill the cache, must each be stored once, at distinct instants.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import orjson
import pytest

from ingest.devices import _decode_py, decode
from tests.support.mongo import COLLECTION, instants
from tests.support.procs import eventually

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.support.procs import Daemon

pytestmark = pytest.mark.process

CAP = 9  # odd: the cache fills between a sensor's two messages (see the order below)
SENSORS = 20
PER_MESSAGE = 25  # readings without a time in one message: 25 ms ahead of the clock
LATE_SENSORS = 30  # one message each, a few ms apart, after the burst


def burst(root: str) -> list[tuple[str, bytes]]:
    """Sensors in pairs: the first messages of both, then the second messages of both."""
    out: list[tuple[str, bytes]] = []
    for first in range(0, SENSORS, 2):
        for message in (0, 1):
            for sensor in (first, first + 1):
                values = [{"v": message * PER_MESSAGE + i} for i in range(PER_MESSAGE)]
                out.append((f"{root}/s{sensor:03d}/readings", orjson.dumps(values)))
    return out


def cached(daemon: Daemon) -> dict[str, float]:
    """``ingest_cached_entries`` by cache."""
    return {
        key.split('"')[1]: value
        for key, value in daemon.metrics().items()
        if key.startswith("ingest_cached_entries{")
    }


async def test_a_fleet_beyond_the_cache_bound_is_stored_exactly_once(
    daemon: Callable[..., Daemon],
    publish: Any,
    db: Any,
    topic_root: str,
    mode: str,
) -> None:
    proc = daemon("--max-cached-series", str(CAP))
    messages = burst(topic_root)
    await publish(messages)
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == len(messages), 180)
    # then sensors a few milliseconds apart: what the clock has passed is forgotten
    late = [(f"{topic_root}/late{n:03d}/readings", b'{"v": 1}') for n in range(LATE_SENSORS)]
    for message in late:
        await publish([message])
        await asyncio.sleep(0.005)
    total = len(messages) + len(late)
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == total, 180)

    metrics = proc.metrics()
    assert metrics.get('ingest_readings_rejected_total{reason="ts_conflict"}', 0) == 0
    stored = await instants(db[COLLECTION[mode]], mode)  # fails on an instant stored twice
    readings = SENSORS * 2 * PER_MESSAGE + LATE_SENSORS
    assert len(stored) == readings
    by_sensor: dict[str, list[Any]] = {}
    for (sensor, _, _), fields in stored.items():
        by_sensor.setdefault(sensor, []).append(fields["v"])
    assert all(
        sorted(by_sensor[f"s{s:03d}"]) == list(range(2 * PER_MESSAGE)) for s in range(SENSORS)
    )
    assert metrics[f'ingest_readings_written_total{{mode="{mode}"}}'] == readings

    sizes = cached(proc)
    # checked ids: the first CAP sensors, then no more (compiled: checked in C, none held)
    assert sizes["sensor_ids"] == (CAP if decode.decode is _decode_py.decode else 0)
    assert 0 < sizes["topic_checksums"] <= CAP  # each message's topic (the ledger's)
    assert 0 < sizes["arrival_times"] <= CAP  # the late sensors came ms apart: all passed
    assert sizes["mapped_topics"] == 0  # no mapping rules

"""``--workers 2``: one series-instant is stored once, whichever worker takes it.

The shared group gives a message and its copy, published back to back, to the two
workers, which write them within milliseconds of each other. A time-series collection
has no unique index, so it is the claims (ingest/store/writers/claims.py) that decide
which worker stores the instant: the other finds it claimed and counts a duplicate, or
refuses a conflicting value as ``ts_conflict``. Bucket mode's conditional upserts decide
the same on the bucket document; both layouts end alike.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import aiohttp

from tests.api.test_api import serving
from tests.support.mongo import COLLECTION, instants, stored
from tests.support.procs import eventually

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.support.procs import Daemon

SENSORS = 10
READINGS = 100
WINDOW = "since=2026-01-01T00:00:00Z&until=2026-01-01T00:01:00Z"


def message(topic_root: str, n: int, temp: float) -> tuple[str, str]:
    """Reading ``n``: one of 10 sensors at one of 10 seconds (each (sensor, second) once)."""
    sensor, second = n % SENSORS, n // SENSORS
    payload = {"sensor_id": f"s{sensor}", "ts": f"2026-01-01T00:00:{second:02d}Z", "temp": temp}
    return f"{topic_root}/s{sensor}", json.dumps(payload)


async def settled(proc: Daemon, messages: int) -> dict[str, float]:
    """The daemon's metrics once every message is acknowledged."""
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == messages, timeout=60)
    return proc.metrics()


async def test_a_reading_published_twice_is_stored_once_by_two_workers(
    daemon: Callable[..., Daemon], publish: Callable[..., Any], db: Any, topic_root: str, mode: str
) -> None:
    proc = daemon("--workers", "2")
    copies = []
    for n in range(READINGS):  # each message then its copy: the group splits the pair
        copies += [message(topic_root, n, float(n))] * 2
    await publish(copies)
    metrics = await settled(proc, 2 * READINGS)
    assert await stored(db, mode) == READINGS
    assert metrics[f'ingest_duplicate_readings_total{{mode="{mode}"}}'] == READINGS
    kept = await instants(db[COLLECTION[mode]], mode)
    assert sorted(v["temp"] for v in kept.values()) == [float(n) for n in range(READINGS)]
    assert proc.stop() == 0


async def test_conflicting_values_of_one_instant_store_one_and_refuse_the_other(
    daemon: Callable[..., Daemon],
    publish: Callable[..., Any],
    db: Any,
    mongo: Any,
    db_name: str,
    topic_root: str,
    mode: str,
) -> None:
    proc = daemon("--workers", "2")
    pairs = []
    for n in range(READINGS):
        pairs += [message(topic_root, n, float(n)), message(topic_root, n, 1000.0 + n)]
    await publish(pairs)
    metrics = await settled(proc, 2 * READINGS)
    assert metrics['ingest_readings_rejected_total{reason="ts_conflict"}'] == READINGS
    assert await stored(db, mode) == READINGS
    refused = await db.rejects.find({"reason": "ts_conflict"}).to_list()
    assert len(refused) == READINGS
    # each instant holds one of its two values, and its reject the other
    kept = {
        (sensor, ms): fields["temp"]
        for (sensor, _, ms), fields in (await instants(db[COLLECTION[mode]], mode)).items()
    }
    other = {}
    for doc in refused:
        payload = json.loads(doc["payload"])
        n = int(payload["sensor_id"][1:]) + SENSORS * int(payload["ts"][17:19])
        other[n] = payload["temp"]
    assert sorted(other) == list(range(READINGS))
    assert sorted(kept.values()) != sorted(other.values())
    assert sorted([*kept.values(), *other.values()]) == sorted(
        [float(n) for n in range(READINGS)] + [1000.0 + n for n in range(READINGS)]
    )
    assert proc.stop() == 0

    # the read API counts what it lists
    sensors = "&".join(f"sensor=s{i}" for i in range(SENSORS))
    async with serving(mongo, db_name, mode) as api, aiohttp.ClientSession() as http:
        async with http.get(f"{api}/api/readings?{sensors}&{WINDOW}&limit=1000") as resp:
            listed = (await resp.json())["readings"]
        async with http.get(
            f"{api}/api/series?{sensors}&{WINDOW}&measurement=temp&step=1m"
        ) as resp:
            series = (await resp.json())["series"]
    assert len(listed) == READINGS
    assert sum(point["count"] for s in series for point in s["points"]) == READINGS

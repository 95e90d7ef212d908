"""bench.stored's documents are the daemon's: same fields, same statistics, in both layouts.

The same fleet readings go through mosquitto into the real daemon, and through
bench.stored both ways it loads them: into an emulator of the benchmark's own (its
in-process ``insert_many``) and with ``insert_many`` over the wire, as into a MongoDB
server. The documents read back must be equal, less their ``_id``: a change to what a
writer stores, or to the statements the bucket writer sends, fails here before a
benchmark measures documents the daemon would not store.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import pytest
from bson.objectid import ObjectId
from pymongo import AsyncMongoClient

from bench import stored
from bench.fleet import COLLECTIONS, Store, fleet
from tests.support.procs import eventually, start_emulator, stop_emulator

if TYPE_CHECKING:
    from collections.abc import Callable

    from ingest.model import Reading
    from tests.support.procs import Daemon

SENSORS, HOURS, INTERVAL = 3, 2, 600  # 36 readings, 6 buckets of 6 readings each


def normal(doc: dict[str, Any]) -> dict[str, Any]:
    """A stored document without its ``_id``, its readings in time order."""
    out = {k: v for k, v in doc.items() if k != "_id"}
    if "readings" in out:
        out["readings"] = sorted(out["readings"], key=lambda r: r["ts"])
    return out


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal documents; a bucket's sums within rounding (a daemon may add its readings in
    another order when two of its batches meet in one bucket)."""
    if "stats" not in a or "stats" not in b or a["stats"].keys() != b["stats"].keys():
        return a == b
    sums_close = all(
        math.isclose(a["stats"][m]["sum"], b["stats"][m]["sum"], rel_tol=1e-12) for m in a["stats"]
    )
    unsummed = [
        {**doc, "stats": {m: {**s, "sum": 0.0} for m, s in doc["stats"].items()}} for doc in (a, b)
    ]
    return sums_close and unsummed[0] == unsummed[1]


async def documents(db: Any, mode: str) -> list[dict[str, Any]]:
    """A layout's stored documents, in series and time order."""
    order = (
        [("sensor_id", 1), ("bucket_start", 1)]
        if mode == "bucket"
        else [("meta.sensor_id", 1), ("ts", 1)]
    )
    return [normal(d) for d in await db[COLLECTIONS[mode]].find().sort(order).to_list()]


def messages(topic_root: str, readings: list[Reading]) -> list[tuple[str, str]]:
    """One message a reading, in the fleet's order (every sensor, step by step)."""
    return [
        (
            f"{topic_root}/{r.sensor_id}/readings",
            json.dumps({"ts": int(r.epoch), "seq": r.seq, **r.values}),
        )
        for r in readings
    ]


@pytest.mark.process
async def test_the_fast_loader_stores_what_the_daemon_stores(
    mode: str,
    daemon: Callable[..., Daemon],
    publish: Callable[..., Any],
    topic_root: str,
    db: Any,
    mongo: AsyncMongoClient[dict[str, Any]],
) -> None:
    readings = fleet(SENSORS, HOURS, INTERVAL, seed=7)
    proc = daemon("--collection", COLLECTIONS[mode])
    await publish(messages(topic_root, readings))
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == len(readings))
    by_daemon = await documents(db, mode)
    assert len(by_daemon) == (SENSORS * HOURS if mode == "bucket" else len(readings))

    wire = mongo[f"{db.name}_wire"]
    try:
        await stored.load(Store(wire, None), readings, (mode,))
        over_wire = await documents(wire, mode)
    finally:
        await mongo.drop_database(wire.name)
    emulator, uri = start_emulator(loads=True)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, tz_aware=True)
    try:
        await stored.load(Store(client.bench, emulator), readings, (mode,))
        preloaded = await documents(client.bench, mode)
    finally:
        await client.close()
        stop_emulator(emulator)

    for loaded in (over_wire, preloaded):
        assert len(loaded) == len(by_daemon)
        for ours, theirs in zip(loaded, by_daemon, strict=True):
            assert same(ours, theirs), (ours, theirs)


def test_an_upsert_of_another_shape_is_refused() -> None:
    statement = {
        "q": {"sensor_id": "s", "tags": {}, "count": {"$lte": 3599}},
        "u": {"$push": {"readings": {"$each": [{"ts": 1}]}}, "$inc": {"count": 1}},
    }
    assert stored.upserted_document(statement, ObjectId("0" * 24)) == {
        "_id": ObjectId("0" * 24),
        "sensor_id": "s",
        "tags": {},
        "readings": [{"ts": 1}],
        "count": 1,
    }
    for other in (
        {"$addToSet": {"readings": {"ts": 2}}},
        {"$push": {"readings": {"ts": 2}}},
        {"$inc": {"sensor_id": 1}},
    ):
        with pytest.raises(ValueError, match="upserted_document"):
            stored.upserted_document({"q": statement["q"], "u": other}, ObjectId())

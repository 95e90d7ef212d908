"""MongoDB helpers for tests: fail points and small queries."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import pytest
from pymongo.errors import OperationFailure

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


@contextlib.asynccontextmanager
async def failpoint(
    client: Any, commands: list[str], mode: Any = "alwaysOn", code: int = 91
) -> AsyncIterator[None]:
    """Make the server fail ``commands`` with ``code`` (91: ShutdownInProgress, transient).

    Needs ``configureFailPoint``: the emulator has it; a real mongod needs
    ``--setParameter enableTestCommands=1`` (the compose test profile sets it).
    """
    try:
        await client.admin.command(
            {
                "configureFailPoint": "failCommand",
                "mode": mode,
                "data": {"failCommands": commands, "errorCode": code},
            }
        )
    except OperationFailure as exc:
        pytest.skip(f"server has no failCommand fail point: {exc}")
    try:
        yield
    finally:
        await client.admin.command({"configureFailPoint": "failCommand", "mode": "off"})


COLLECTION = {"bucket": "buckets", "timeseries": "readings"}


async def stored(db: Any, mode: str) -> int:
    """Readings stored by a daemon in ``mode`` (bucket counts, or time-series documents)."""
    coll = db[COLLECTION[mode]]
    if mode == "timeseries":
        return int(await coll.count_documents({}))
    docs = await coll.find({}, {"count": 1}).to_list()
    return sum(int(d["count"]) for d in docs)


async def stored_values(db: Any, mode: str, field: str) -> list[Any]:
    """Every stored value of one measurement, sorted, in either layout."""
    coll = db[COLLECTION[mode]]
    if mode == "timeseries":
        docs = await coll.find({field: {"$exists": True}}).to_list()
        return sorted(d[field] for d in docs)
    docs = await coll.find({}).to_list()
    return sorted(r[field] for d in docs for r in d["readings"] if field in r)


type Instant = tuple[str, tuple[tuple[str, str], ...], int]


async def instants(coll: Any, mode: str) -> dict[Instant, dict[str, Any]]:
    """What a reader gets back: the fields stored at each (sensor, tags, millisecond).

    A bucket entry is one instant; in time-series mode several documents of one series
    and instant are one reading (their fields merged, the first document's first). Fails
    if an instant (bucket) or a field of one (time series) is stored twice.
    """
    out: dict[Instant, dict[str, Any]] = {}
    if mode == "bucket":
        async for doc in coll.find({}):
            for entry in doc["readings"]:
                key = (doc["sensor_id"], _tags_key(doc["tags"]), _ms(entry["ts"]))
                assert key not in out, f"instant stored twice: {key}"
                out[key] = {k: v for k, v in entry.items() if k not in {"ts", "seq"}}
        return out
    async for doc in coll.find({}).sort("_id"):
        meta = doc["meta"]
        tags = {k: v for k, v in meta.items() if k != "sensor_id"}
        fields = out.setdefault((meta["sensor_id"], _tags_key(tags), _ms(doc["ts"])), {})
        for name, value in doc.items():
            if name in {"_id", "ts", "meta", "seq", "units", "info"}:
                continue
            assert name not in fields, f"field {name} stored twice at {meta} {doc['ts']}"
            fields[name] = value
    return out


def _tags_key(tags: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(tags.items()))


def _ms(ts: Any) -> int:
    return round(float(ts.timestamp()) * 1000)

"""Bucket mode: one document per sensor per span, upserted with running statistics.

A batch is coalesced so that all readings of one sensor-span become one ``UpdateOne``
(``$push``/``$each``, ``$inc``, ``$min``, ``$max``, ``$setOnInsert``), all sent in one
unordered ``bulk_write``. A document never holds more than ``max_readings``: the filter
only matches a document with room for the whole group (``count <= max - n``); otherwise
the upsert starts a new document with the same ``sensor_id`` and ``bucket_start``.
The match and the update are one atomic step per document, so concurrent writers never
overfill a document; at worst they start two documents for one span, which readers sum.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pymongo import UpdateOne

from ingest.writers import Outcome, Plan, send

if TYPE_CHECKING:
    from pymongo.asynchronous.collection import AsyncCollection

    from ingest.model import Reading
    from ingest.schema import Schema

logger = logging.getLogger(__name__)
SCHEMA_VERSION = 1
# Estimated BSON bytes of readings one document may hold: half of MongoDB's 16 MiB limit,
# so the estimate can be off by 2x and an update still fits.
MAX_BUCKET_BYTES = 8 * 1024 * 1024


def reading_bytes(reading: Reading) -> int:
    """Upper estimate of a reading's BSON size inside the ``readings`` array."""
    # array index key and sub-document framing ~16, ts 12, seq 13, each value 10 + name
    values = reading.values
    return 41 + 10 * len(values) + sum(map(len, values))


def group_readings(readings: list[Reading], span: int) -> dict[tuple[str, float], list[Reading]]:
    """Group readings by sensor and span, keeping arrival order inside each group."""
    groups: dict[tuple[str, float], list[Reading]] = {}
    for reading in readings:
        key = (reading.sensor_id, reading.epoch // span * span)
        group = groups.get(key)
        if group is None:
            groups[key] = [reading]
        else:
            group.append(reading)
    return groups


def reading_doc(reading: Reading) -> dict[str, Any]:
    """The sub-document pushed into ``readings``."""
    doc: dict[str, Any] = {"ts": reading.ts}
    if reading.seq is not None:
        doc["seq"] = reading.seq
    doc.update(reading.values)
    return doc


def chunks(group: list[Reading], max_readings: int) -> list[tuple[list[Reading], int]]:
    """Split one sensor-span's readings so each piece fits one document: (readings, bytes)."""
    out: list[tuple[list[Reading], int]] = []
    chunk: list[Reading] = []
    size = 0
    for reading in group:
        grow = reading_bytes(reading)
        if chunk and (len(chunk) >= max_readings or size + grow > MAX_BUCKET_BYTES):
            out.append((chunk, size))
            chunk, size = [], 0
        chunk.append(reading)
        size += grow
    if chunk:
        out.append((chunk, size))
    return out


def update_for(sensor_id: str, start: datetime, chunk: list[Reading], max_readings: int,
               size: int) -> UpdateOne:
    """One upsert that appends ``chunk`` to a document of that sensor-span with room for it.

    Room means both fewer than ``max_readings - n`` readings and fewer than
    ``MAX_BUCKET_BYTES - size`` estimated bytes, so no document outgrows MongoDB's limit.
    """
    acc: dict[str, list[Any]] = {}  # name -> [count, sum, min, max]
    for reading in chunk:
        for name, value in reading.values.items():
            stat = acc.get(name)
            if stat is None:
                acc[name] = [1, float(value), value, value]
                continue
            stat[0] += 1
            stat[1] += value
            if value < stat[2]:
                stat[2] = value
            elif value > stat[3]:
                stat[3] = value
    inc: dict[str, Any] = {"count": len(chunk), "bytes": size}
    mins: dict[str, Any] = {"first_ts": min(r.ts for r in chunk)}
    maxs: dict[str, Any] = {"last_ts": max(r.ts for r in chunk)}
    for name, (count, total, low, high) in acc.items():
        inc[f"stats.{name}.count"] = count
        inc[f"stats.{name}.sum"] = total
        mins[f"stats.{name}.min"] = low
        maxs[f"stats.{name}.max"] = high
    return UpdateOne(
        {"sensor_id": sensor_id, "bucket_start": start,
         "count": {"$lte": max_readings - len(chunk)},
         "bytes": {"$lte": max(MAX_BUCKET_BYTES - size, 0)}},
        {"$push": {"readings": {"$each": [reading_doc(r) for r in chunk]}},
         "$inc": inc, "$min": mins, "$max": maxs,
         "$setOnInsert": {"schema_version": SCHEMA_VERSION}},
        upsert=True,
    )


class BucketWriter:
    """Writes coalesced bucket upserts."""

    mode = "bucket"

    def __init__(self, collection: AsyncCollection[dict[str, Any]], schema: Schema,
                 span_seconds: int, max_readings: int) -> None:
        self._collection = collection
        self._schema = schema
        self._span = span_seconds
        self._max = max_readings

    async def ensure_schema(self) -> None:
        """Create the bucket collection, its validator and indexes."""
        await self._schema.ensure_buckets()

    def plan(self, readings: list[Reading]) -> Plan:
        """Coalesce a batch into one upsert per sensor-span (more only past the cap)."""
        ops: list[Any] = []
        groups: list[list[Reading]] = []
        for (sensor_id, start), group in group_readings(readings, self._span).items():
            start_dt = datetime.fromtimestamp(start, UTC)
            for chunk, size in chunks(group, self._max):
                ops.append(update_for(sensor_id, start_dt, chunk, self._max, size))
                groups.append(chunk)
        return Plan(ops, groups)

    async def write(self, plan: Plan) -> Outcome:
        """Send the plan in one unordered bulk_write."""
        return await send(self._collection.bulk_write(plan.ops, ordered=False), plan)

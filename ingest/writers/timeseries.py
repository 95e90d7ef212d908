"""Time-series mode (the bridge): one document per reading in a native time-series collection.

Documents are ``{"ts", "meta": {"sensor_id", <tags>?}, "seq"?, "units"?, <measurements in
name order>}``:
a stable field order and no null or empty fields, because a change of a field's type
closes MongoDB's internal bucket early. A batch is sorted by sensor and time and sent with
one unordered ``insert_many`` so MongoDB's bucket catalog fills buckets densely. A partial
failure retries only the documents that failed with a transient error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ingest.writers import Outcome, Plan, send

if TYPE_CHECKING:
    from pymongo.asynchronous.collection import AsyncCollection

    from ingest.model import Reading
    from ingest.schema import Schema


def reading_document(reading: Reading) -> dict[str, Any]:
    """The time-series document for one reading."""
    meta: dict[str, Any] = {"sensor_id": reading.sensor_id}
    if reading.tags:  # in name order: a meta field order is part of the series
        tags = reading.tags
        for key in sorted(tags):
            meta[key] = tags[key]
    doc: dict[str, Any] = {"ts": reading.ts, "meta": meta}
    if reading.seq is not None:
        doc["seq"] = reading.seq
    if reading.units is not None:
        doc["units"] = dict(sorted(reading.units.items()))
    values = reading.values
    for name in sorted(values):
        doc[name] = values[name]
    return doc


class TimeseriesWriter:
    """Inserts one document per reading."""

    mode = "timeseries"

    def __init__(self, collection: AsyncCollection[dict[str, Any]], schema: Schema) -> None:
        self._collection = collection
        self._schema = schema

    async def ensure_schema(self) -> None:
        """Create (or check) the time-series collection and its index."""
        await self._schema.ensure_timeseries()

    def plan(self, readings: list[Reading]) -> Plan:
        """One document per reading, sorted by sensor and time."""
        ordered = sorted(readings, key=lambda r: (r.sensor_id, r.epoch))
        return Plan([reading_document(r) for r in ordered], [[r] for r in ordered])

    async def write(self, plan: Plan) -> Outcome:
        """Send the plan in one unordered insert_many."""
        return await send(self._collection.insert_many(plan.ops, ordered=False), plan)

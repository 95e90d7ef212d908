"""The natural queries of each storage mode, shared by docs/documents.md, tests, benchmarks.

Each function returns an aggregation pipeline for one collection. The bucket pipelines
sum across all documents of a sensor-hour, since a full hour can span several documents
(``--bucket-max-readings``). A sensor id is only ever compared in a query filter, where a
string is data; a measurement name becomes part of field paths, so it must be a name.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from ingest.model import NAME_PATTERN

type Pipeline = list[dict[str, Any]]
_NAME = re.compile(f"^{NAME_PATTERN}$")


def _measurement(field: str) -> str:
    """``field`` if it is a measurement name; a ``$`` or a dot would change the paths."""
    if not _NAME.match(field):
        raise ValueError(f"{field[:40]!r} is not a measurement name ({NAME_PATTERN})")
    return field


def recent_bucket(
    sensor_id: str, since: datetime, until: datetime, span_seconds: int = 3600
) -> Pipeline:
    """One sensor's readings in ``[since, until)``, oldest first, from bucket documents."""
    first_bucket = since - timedelta(seconds=since.timestamp() % span_seconds)
    return [
        {"$match": {"sensor_id": sensor_id, "bucket_start": {"$gte": first_bucket, "$lt": until}}},
        {"$unwind": "$readings"},
        {"$match": {"readings.ts": {"$gte": since, "$lt": until}}},
        {"$replaceWith": "$readings"},
        {"$sort": {"ts": 1}},
    ]


def recent_timeseries(sensor_id: str, since: datetime, until: datetime) -> Pipeline:
    """One sensor's readings in ``[since, until)``, oldest first, from a time-series collection."""
    return [
        {"$match": {"meta.sensor_id": sensor_id, "ts": {"$gte": since, "$lt": until}}},
        {"$sort": {"ts": 1}},
        {"$project": {"_id": 0, "meta": 0}},
    ]


def hourly_bucket(field: str, since: datetime, until: datetime) -> Pipeline:
    """Per sensor and hour: min, average and max of ``field``, from the running statistics."""
    stats = f"$stats.{_measurement(field)}"
    return [
        {
            "$match": {
                "bucket_start": {"$gte": since, "$lt": until},
                f"stats.{field}": {"$exists": True},
            }
        },
        {
            "$group": {
                "_id": {"sensor_id": "$sensor_id", "hour": "$bucket_start"},
                "count": {"$sum": f"{stats}.count"},
                "sum": {"$sum": f"{stats}.sum"},
                "min": {"$min": f"{stats}.min"},
                "max": {"$max": f"{stats}.max"},
            }
        },
        {
            "$project": {
                "_id": 0,
                "sensor_id": "$_id.sensor_id",
                "hour": "$_id.hour",
                "count": 1,
                "min": 1,
                "max": 1,
                "avg": {"$divide": ["$sum", "$count"]},
            }
        },
        {"$sort": {"sensor_id": 1, "hour": 1}},
    ]


def hourly_timeseries(field: str, since: datetime, until: datetime) -> Pipeline:
    """Per sensor and hour: min, average and max of ``field``, from raw readings."""
    _measurement(field)
    return [
        {"$match": {"ts": {"$gte": since, "$lt": until}, field: {"$exists": True}}},
        {
            "$group": {
                "_id": {
                    "sensor_id": "$meta.sensor_id",
                    "hour": {"$dateTrunc": {"date": "$ts", "unit": "hour"}},
                },
                "count": {"$sum": 1},
                "avg": {"$avg": f"${field}"},
                "min": {"$min": f"${field}"},
                "max": {"$max": f"${field}"},
            }
        },
        {
            "$project": {
                "_id": 0,
                "sensor_id": "$_id.sensor_id",
                "hour": "$_id.hour",
                "count": 1,
                "min": 1,
                "max": 1,
                "avg": 1,
            }
        },
        {"$sort": {"sensor_id": 1, "hour": 1}},
    ]

"""The read API's queries: pure pipeline builders for both layouts, and their answers' shape.

Every question has a builder per layout and one function that turns what MongoDB returns
into the API's answer, so both layouts give the same answer to the same question:

- sensors: who reported in ``[since, until)``, how many readings, which measurements,
  the last time seen, tags and units;
- readings: raw readings of some sensors in a window, ordered by sensor then time, paged
  with a cursor;
- series: min/avg/max/count per step. Bucket mode sums its precomputed statistics when
  the step is a whole multiple of the bucket span; otherwise (and in timeseries mode)
  raw readings are aggregated. The window is widened to whole steps, so both ways cover
  exactly the same readings.

Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ingest.queries import Pipeline

# Fields of a stored reading that are not measurements (bucket entries and time-series
# documents; ``units`` is per document in time-series mode).
NOT_MEASUREMENTS = frozenset({"_id", "ts", "seq", "meta", "units", "sensor_id"})
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Layout:
    """Which collection layout is read, and bucket mode's document span."""

    mode: str  # "bucket" | "timeseries"
    span_seconds: int = 3600

    @property
    def bucket(self) -> bool:
        """Whether this is bucket mode."""
        return self.mode == "bucket"


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a page of readings ended.

    The last sensor and time, and how many readings of that sensor at exactly that time
    were already returned (time-series mode may hold several).
    """

    sensor_id: str
    ts_ms: int
    seen_at_ts: int = 1

    @property
    def ts(self) -> datetime:
        """The cursor's time as a datetime."""
        return from_ms(self.ts_ms)


def to_ms(ts: datetime) -> int:
    """Whole milliseconds since the epoch (floored), as BSON stores a date."""
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return (ts - _EPOCH) // timedelta(milliseconds=1)


def from_ms(ms: int) -> datetime:
    """A UTC datetime from milliseconds since the epoch."""
    return _EPOCH + timedelta(milliseconds=ms)


def floor_ms(ts: datetime, step_ms: int) -> datetime:
    """``ts`` rounded down to a multiple of ``step_ms`` since the epoch."""
    ms = to_ms(ts)
    return from_ms(ms - ms % step_ms)


def floor_to(ts: datetime, seconds: int) -> datetime:
    """``ts`` rounded down to a multiple of ``seconds`` since the epoch."""
    return floor_ms(ts, seconds * 1000)


def ceil_ms(ts: datetime, step_ms: int) -> datetime:
    """``ts`` rounded up to a multiple of ``step_ms`` since the epoch."""
    ms = to_ms(ts)
    return from_ms(-(-ms // step_ms) * step_ms)


def _bin(field: str, step_ms: int) -> dict[str, Any]:
    """The start of the step that ``field`` (a date) falls in, aligned to the epoch."""
    as_ms = {"$toLong": field}
    return {"$toDate": {"$subtract": [as_ms, {"$mod": [as_ms, step_ms]}]}}


def _numeric(field: str) -> dict[str, Any]:
    """A value as a number: numbers as they are, booleans as 0/1, anything else null."""
    return {"$switch": {"branches": [
        {"case": {"$isNumber": field}, "then": field},
        {"case": {"$eq": [{"$type": field}, "bool"]}, "then": {"$cond": [field, 1, 0]}},
    ], "default": None}}


def _keys(expr: Any) -> dict[str, Any]:  # noqa: ANN401 - any object expression
    """The field names of an object expression."""
    return {"$map": {"input": {"$objectToArray": expr}, "in": "$$this.k"}}


def _union(expr: str | dict[str, Any]) -> dict[str, Any]:
    """The union of an array of arrays."""
    return {"$reduce": {"input": expr, "initialValue": [],
                        "in": {"$setUnion": ["$$value", "$$this"]}}}


def _in_window(field: str, since: datetime, until: datetime) -> dict[str, Any]:
    return {"$and": [{"$gte": [field, since]}, {"$lt": [field, until]}]}


# -- sensors ------------------------------------------------------------------------------

def sensors(layout: Layout, since: datetime, until: datetime, after: str | None,
            limit: int) -> Pipeline:
    """Sensors with readings in ``[since, until)``, by id, after ``after``, ``limit + 1``."""
    if layout.bucket:
        return _sensors_bucket(layout.span_seconds, since, until, after, limit)
    return _sensors_timeseries(since, until, after, limit)


def _sensors_bucket(span: int, since: datetime, until: datetime, after: str | None,
                    limit: int) -> Pipeline:
    match: dict[str, Any] = {"bucket_start": {"$gte": floor_to(since, span), "$lt": until}}
    if after is not None:
        match["sensor_id"] = {"$gt": after}
    inside = {"$filter": {"input": "$readings", "as": "r",
                          "cond": _in_window("$$r.ts", since, until)}}
    return [
        {"$match": match},
        {"$project": {"_id": 0, "sensor_id": 1, "tags": 1, "units": 1, "r": inside}},
        {"$match": {"r.0": {"$exists": True}}},
        {"$project": {
            "sensor_id": 1, "tags": 1, "units": 1, "n": {"$size": "$r"},
            "last": {"$reduce": {"input": "$r", "initialValue": None,
                                 "in": {"$max": ["$$value", "$$this.ts"]}}},
            "names": {"$reduce": {"input": "$r", "initialValue": [],
                                  "in": {"$setUnion": ["$$value", _keys("$$this")]}}},
        }},
        *_sensor_groups("$sensor_id", "$tags", "$n", "$last", "$names", limit),
    ]


def _sensors_timeseries(since: datetime, until: datetime, after: str | None,
                        limit: int) -> Pipeline:
    match: dict[str, Any] = {"ts": {"$gte": since, "$lt": until}}
    if after is not None:
        match["meta.sensor_id"] = {"$gt": after}
    return [
        {"$match": match},
        {"$project": {"_id": 0, "meta": 1, "ts": 1, "units": 1, "names": _keys("$$ROOT")}},
        *_sensor_groups("$meta.sensor_id", "$meta", 1, "$ts", "$names", limit),
    ]


def _sensor_groups(sensor: str, tags: str, count: Any, last: str, names: str,  # noqa: ANN401
                   limit: int) -> Pipeline:
    """Group by sensor and tags first (few groups), then by sensor: the latest tags win."""
    return [
        {"$group": {"_id": {"s": sensor, "tags": tags}, "n": {"$sum": count},
                    "last": {"$max": last}, "names": {"$addToSet": names},
                    "units": {"$mergeObjects": "$units"}}},
        {"$sort": {"last": 1}},
        {"$group": {"_id": "$_id.s", "readings": {"$sum": "$n"}, "last_seen": {"$max": "$last"},
                    "tags": {"$last": "$_id.tags"}, "names": {"$push": "$names"},
                    "units": {"$mergeObjects": "$units"}}},
        {"$sort": {"_id": 1}},
        {"$limit": limit + 1},
        {"$project": {"_id": 1, "readings": 1, "last_seen": 1, "tags": 1, "units": 1,
                      "names": _union(_union_each("$names"))}},
    ]


def _union_each(expr: str) -> dict[str, Any]:
    """Arrays of arrays of names -> arrays of names (one level flattened per group)."""
    return {"$map": {"input": expr, "in": _union("$$this")}}


def sensor_answer(doc: dict[str, Any]) -> dict[str, Any]:
    """One entry of the sensors answer."""
    tags = {k: v for k, v in (doc.get("tags") or {}).items() if k != "sensor_id"}
    units = doc.get("units") or {}
    measurements = sorted(set(doc["names"]) - NOT_MEASUREMENTS)
    return {"sensor_id": doc["_id"], "last_seen": iso(doc["last_seen"]),
            "readings": int(doc["readings"]), "measurements": measurements,
            "tags": dict(sorted(tags.items())),
            "units": {m: units[m] for m in measurements if m in units}}


# -- readings -----------------------------------------------------------------------------

def readings(layout: Layout, sensor_ids: list[str], since: datetime, until: datetime,
             measurements: list[str], cursor: Cursor | None, limit: int) -> Pipeline:
    """Raw readings of ``sensor_ids`` in ``[since, until)``, by sensor then time.

    Returns up to ``limit`` readings after ``cursor`` (plus the ones at the cursor's own
    time, which :func:`page_after` skips).
    """
    if layout.bucket:
        return _readings_bucket(layout.span_seconds, sensor_ids, since, until, measurements,
                                cursor, limit)
    return _readings_timeseries(sensor_ids, since, until, measurements, cursor, limit)


def _after(cursor: Cursor | None, sensor: str, ts: str, ts_low: datetime | None = None
           ) -> dict[str, Any]:
    if cursor is None:
        return {}
    low = cursor.ts if ts_low is None else ts_low
    return {"$or": [{sensor: cursor.sensor_id, ts: {"$gte": low}},
                    {sensor: {"$gt": cursor.sensor_id}}]}


def _has_any(prefix: str, measurements: list[str]) -> dict[str, Any]:
    if not measurements:
        return {}
    return {"$or": [{f"{prefix}{m}": {"$exists": True}} for m in measurements]}


def _readings_bucket(span: int, sensor_ids: list[str], since: datetime, until: datetime,
                     measurements: list[str], cursor: Cursor | None, limit: int) -> Pipeline:
    low = since if cursor is None else max(since, cursor.ts)
    first = {"sensor_id": {"$in": sensor_ids},
             "bucket_start": {"$gte": floor_to(since, span), "$lt": until},
             **_after(cursor, "sensor_id", "bucket_start", floor_to(low, span))}
    second: dict[str, Any] = {"readings.ts": {"$gte": since, "$lt": until}}
    conditions = [c for c in (_after(cursor, "sensor_id", "readings.ts"),
                              _has_any("readings.", measurements)) if c]
    if conditions:
        second = {"$and": [second, *conditions]}
    return [
        {"$match": first},
        {"$project": {"_id": 0, "sensor_id": 1, "readings": 1}},
        {"$unwind": "$readings"},
        {"$match": second},
        {"$sort": {"sensor_id": 1, "readings.ts": 1}},
        {"$limit": limit},
        {"$replaceWith": {"$mergeObjects": ["$readings", {"sensor_id": "$sensor_id"}]}},
    ]


def _readings_timeseries(sensor_ids: list[str], since: datetime, until: datetime,
                         measurements: list[str], cursor: Cursor | None, limit: int
                         ) -> Pipeline:
    match: dict[str, Any] = {"meta.sensor_id": {"$in": sensor_ids},
                             "ts": {"$gte": since, "$lt": until}}
    conditions = [c for c in (_after(cursor, "meta.sensor_id", "ts"),
                              _has_any("", measurements)) if c]
    if conditions:
        match = {"$and": [match, *conditions]}
    return [
        {"$match": match},
        {"$sort": {"meta.sensor_id": 1, "ts": 1}},
        {"$limit": limit},
        {"$addFields": {"sensor_id": "$meta.sensor_id"}},
        {"$project": {"_id": 0, "meta": 0}},
    ]


def reading_answer(doc: dict[str, Any], measurements: list[str]) -> dict[str, Any]:
    """One entry of the readings answer: sensor, time, seq if any, values (and units)."""
    values = {k: v for k, v in doc.items() if k not in NOT_MEASUREMENTS}
    if measurements:
        values = {m: values[m] for m in measurements if m in values}
    out: dict[str, Any] = {"sensor_id": doc["sensor_id"], "ts": iso(doc["ts"])}
    if doc.get("seq") is not None:
        out["seq"] = doc["seq"]
    out["values"] = dict(sorted(values.items()))
    return out


def page_after(docs: list[dict[str, Any]], cursor: Cursor | None, limit: int
               ) -> tuple[list[dict[str, Any]], Cursor | None]:
    """Drop the readings a previous page returned; cut to ``limit``; the next cursor."""
    if cursor is not None:
        skip = 0
        while (skip < len(docs) and skip < cursor.seen_at_ts
               and docs[skip]["sensor_id"] == cursor.sensor_id
               and to_ms(docs[skip]["ts"]) == cursor.ts_ms):
            skip += 1
        docs = docs[skip:]
    if len(docs) <= limit:
        return docs, None
    page = docs[:limit]
    last = page[-1]
    last_ms = to_ms(last["ts"])
    same = sum(1 for d in page if d["sensor_id"] == last["sensor_id"]
               and to_ms(d["ts"]) == last_ms)
    if (cursor is not None and cursor.sensor_id == last["sensor_id"]
            and cursor.ts_ms == last_ms):
        same += cursor.seen_at_ts
    return page, Cursor(last["sensor_id"], last_ms, same)


# -- series -------------------------------------------------------------------------------

def uses_stats(layout: Layout, step_ms: int) -> bool:
    """Whether a series of this step can be summed from bucket statistics."""
    return layout.bucket and step_ms % (layout.span_seconds * 1000) == 0


def series(layout: Layout, sensor_ids: list[str], measurements: list[str],
           since: datetime, until: datetime, step_ms: int) -> Pipeline:
    """Per sensor and step: count, sum, min and max of each measurement (``m<i>_*``).

    ``since`` and ``until`` must be whole steps (see :func:`floor_to`, :func:`ceil_ms`).
    """
    if uses_stats(layout, step_ms):
        return _series_stats(sensor_ids, measurements, since, until, step_ms)
    if layout.bucket:
        head: Pipeline = [
            {"$match": {"sensor_id": {"$in": sensor_ids},
                        "bucket_start": {"$gte": floor_to(since, layout.span_seconds),
                                         "$lt": until}}},
            {"$project": {"_id": 0, "sensor_id": 1, "readings": 1, "units": 1}},
            {"$unwind": "$readings"},
            {"$match": {"readings.ts": {"$gte": since, "$lt": until}}},
            {"$replaceWith": {"$mergeObjects": ["$readings", {"sensor_id": "$sensor_id",
                                                              "units": "$units"}]}},
        ]
    else:
        head = [
            {"$match": {"meta.sensor_id": {"$in": sensor_ids},
                        "ts": {"$gte": since, "$lt": until}}},
            {"$addFields": {"sensor_id": "$meta.sensor_id"}},
        ]
    values = {f"v{i}": _numeric(f"${m}") for i, m in enumerate(measurements)}
    units = {f"u{i}": f"$units.{m}" for i, m in enumerate(measurements)}
    group: dict[str, Any] = {"_id": {"s": "$sensor_id", "t": "$t"}}
    for i in range(len(measurements)):
        v = f"$v{i}"
        group |= {f"m{i}_count": {"$sum": {"$cond": [{"$isNumber": v}, 1, 0]}},
                  f"m{i}_sum": {"$sum": v}, f"m{i}_min": {"$min": v},
                  f"m{i}_max": {"$max": v}, f"m{i}_unit": {"$max": f"$u{i}"}}
    return [
        *head,
        {"$project": {"_id": 0, "sensor_id": 1, "t": _bin("$ts", step_ms), **values, **units}},
        {"$group": group},
        {"$sort": {"_id.s": 1, "_id.t": 1}},
    ]


def _series_stats(sensor_ids: list[str], measurements: list[str], since: datetime,
                  until: datetime, step_ms: int) -> Pipeline:
    group: dict[str, Any] = {"_id": {"s": "$sensor_id", "t": _bin("$bucket_start", step_ms)}}
    for i, m in enumerate(measurements):
        stats = f"$stats.{m}"
        group |= {f"m{i}_count": {"$sum": f"{stats}.count"}, f"m{i}_sum": {"$sum": f"{stats}.sum"},
                  f"m{i}_min": {"$min": f"{stats}.min"}, f"m{i}_max": {"$max": f"{stats}.max"},
                  f"m{i}_unit": {"$max": f"$units.{m}"}}
    return [
        {"$match": {"sensor_id": {"$in": sensor_ids},
                    "bucket_start": {"$gte": since, "$lt": until}}},
        {"$group": group},
        {"$sort": {"_id.s": 1, "_id.t": 1}},
    ]


def series_answer(docs: list[dict[str, Any]], sensor_ids: list[str], measurements: list[str]
                  ) -> list[dict[str, Any]]:
    """Group rows into one series per sensor and measurement that has data.

    Series come in the order asked for; steps without a value of that measurement are
    left out.
    """
    points: dict[tuple[str, int], list[dict[str, Any]]] = {}
    units: dict[tuple[str, int], str] = {}
    for doc in docs:
        sensor, t = doc["_id"]["s"], iso(doc["_id"]["t"])
        for i in range(len(measurements)):
            count = doc.get(f"m{i}_count") or 0
            if count <= 0:
                continue
            unit = doc.get(f"m{i}_unit")
            if isinstance(unit, str):
                units[sensor, i] = max(unit, units.get((sensor, i), unit))
            total = doc[f"m{i}_sum"]
            points.setdefault((sensor, i), []).append({
                "t": t, "count": int(count), "min": _plain(doc[f"m{i}_min"]),
                "avg": total / count, "max": _plain(doc[f"m{i}_max"]),
            })
    return [{"sensor_id": s, "measurement": m, "unit": units.get((s, i)), "points": points[s, i]}
            for s in sensor_ids for i, m in enumerate(measurements) if (s, i) in points]


def _plain(value: Any) -> Any:  # noqa: ANN401 - a stored number or boolean
    """Booleans as 0/1, as bucket statistics store them."""
    return int(value) if isinstance(value, bool) else value


# -- rejects ------------------------------------------------------------------------------

def rejects(since: datetime, limit: int) -> Pipeline:
    """The latest rejections since ``since``, newest first (no payload excerpts)."""
    return [
        {"$match": {"at": {"$gte": since}}},
        {"$sort": {"at": -1}},
        {"$limit": limit},
        {"$project": {"_id": 0, "at": 1, "mode": 1, "topic": 1, "reason": 1, "detail": 1,
                      "payload_bytes": 1}},
    ]


def reject_reasons(since: datetime) -> Pipeline:
    """Rejections since ``since`` counted by reason, most frequent first."""
    return [
        {"$match": {"at": {"$gte": since}}},
        {"$group": {"_id": "$reason", "count": {"$sum": 1}}},
        {"$sort": {"count": -1, "_id": 1}},
    ]


def iso(ts: datetime) -> str:
    """A stored time as ISO 8601 UTC with milliseconds and ``Z``."""
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return ts.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")

"""The read API's queries: pure pipeline builders for both layouts, and their answers' shape.

Every question has a builder per layout and one function that turns what MongoDB returns
into the API's answer, so both layouts give the same answer to the same question:

- sensors: the series (a sensor id and its identity tags) that reported in
  ``[since, until)``, how many readings, which measurements, the last time seen, units
  and descriptive tags (``info``);
- readings: raw readings of some series in a window, ordered by series then time, paged
  with a cursor. In timeseries mode the documents of one series and instant are merged
  into one reading (a field held by several: the first document by ``_id``);
- series: min/avg/max/count per series, measurement and step. Bucket mode sums its
  precomputed statistics when the step is a whole multiple of the bucket span; otherwise
  (and in timeseries mode) raw readings are aggregated. The window is widened to whole
  steps, so both ways cover exactly the same readings.

Series are ordered by sensor id, then tags as MongoDB compares objects (pair by pair, in
name order; fewer pairs first): bucket documents sort by ``{sensor_id, tags}``,
time-series documents by ``meta`` (``sensor_id`` first, then the tags in name order),
which is the same order, and :func:`series_order` is it in Python.

Nothing here does I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from ingest.store.layout_queries import Pipeline

# Fields of a stored reading that are not measurements (bucket entries and time-series
# documents; ``units`` is per document in time-series mode).
NOT_MEASUREMENTS = frozenset({"_id", "ts", "seq", "meta", "units", "info", "sensor_id", "tags"})
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


type Tags = tuple[tuple[str, str], ...]  # identity tags in name order


class SeriesKey(NamedTuple):
    """A series: a sensor id and its identity tags (in name order)."""

    sensor_id: str
    tags: Tags = ()

    @property
    def tag_dict(self) -> dict[str, str]:
        """The tags as an object, keys in name order (as bucket documents store them)."""
        return dict(self.tags)

    @property
    def meta(self) -> dict[str, str]:
        """The series as a time-series ``meta`` (``sensor_id`` first, tags in name order)."""
        return {"sensor_id": self.sensor_id, **dict(self.tags)}


def series_key(sensor_id: str, tags: dict[str, Any] | None) -> SeriesKey:
    """The key of a series from a sensor id and a tags object (``sensor_id`` left out)."""
    return SeriesKey(
        sensor_id, tuple(sorted((k, v) for k, v in (tags or {}).items() if k != "sensor_id"))
    )


def series_order(key: SeriesKey) -> tuple[str, Tags]:
    """Sort key of a series, the order MongoDB gives ``{sensor_id, tags}`` and ``meta``."""
    return key.sensor_id, key.tags


def label(key: SeriesKey) -> str:
    """A series' display name: ``h1`` or ``h1{path=/boot}``.

    The daemon's rejection details name series the same way.
    """
    if not key.tags:
        return key.sensor_id
    return key.sensor_id + "{" + ",".join(f"{k}={v}" for k, v in key.tags) + "}"


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a page of readings ended: the last series and instant returned.

    A series has one reading per instant in either layout (time-series documents of one
    instant are merged), so the next page starts strictly after it.
    """

    series: SeriesKey
    ts_ms: int

    @property
    def ts(self) -> datetime:
        """The cursor's time as a datetime."""
        return from_ms(self.ts_ms)


@dataclass(frozen=True, slots=True)
class Selection:
    """Which series a question is about: sensor ids, and tag values by tag name."""

    sensor_ids: list[str]
    tags: dict[str, list[str]]

    def match(self, layout: Layout) -> dict[str, Any]:
        """The query selecting these series in ``layout``."""
        if layout.bucket:
            return {
                "sensor_id": {"$in": self.sensor_ids},
                **{f"tags.{k}": {"$in": v} for k, v in self.tags.items()},
            }
        return {
            "meta.sensor_id": {"$in": self.sensor_ids},
            **{f"meta.{k}": {"$in": v} for k, v in self.tags.items()},
        }


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
    return {
        "$switch": {
            "branches": [
                {"case": {"$isNumber": field}, "then": field},
                {"case": {"$eq": [{"$type": field}, "bool"]}, "then": {"$cond": [field, 1, 0]}},
            ],
            "default": None,
        }
    }


def literal(value: Any) -> dict[str, Any]:  # noqa: ANN401 - any stored value
    """A value from data (a sensor id, a tags object, a ``meta``) inside an expression.

    An aggregation expression reads a string ``"$x"`` as a field path and ``"$$x"`` as a
    variable, and an object's values as expressions: ``$literal`` keeps them data.
    """
    return {"$literal": value}


def _keys(expr: Any) -> dict[str, Any]:  # noqa: ANN401 - any object expression
    """The field names of an object expression."""
    return {"$map": {"input": {"$objectToArray": expr}, "in": "$$this.k"}}


def _union(expr: str | dict[str, Any]) -> dict[str, Any]:
    """The union of an array of arrays."""
    return {
        "$reduce": {"input": expr, "initialValue": [], "in": {"$setUnion": ["$$value", "$$this"]}}
    }


def _in_window(field: str, since: datetime, until: datetime) -> dict[str, Any]:
    return {"$and": [{"$gte": [field, since]}, {"$lt": [field, until]}]}


# -- sensors ------------------------------------------------------------------------------


def sensors(
    layout: Layout,
    since: datetime,
    until: datetime,
    after: SeriesKey | None,
    limit: int,
    search: str | None = None,
) -> Pipeline:
    """Series with readings in ``[since, until)``, in series order, ``limit + 1`` of them.

    Only series after ``after`` (the previous page's last), and with ``search`` only those
    whose sensor id or a tag (``key=value``) holds that text, ignoring case.
    """
    if layout.bucket:
        pipeline = _sensors_bucket(layout.span_seconds, since, until, after, limit)
    else:
        pipeline = _sensors_timeseries(since, until, after, limit)
    if search:
        pipeline.insert(1, {"$match": _search(layout, search)})
    return pipeline


def _search(layout: Layout, text: str) -> dict[str, Any]:
    """Documents whose sensor id or one of whose tags (``key=value``) holds ``text``.

    The text is matched literally (escaped into a regular expression), ignoring case.
    """
    pattern = re.escape(text)
    sensor_field, tags_field = (
        ("sensor_id", "$tags") if layout.bucket else ("meta.sensor_id", "$meta")
    )
    pairs = {
        "$filter": {
            "input": {"$objectToArray": {"$ifNull": [tags_field, {}]}},
            "cond": {"$ne": ["$$this.k", "sensor_id"]},
        }
    }
    pair_matches = {
        "$map": {
            "input": pairs,
            "in": {
                "$regexMatch": {
                    "input": {"$concat": ["$$this.k", "=", {"$toString": "$$this.v"}]},
                    "regex": literal(pattern),
                    "options": "i",
                }
            },
        }
    }
    return {
        "$or": [
            {sensor_field: {"$regex": pattern, "$options": "i"}},
            {"$expr": {"$anyElementTrue": [pair_matches]}},
        ]
    }


def _series_after(after: SeriesKey | None) -> Pipeline:
    """Groups ``{_id: {s, tags}}`` after a series (``$expr``: an object compared as a value)."""
    if after is None:
        return []
    return [
        {
            "$match": {
                "$or": [
                    {"_id.s": {"$gt": after.sensor_id}},
                    {
                        "_id.s": after.sensor_id,
                        "$expr": {"$gt": ["$_id.tags", literal(after.tag_dict)]},
                    },
                ]
            }
        }
    ]


def _sensors_bucket(
    span: int, since: datetime, until: datetime, after: SeriesKey | None, limit: int
) -> Pipeline:
    match: dict[str, Any] = {"bucket_start": {"$gte": floor_to(since, span), "$lt": until}}
    if after is not None:
        match["sensor_id"] = {"$gte": after.sensor_id}
    inside = {
        "$filter": {"input": "$readings", "as": "r", "cond": _in_window("$$r.ts", since, until)}
    }
    return [
        {"$match": match},
        {
            "$project": {
                "_id": 0,
                "sensor_id": 1,
                "tags": 1,
                "units": 1,
                "info": 1,
                "first_ts": 1,
                "r": inside,
            }
        },
        {"$match": {"r.0": {"$exists": True}}},
        {
            "$project": {
                "sensor_id": 1,
                "tags": 1,
                "units": 1,
                "info": 1,
                "n": {"$size": "$r"},
                # a document's first reading is its first_ts, unless it began before
                # the window (only the window's first document per series)
                "first": {
                    "$cond": [
                        {"$gte": ["$first_ts", since]},
                        "$first_ts",
                        {
                            "$reduce": {
                                "input": "$r",
                                "initialValue": None,
                                "in": {"$min": ["$$value", "$$this.ts"]},
                            }
                        },
                    ]
                },
                "last": {
                    "$reduce": {
                        "input": "$r",
                        "initialValue": None,
                        "in": {"$max": ["$$value", "$$this.ts"]},
                    }
                },
                "names": {
                    "$reduce": {
                        "input": "$r",
                        "initialValue": [],
                        "in": {"$setUnion": ["$$value", _keys("$$this")]},
                    }
                },
            }
        },
        {
            "$group": {
                "_id": {"s": "$sensor_id", "tags": {"$ifNull": ["$tags", {}]}},
                "readings": {"$sum": "$n"},
                "first_seen": {"$min": "$first"},
                "last_seen": {"$max": "$last"},
                "names": {"$push": "$names"},
                "units": {"$mergeObjects": "$units"},
                "latest": _latest_info("$last"),
            }
        },
        *_sensor_page(after, limit),
    ]


def _sensors_timeseries(
    since: datetime, until: datetime, after: SeriesKey | None, limit: int
) -> Pipeline:
    """Documents of one series and instant are one reading: grouped by instant first."""
    match: dict[str, Any] = {"ts": {"$gte": since, "$lt": until}}
    if after is not None:
        match["meta.sensor_id"] = {"$gte": after.sensor_id}
    tags = {
        "$arrayToObject": {
            "$filter": {
                "input": {"$objectToArray": "$_id"},
                "cond": {"$ne": ["$$this.k", "sensor_id"]},
            }
        }
    }
    return [
        {"$match": match},
        {
            "$project": {
                "_id": 0,
                "meta": 1,
                "ts": 1,
                "units": 1,
                "info": 1,
                "names": _keys("$$ROOT"),
            }
        },
        {
            "$group": {
                "_id": {"meta": "$meta", "ts": "$ts"},
                "names": {"$push": "$names"},
                "units": {"$mergeObjects": "$units"},
                "info": {"$mergeObjects": "$info"},
            }
        },
        {
            "$group": {
                "_id": "$_id.meta",
                "readings": {"$sum": 1},
                "first_seen": {"$min": "$_id.ts"},
                "last_seen": {"$max": "$_id.ts"},
                "names": {"$push": _union("$names")},
                "units": {"$mergeObjects": "$units"},
                "latest": _latest_info("$_id.ts"),
            }
        },
        {
            "$project": {
                "_id": {"s": "$_id.sensor_id", "tags": tags},
                "readings": 1,
                "first_seen": 1,
                "last_seen": 1,
                "names": 1,
                "units": 1,
                "latest": 1,
            }
        },
        *_sensor_page(after, limit),
    ]


def _latest_info(ts: str) -> dict[str, Any]:
    """The ``info`` of the latest row: ``{ts, info}`` objects compare by ``ts`` first.

    No sort of the window's documents is needed for it (a ``$group`` sees them in any
    order).
    """
    return {"$max": {"ts": ts, "info": {"$ifNull": ["$info", {}]}}}


def _sensor_page(after: SeriesKey | None, limit: int) -> Pipeline:
    """Groups ``{_id: {s, tags}}`` in series order after ``after``, ``limit + 1``."""
    return [
        *_series_after(after),
        {"$sort": {"_id.s": 1, "_id.tags": 1}},
        {"$limit": limit + 1},
        {
            "$project": {
                "_id": 1,
                "readings": 1,
                "first_seen": 1,
                "last_seen": 1,
                "units": 1,
                "info": "$latest.info",
                "names": _union("$names"),
            }
        },
    ]


def sensor_key(doc: dict[str, Any]) -> SeriesKey:
    """The series of a sensors row."""
    return series_key(doc["_id"]["s"], doc["_id"]["tags"])


def sensor_answer(doc: dict[str, Any]) -> dict[str, Any]:
    """One entry of the sensors answer: one series."""
    key = sensor_key(doc)
    units = doc.get("units") or {}
    measurements = sorted(set(doc["names"]) - NOT_MEASUREMENTS)
    return {
        "sensor_id": key.sensor_id,
        "tags": key.tag_dict,
        "label": label(key),
        "first_seen": iso(doc["first_seen"]),
        "last_seen": iso(doc["last_seen"]),
        "readings": int(doc["readings"]),
        "measurements": measurements,
        "units": {m: units[m] for m in measurements if m in units},
        "info": dict(sorted((doc.get("info") or {}).items())),
    }


# -- readings -----------------------------------------------------------------------------


def readings(
    layout: Layout,
    selection: Selection,
    since: datetime,
    until: datetime,
    measurements: list[str],
    cursor: Cursor | None,
    limit: int,
) -> Pipeline:
    """Stored rows of the selected series in ``[since, until)``, by series then time.

    At most ``limit`` of them, after ``cursor``. A bucket row is one reading; time-series
    rows (documents) of one instant follow each other by ``_id``, for :func:`merge_rows`.
    """
    if layout.bucket:
        return _readings_bucket(
            layout.span_seconds, selection, since, until, measurements, cursor, limit
        )
    return _readings_timeseries(selection, since, until, measurements, cursor, limit)


def _has_any(prefix: str, measurements: list[str]) -> dict[str, Any]:
    if not measurements:
        return {}
    return {"$or": [{f"{prefix}{m}": {"$exists": True}} for m in measurements]}


def _readings_bucket(
    span: int,
    selection: Selection,
    since: datetime,
    until: datetime,
    measurements: list[str],
    cursor: Cursor | None,
    limit: int,
) -> Pipeline:
    first = {
        **selection.match(Layout("bucket", span)),
        "bucket_start": {"$gte": floor_to(since, span), "$lt": until},
    }
    second: dict[str, Any] = {"readings.ts": {"$gte": since, "$lt": until}}
    conditions = [c for c in (_has_any("readings.", measurements),) if c]
    if cursor is not None:
        key = cursor.series
        tags = literal(key.tag_dict)
        same = {"sensor_id": key.sensor_id, "$expr": {"$eq": ["$tags", tags]}}
        later = [
            {"sensor_id": {"$gt": key.sensor_id}},
            {"sensor_id": key.sensor_id, "$expr": {"$gt": ["$tags", tags]}},
        ]
        first = {
            "$and": [
                first,
                {"$or": [{**same, "bucket_start": {"$gte": floor_to(cursor.ts, span)}}, *later]},
            ]
        }
        conditions.append({"$or": [{**same, "readings.ts": {"$gt": cursor.ts}}, *later]})
    if conditions:
        second = {"$and": [second, *conditions]}
    return [
        {"$match": first},
        {"$project": {"_id": 0, "sensor_id": 1, "tags": 1, "readings": 1}},
        {"$unwind": "$readings"},
        {"$match": second},
        {"$sort": {"sensor_id": 1, "tags": 1, "readings.ts": 1}},
        {"$limit": limit},
        {
            "$replaceWith": {
                "$mergeObjects": ["$readings", {"sensor_id": "$sensor_id", "tags": "$tags"}]
            }
        },
    ]


def _readings_timeseries(
    selection: Selection,
    since: datetime,
    until: datetime,
    measurements: list[str],
    cursor: Cursor | None,
    limit: int,
) -> Pipeline:
    match: dict[str, Any] = {
        **selection.match(Layout("timeseries")),
        "ts": {"$gte": since, "$lt": until},
    }
    conditions = [c for c in (_has_any("", measurements),) if c]
    if cursor is not None:
        meta = literal(cursor.series.meta)
        conditions += [
            {"meta.sensor_id": {"$gte": cursor.series.sensor_id}},
            {
                "$or": [
                    {"ts": {"$gt": cursor.ts}, "$expr": {"$eq": ["$meta", meta]}},
                    {"$expr": {"$gt": ["$meta", meta]}},
                ]
            },
        ]
    if conditions:
        match = {"$and": [match, *conditions]}
    return [
        {"$match": match},
        {"$sort": {"meta": 1, "ts": 1, "_id": 1}},
        {"$limit": limit},
        {"$addFields": {"sensor_id": "$meta.sensor_id", "tags": "$meta"}},
        {"$project": {"meta": 0}},
    ]


def row_key(row: dict[str, Any]) -> tuple[SeriesKey, int]:
    """The series and instant (milliseconds) of a stored row."""
    return series_key(row["sensor_id"], row.get("tags")), to_ms(row["ts"])


def merge_rows(
    rows: list[dict[str, Any]], complete: bool
) -> list[tuple[SeriesKey, int, dict[str, Any]]]:
    """Rows of one series and instant merged into one reading, in order.

    A field held by several rows is taken from the first (rows of one instant come by
    ``_id``). Unless ``complete``, the last instant is left out: rows beyond the fetched
    ones may belong to it.
    """
    out: list[tuple[SeriesKey, int, dict[str, Any]]] = []
    for row in rows:
        key, ms = row_key(row)
        if out and out[-1][0] == key and out[-1][1] == ms:
            merged = out[-1][2]
            for name, value in row.items():
                merged.setdefault(name, value)
        else:
            out.append((key, ms, dict(row)))
    if not complete and out:
        out.pop()
    return out


def reading_answer(key: SeriesKey, doc: dict[str, Any], measurements: list[str]) -> dict[str, Any]:
    """One entry of the readings answer: series, time, seq if any, values."""
    values = {k: v for k, v in doc.items() if k not in NOT_MEASUREMENTS}
    if measurements:
        values = {m: values[m] for m in measurements if m in values}
    out: dict[str, Any] = {"sensor_id": key.sensor_id, "tags": key.tag_dict, "ts": iso(doc["ts"])}
    if doc.get("seq") is not None:
        out["seq"] = doc["seq"]
    out["values"] = dict(sorted(values.items()))
    return out


def first_seqs(keys: list[tuple[SeriesKey, int]]) -> Pipeline:
    """Time-series mode: at each instant, the ``seq`` of its first document holding one.

    By ``_id``, whatever its measurements: a reading's ``seq`` is its first document's,
    which a ``measurement`` filter may have left out.
    """
    by_series: dict[SeriesKey, list[datetime]] = {}
    for key, ms in keys:
        by_series.setdefault(key, []).append(from_ms(ms))
    return [
        {
            "$match": {
                "seq": {"$exists": True},
                "$or": [
                    {
                        "meta.sensor_id": key.sensor_id,
                        "ts": {"$in": times},
                        "$expr": {"$eq": ["$meta", literal(key.meta)]},
                    }
                    for key, times in by_series.items()
                ],
            }
        },
        {"$sort": {"_id": 1}},
        {"$group": {"_id": {"meta": "$meta", "ts": "$ts"}, "seq": {"$first": "$seq"}}},
    ]


# -- series -------------------------------------------------------------------------------


def uses_stats(layout: Layout, step_ms: int) -> bool:
    """Whether a series of this step can be summed from bucket statistics."""
    return layout.bucket and step_ms % (layout.span_seconds * 1000) == 0


def series(
    layout: Layout,
    selection: Selection,
    measurements: list[str],
    since: datetime,
    until: datetime,
    step_ms: int,
) -> Pipeline:
    """Per series and step: count, sum, min and max of each measurement (``m<i>_*``).

    ``since`` and ``until`` must be whole steps (see :func:`floor_to`, :func:`ceil_ms`).
    In timeseries mode a field exists once per series and instant (a later batch's
    document holds only fields the instant lacked), so aggregating documents counts each
    reading's value once.
    """
    if uses_stats(layout, step_ms):
        return _series_stats(selection, measurements, since, until, step_ms)
    if layout.bucket:
        head: Pipeline = [
            {
                "$match": {
                    **selection.match(layout),
                    "bucket_start": {"$gte": floor_to(since, layout.span_seconds), "$lt": until},
                }
            },
            {"$project": {"_id": 0, "sensor_id": 1, "tags": 1, "readings": 1, "units": 1}},
            {"$unwind": "$readings"},
            {"$match": {"readings.ts": {"$gte": since, "$lt": until}}},
            {
                "$replaceWith": {
                    "$mergeObjects": [
                        "$readings",
                        {"sensor_id": "$sensor_id", "tags": "$tags", "units": "$units"},
                    ]
                }
            },
        ]
    else:
        head = [
            {"$match": {**selection.match(layout), "ts": {"$gte": since, "$lt": until}}},
            {"$addFields": {"sensor_id": "$meta.sensor_id", "tags": "$meta"}},
        ]
    values = {f"v{i}": _numeric(f"${m}") for i, m in enumerate(measurements)}
    units = {f"u{i}": f"$units.{m}" for i, m in enumerate(measurements)}
    group: dict[str, Any] = {"_id": {"s": "$sensor_id", "tags": "$tags", "t": "$t"}}
    for i in range(len(measurements)):
        v = f"$v{i}"
        group |= {
            f"m{i}_count": {"$sum": {"$cond": [{"$isNumber": v}, 1, 0]}},
            f"m{i}_sum": {"$sum": v},
            f"m{i}_min": {"$min": v},
            f"m{i}_max": {"$max": v},
            f"m{i}_unit": {"$max": f"$u{i}"},
        }
    return [
        *head,
        {
            "$project": {
                "_id": 0,
                "sensor_id": 1,
                "tags": 1,
                "t": _bin("$ts", step_ms),
                **values,
                **units,
            }
        },
        {"$group": group},
        {"$sort": {"_id.s": 1, "_id.tags": 1, "_id.t": 1}},
    ]


def _series_stats(
    selection: Selection, measurements: list[str], since: datetime, until: datetime, step_ms: int
) -> Pipeline:
    group: dict[str, Any] = {
        "_id": {"s": "$sensor_id", "tags": "$tags", "t": _bin("$bucket_start", step_ms)}
    }
    for i, m in enumerate(measurements):
        stats = f"$stats.{m}"
        group |= {
            f"m{i}_count": {"$sum": f"{stats}.count"},
            f"m{i}_sum": {"$sum": f"{stats}.sum"},
            f"m{i}_min": {"$min": f"{stats}.min"},
            f"m{i}_max": {"$max": f"{stats}.max"},
            f"m{i}_unit": {"$max": f"$units.{m}"},
        }
    return [
        {
            "$match": {
                **selection.match(Layout("bucket")),
                "bucket_start": {"$gte": since, "$lt": until},
            }
        },
        {"$group": group},
        {"$sort": {"_id.s": 1, "_id.tags": 1, "_id.t": 1}},
    ]


def series_answer(
    docs: list[dict[str, Any]], sensor_ids: list[str], measurements: list[str]
) -> list[dict[str, Any]]:
    """Group rows into one series per series (sensor and tags) and measurement with data.

    Sensors come in the order asked for, the series of one sensor in series order, then
    the measurements in the order asked for; steps without a value of that measurement
    are left out.
    """
    points: dict[tuple[SeriesKey, int], list[dict[str, Any]]] = {}
    units: dict[tuple[SeriesKey, int], str] = {}
    for doc in sorted(
        docs,
        key=lambda d: (
            series_order(series_key(d["_id"]["s"], d["_id"]["tags"])),
            to_ms(d["_id"]["t"]),
        ),
    ):
        key, t = series_key(doc["_id"]["s"], doc["_id"]["tags"]), iso(doc["_id"]["t"])
        for i in range(len(measurements)):
            count = doc.get(f"m{i}_count") or 0
            if count <= 0:
                continue
            unit = doc.get(f"m{i}_unit")
            if isinstance(unit, str):
                units[key, i] = max(unit, units.get((key, i), unit))
            total = doc[f"m{i}_sum"]
            points.setdefault((key, i), []).append(
                {
                    "t": t,
                    "count": int(count),
                    "min": _plain(doc[f"m{i}_min"]),
                    "avg": total / count,
                    "max": _plain(doc[f"m{i}_max"]),
                }
            )
    rank = {s: n for n, s in enumerate(sensor_ids)}
    keys = sorted(
        {key for key, _ in points},
        key=lambda k: (rank.get(k.sensor_id, len(rank)), series_order(k)),
    )
    return [
        {
            "sensor_id": k.sensor_id,
            "tags": k.tag_dict,
            "label": label(k),
            "measurement": m,
            "unit": units.get((k, i)),
            "points": points[k, i],
        }
        for k in keys
        for i, m in enumerate(measurements)
        if (k, i) in points
    ]


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
        {
            "$project": {
                "_id": 0,
                "at": 1,
                "mode": 1,
                "topic": 1,
                "reason": 1,
                "detail": 1,
                "payload_bytes": 1,
            }
        },
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

"""The stored readings as Prometheus series: the model, label matchers, and reading samples.

The model (both layouts):

- a measurement is a metric name (``__name__``); a series' ``sensor_id`` and its identity
  tags are labels (``info`` tags are not: they are not part of a series);
- numbers are samples, booleans are samples 0/1, strings are not samples;
- a measurement's unit (``units.<m>``) is metadata (``/api/v1/metadata``).

Label matchers (``=``, ``!=``, ``=~``, ``!~``) follow Prometheus: a missing label has the
value ``""``, and a regex is RE2 anchored at both ends with ``.`` matching newlines. Every
matcher is checked here in Python on every series read; the ones MongoDB can answer from
its indexes are also pushed down into the query filter (a string in a query filter is
data, never an operator or a field path). Nothing here does I/O but :func:`read_samples`
and its siblings, which run pipelines through the function given.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ingest.api.read_queries import NOT_MEASUREMENTS, Layout, from_ms, literal, to_ms
from ingest.model import NAME_PATTERN

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from ingest.store.layout_queries import Pipeline

    type Run = Callable[[Pipeline], Awaitable[list[dict[str, Any]]]]

NAME = "__name__"
_MEASUREMENT = re.compile(f"^{NAME_PATTERN}$")
# RE2 has none of these (Prometheus refuses them): back-references, look-around, atomic
# groups, possessive quantifiers, conditionals.
_NOT_RE2 = re.compile(r"\\[1-9]|\(\?[=!<>(]|\(\?P=|[*+?}]\+")
_LITERAL = re.compile(r"[A-Za-z0-9_\-/:. ]*")  # a regex that is only literal characters
type Labels = tuple[tuple[str, str], ...]  # sorted by name, __name__ included


class MatcherError(ValueError):
    """A label matcher that cannot be used (a regex RE2 would refuse)."""


@dataclass(frozen=True, slots=True)
class Matcher:
    """One label matcher: ``name op "value"``, op one of ``=``, ``!=``, ``=~``, ``!~``."""

    name: str
    op: str
    value: str
    regex: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def make(cls, name: str, op: str, value: str) -> Matcher:
        """A matcher, its regex compiled as Prometheus does (anchored, ``(?s)``)."""
        if op not in {"=", "!=", "=~", "!~"}:
            raise MatcherError(f"unknown label matcher {op!r}")
        regex = None
        if op in {"=~", "!~"}:
            if _NOT_RE2.search(value):
                raise MatcherError(
                    f"invalid regular expression {value!r}: back-references, look-around "
                    "and possessive quantifiers are not RE2"
                )
            try:
                # RE2's \d, \w, \s and \b are ASCII, as re.ASCII makes Python's
                regex = re.compile(f"(?s:{value})", re.ASCII)
            except re.error as exc:
                raise MatcherError(f"invalid regular expression {value!r}: {exc}") from None
        return cls(name, op, value, regex)

    def matches(self, value: str) -> bool:
        """Whether a label value (``""`` when the label is missing) matches."""
        if self.regex is not None:
            found = self.regex.fullmatch(value) is not None
            return found if self.op == "=~" else not found
        return (value == self.value) if self.op == "=" else (value != self.value)

    def literals(self) -> list[str] | None:
        """The values a positive matcher accepts, when it is a list of literals."""
        if self.op == "=":
            return [self.value]
        if self.op == "=~":
            parts = self.value.split("|")
            if all(_LITERAL.fullmatch(p) and "." not in p for p in parts):
                return sorted(set(parts))
        return None


def matches_all(matchers: Sequence[Matcher], labels: dict[str, str]) -> bool:
    """Whether a series' labels satisfy every matcher."""
    return all(m.matches(labels.get(m.name, "")) for m in matchers)


def _pushed(m: Matcher, path: str) -> dict[str, Any] | None:
    """The query-filter condition of a matcher on a stored string field, if exact."""
    values = m.literals()
    if values is not None:
        if "" in values:  # "" also matches a series without the label
            return {path: {"$in": [*values, None]}}
        return {path: {"$in": values}} if len(values) > 1 else {path: values[0]}
    if m.op == "!=" and m.value:
        return {path: {"$ne": m.value}}  # $ne matches a missing field too, as Prometheus
    if m.op == "!=":
        return {path: {"$nin": ["", None]}}
    return None


def pushdown(layout: Layout, matchers: Sequence[Matcher]) -> dict[str, Any]:
    """What of the label matchers MongoDB can filter on (the rest is checked here)."""
    conditions: list[dict[str, Any]] = []
    for m in matchers:
        if m.name == NAME:
            continue
        if m.name == "sensor_id":
            path = "sensor_id" if layout.bucket else "meta.sensor_id"
        elif _MEASUREMENT.match(m.name):
            path = f"tags.{m.name}" if layout.bucket else f"meta.{m.name}"
        else:  # a label no series has: only "" matches it, checked here
            continue
        condition = _pushed(m, path)
        if condition is not None:
            conditions.append(condition)
    return {"$and": conditions} if conditions else {}


def metric_names(matchers: Sequence[Matcher]) -> list[str] | None:
    """The measurement names the ``__name__`` matchers allow, when they list them."""
    names: set[str] | None = None
    for m in matchers:
        if m.name != NAME:
            continue
        values = m.literals()
        if values is not None:
            names = set(values) if names is None else names & set(values)
    if names is None:
        return None
    return sorted(n for n in names if _MEASUREMENT.match(n))


def sample_value(value: object) -> float | None:
    """A stored value as a sample: numbers as floats, booleans 0/1, anything else None."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value)
    to_decimal = getattr(value, "to_decimal", None)  # Decimal128
    if to_decimal is not None:
        return float(to_decimal())
    return None


def labels_of(sensor_id: str, tags: dict[str, Any] | None, name: str) -> Labels:
    """A series' labels: ``__name__``, ``sensor_id`` and its identity tags, sorted."""
    out = {k: str(v) for k, v in (tags or {}).items() if v != "" and k not in {"sensor_id", NAME}}
    out["sensor_id"] = sensor_id
    out[NAME] = name
    return tuple(sorted(out.items()))


@dataclass(slots=True)
class Series:
    """One series' samples, oldest first (times in milliseconds since the epoch)."""

    labels: Labels
    times: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


class TooManySamples(Exception):  # noqa: N818 - named for what it says to the caller
    """A selection would load more samples than a query may hold."""


# -- pipelines ---------------------------------------------------------------------------


def _window_match(layout: Layout, start_ms: int, end_ms: int) -> dict[str, Any]:
    """Documents that may hold readings in ``(start, end]``."""
    if layout.bucket:
        span = layout.span_seconds * 1000
        first = start_ms + 1 - (start_ms + 1) % span
        return {"bucket_start": {"$gte": from_ms(first), "$lte": from_ms(end_ms)}}
    return {"ts": {"$gt": from_ms(start_ms), "$lte": from_ms(end_ms)}}


def samples_pipeline(
    layout: Layout,
    matchers: Sequence[Matcher],
    names: list[str] | None,
    start_ms: int,
    end_ms: int,
) -> Pipeline:
    """Rows of ``{s, tags, r: [{ts, <measurement>...}]}`` (bucket) or documents (timeseries).

    Readings in ``(start, end]``; with ``names`` only those measurements are projected and
    only documents holding one of them are read.
    """
    match: dict[str, Any] = {**_window_match(layout, start_ms, end_ms)}
    extra = pushdown(layout, matchers)
    if layout.bucket:
        if names is not None:
            match["$or"] = [{f"stats.{n}": {"$exists": True}} for n in names] or [{"_id": None}]
        inside = {
            "$and": [{"$gt": ["$$r.ts", from_ms(start_ms)]}, {"$lte": ["$$r.ts", from_ms(end_ms)]}]
        }
        readings: Any = {"$filter": {"input": "$readings", "as": "r", "cond": inside}}
        if names is not None:
            readings = {
                "$map": {
                    "input": readings,
                    "as": "r",
                    "in": {"ts": "$$r.ts", **{n: f"$$r.{n}" for n in names}},
                }
            }
        return [
            {"$match": {"$and": [match, extra]} if extra else match},
            {"$project": {"_id": 0, "s": "$sensor_id", "tags": 1, "r": readings}},
        ]
    if names is not None:
        match["$or"] = [{n: {"$exists": True}} for n in names] or [{"_id": {"$exists": False}}]
    project: dict[str, Any] = {"_id": 1, "meta": 1, "ts": 1}
    if names is not None:
        project |= dict.fromkeys(names, 1)
    else:
        project = {"units": 0, "info": 0, "seq": 0}
    return [{"$match": {"$and": [match, extra]} if extra else match}, {"$project": project}]


def _add(
    found: dict[Labels, dict[int, tuple[Any, float]]],
    sensor_id: str,
    tags: dict[str, Any] | None,
    reading: dict[str, Any],
    names: list[str] | None,
    order: Any,  # noqa: ANN401 - a document's _id (time-series) or 0
) -> int:
    """Add a reading's samples; returns how many were added."""
    ts = to_ms(reading["ts"])
    added = 0
    for name, raw in reading.items():
        if name in NOT_MEASUREMENTS or (names is not None and name not in names):
            continue
        value = sample_value(raw)
        if value is None:
            continue
        series = found.setdefault(labels_of(sensor_id, tags, name), {})
        held = series.get(ts)
        if held is None or (order is not None and held[0] is not None and order < held[0]):
            series[ts] = (order, value)
            added += held is None
    return added


async def read_samples(
    run: Run,
    layout: Layout,
    matchers: Sequence[Matcher],
    start_ms: int,
    end_ms: int,
    max_samples: int,
) -> list[Series]:
    """The samples of every series the matchers select, in ``(start, end]``, by labels.

    In time-series mode the documents of one series and instant are one reading (a field
    held by several: the first document by ``_id``), as ``/api/readings`` answers.
    """
    names = metric_names(matchers)
    if names == []:
        return []
    rows = await run(samples_pipeline(layout, matchers, names, start_ms, end_ms))
    found: dict[Labels, dict[int, tuple[Any, float]]] = {}
    total = 0
    for row in rows:
        if layout.bucket:
            for reading in row.get("r") or ():
                total += _add(found, row["s"], row.get("tags"), reading, names, None)
        else:
            meta = row["meta"]
            total += _add(found, meta["sensor_id"], meta, row, names, row.get("_id"))
        if total > max_samples:
            raise TooManySamples(str(max_samples))
    out = []
    for labels, by_ts in found.items():
        if not matches_all(matchers, dict(labels)):
            continue
        series = Series(labels)
        for ts in sorted(by_ts):
            series.times.append(ts)
            series.values.append(by_ts[ts][1])
        out.append(series)
    out.sort(key=lambda s: s.labels)
    return out


def series_pipeline(
    layout: Layout, matchers: Sequence[Matcher], start_ms: int, end_ms: int
) -> Pipeline:
    """The series (sensor, tags, numeric measurement names, units) with documents in a window.

    Bucket mode names a document's measurements by its ``stats`` (numbers and booleans
    only); time-series mode by the fields holding a number or a boolean.
    """
    names = metric_names(matchers)
    match: dict[str, Any] = {**_window_match(layout, start_ms, end_ms)}
    extra = pushdown(layout, matchers)
    if extra:
        match = {"$and": [match, extra]}
    if layout.bucket:
        keys: Any = {
            "$map": {"input": {"$objectToArray": {"$ifNull": ["$stats", {}]}}, "in": "$$this.k"}
        }
        group_id: dict[str, Any] = {"s": "$sensor_id", "tags": {"$ifNull": ["$tags", {}]}}
    else:
        numeric = {
            "$filter": {
                "input": {"$objectToArray": "$$ROOT"},
                "cond": {
                    "$and": [
                        {"$eq": [{"$in": ["$$this.k", literal(sorted(NOT_MEASUREMENTS))]}, False]},
                        {
                            "$or": [
                                {"$isNumber": "$$this.v"},
                                {"$eq": [{"$type": "$$this.v"}, "bool"]},
                            ]
                        },
                    ]
                },
            }
        }
        keys = {"$map": {"input": numeric, "in": "$$this.k"}}
        group_id = {"s": "$meta.sensor_id", "tags": "$meta"}
    pipeline: Pipeline = [{"$match": match}]
    if names is not None:
        pipeline[0] = {
            "$match": {
                "$and": [
                    match,
                    {
                        "$or": [
                            {(f"stats.{n}" if layout.bucket else n): {"$exists": True}}
                            for n in names
                        ]
                        or [{"_id": {"$exists": False}}]
                    },
                ]
            }
        }
    pipeline += [
        {"$project": {"_id": 0, "k": keys, "g": group_id, "units": 1}},
        {
            "$group": {
                "_id": "$g",
                "names": {"$addToSet": "$k"},
                "units": {"$mergeObjects": "$units"},
            }
        },
    ]
    return pipeline


async def read_series(
    run: Run, layout: Layout, matchers: Sequence[Matcher], start_ms: int, end_ms: int
) -> tuple[list[Labels], dict[str, str]]:
    """The label sets the matchers select with documents in a window, and units by name."""
    rows = await run(series_pipeline(layout, matchers, start_ms, end_ms))
    found: set[Labels] = set()
    units: dict[str, str] = {}
    for row in rows:
        sensor_id, tags = row["_id"]["s"], row["_id"].get("tags")
        for name in {n for names in row["names"] for n in names}:
            labels = labels_of(sensor_id, tags, name)
            if matches_all(matchers, dict(labels)):
                found.add(labels)
                unit = (row.get("units") or {}).get(name)
                if isinstance(unit, str):
                    units[name] = max(unit, units.get(name, unit))
    return sorted(found), units


def finite(value: float) -> bool:
    """Whether a float is neither NaN nor infinite."""
    return not (math.isnan(value) or math.isinf(value))

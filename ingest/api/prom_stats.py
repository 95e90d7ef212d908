"""Bucket mode's ``avg/min/max/sum/count_over_time`` from the documents' running statistics.

A window ``(t - range, t]`` whose ends are bucket bounds (``range`` and every ``t``, offset
applied, whole multiples of ``--bucket-span-seconds``) is the buckets starting in
``[t - range, t)``, less the reading at ``t - range`` and plus the reading at ``t`` (a
reading on a bound lives in the bucket that starts there). The buckets' ``stats.<m>``
(count, sum, min, max; overflow documents of one sensor-span summed) give the first part
without reading one reading; the readings on the bounds come from a second query that
the unique ``{sensor_id, tags, readings.ts}`` index answers, asked only for buckets whose
earliest reading (``first_ts``) is on their bound. Counts and sums are corrected
exactly; a min or max whose removed bound reading may have been the extreme is computed
from the raw readings of that one window. Anything else (a window off the bounds, a
metric name given by a regex) is read raw, by the caller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ingest.api.prom_store import (
    Matcher,
    labels_of,
    matches_all,
    metric_names,
    pushdown,
    sample_value,
)
from ingest.api.promql import drop_name, put_unique, window
from ingest.api.read_queries import from_ms, to_ms

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from ingest.api.prom_store import Labels, Series
    from ingest.api.read_queries import Layout
    from ingest.store.layout_queries import Pipeline

    type Run = Callable[[Pipeline], Awaitable[list[dict[str, Any]]]]
    type Fetch = Callable[[list[Matcher], int, int], Awaitable[list[Series]]]

MAX_BOUNDS = 10_000  # bucket bounds one query may look up for readings on them
type Stat = list[float]  # count, sum, min, max


def bucket_pipeline(
    layout: Layout, matchers: Sequence[Matcher], names: list[str], low: int, high: int
) -> Pipeline:
    """``stats`` of ``names`` per series and bucket in ``[low, high)``, earliest reading too."""
    group: dict[str, Any] = {
        "_id": {"s": "$sensor_id", "tags": "$tags", "b": "$bucket_start"},
        # a reading on the bucket's bound exists only if the earliest is there (a document
        # without first_ts may have one too)
        "first": {"$min": {"$ifNull": ["$first_ts", "$bucket_start"]}},
    }
    for i, name in enumerate(names):
        stats = f"$stats.{name}"
        group |= {
            f"c{i}": {"$sum": f"{stats}.count"},
            f"s{i}": {"$sum": f"{stats}.sum"},
            f"n{i}": {"$min": f"{stats}.min"},
            f"x{i}": {"$max": f"{stats}.max"},
        }
    match: dict[str, Any] = {
        "bucket_start": {"$gte": from_ms(low), "$lt": from_ms(high)},
        "$or": [{f"stats.{n}": {"$exists": True}} for n in names],
    }
    extra = pushdown(layout, matchers)
    return [{"$match": {"$and": [match, extra]} if extra else match}, {"$group": group}]


def bound_pipeline(
    layout: Layout, matchers: Sequence[Matcher], names: list[str], bounds: list[int]
) -> Pipeline:
    """The readings exactly on bucket bounds (the first instant of a bucket)."""
    on = [from_ms(b) for b in bounds]
    match: dict[str, Any] = {
        "bucket_start": {"$in": on},
        # a reading on its bucket's bound is the bucket's earliest: only a document whose
        # first_ts is a bound (or that has none) can hold one, which spares the readings'
        # scan of every other document
        "$or": [{"first_ts": {"$in": on}}, {"first_ts": {"$exists": False}}],
        "readings.ts": {"$in": on},
    }
    extra = pushdown(layout, matchers)
    on_bound = {
        "$filter": {
            "input": "$readings",
            "as": "r",
            "cond": {"$eq": ["$$r.ts", "$bucket_start"]},
        }
    }
    values = {"$map": {"input": on_bound, "as": "r", "in": {n: f"$$r.{n}" for n in names}}}
    return [
        {"$match": {"$and": [match, extra]} if extra else match},
        {"$project": {"_id": 0, "s": "$sensor_id", "tags": 1, "b": "$bucket_start", "r": values}},
    ]


def _result(name: str, stat: Stat) -> float | None:
    count, total, low, high = stat
    if count <= 0:
        return None
    return {
        "avg_over_time": total / count,
        "sum_over_time": total,
        "count_over_time": count,
        "min_over_time": low,
        "max_over_time": high,
    }[name]


class Source:
    """The statistics path of one query (its layout, reading through ``run``)."""

    def __init__(self, run: Run, layout: Layout, fetch: Fetch) -> None:
        self.run = run
        self.layout = layout
        self.fetch = fetch
        self.span = layout.span_seconds * 1000

    def aligned(self, range_ms: int, at: list[int]) -> bool:
        """Whether every window's ends are bucket bounds."""
        return (
            self.layout.bucket
            and range_ms % self.span == 0
            and all(t % self.span == 0 for t in at)
            and (max(at) - min(at) + range_ms) // self.span < MAX_BOUNDS
        )

    async def over_time(
        self, matchers: list[Matcher], function: str, range_ms: int, at: list[int]
    ) -> dict[Labels, list[float | None]] | None:
        """Each selected series' value per instant, or None: read the raw readings."""
        names = metric_names(matchers)
        if not names or not self.aligned(range_ms, at):
            return None
        low, high = min(at) - range_ms, max(at)
        buckets = await self.run(bucket_pipeline(self.layout, matchers, names, low, high + 1))
        bounds = sorted({to_ms(d["_id"]["b"]) for d in buckets if d["first"] == d["_id"]["b"]})
        on_bounds = []
        if bounds:
            on_bounds = await self.run(bound_pipeline(self.layout, matchers, names, bounds))
        stats: dict[Labels, dict[int, Stat]] = {}
        for doc in buckets:
            key = doc["_id"]
            for i, name in enumerate(names):
                count = doc.get(f"c{i}") or 0
                if count > 0:
                    labels = labels_of(key["s"], key.get("tags"), name)
                    stats.setdefault(labels, {})[to_ms(key["b"])] = [
                        float(count),
                        float(doc[f"s{i}"]),
                        sample_value(doc[f"n{i}"]) or 0.0,
                        sample_value(doc[f"x{i}"]) or 0.0,
                    ]
        edges: dict[Labels, dict[int, float]] = {}
        for doc in on_bounds:
            for reading in doc.get("r") or ():
                for name, raw in reading.items():
                    value = sample_value(raw)
                    if value is not None:
                        labels = labels_of(doc["s"], doc.get("tags"), name)
                        edges.setdefault(labels, {})[to_ms(doc["b"])] = value
        return await self._combine(matchers, function, range_ms, at, stats, edges)

    def window_stat(
        self, mine: dict[int, Stat], bound: dict[int, float], t: int, range_ms: int
    ) -> tuple[Stat, float | None]:
        """count, sum, min, max of ``(t - range, t]``, and the bound reading left out.

        The min and max are the buckets' (so they may include the left-out reading).
        """
        stat = [0.0, 0.0, float("inf"), float("-inf")]
        for b in range(t - range_ms, t, self.span):
            part = mine.get(b)
            if part is not None:
                stat = [
                    stat[0] + part[0],
                    stat[1] + part[1],
                    min(stat[2], part[2]),
                    max(stat[3], part[3]),
                ]
        gone = bound.get(t - range_ms)
        if gone is not None:  # (t - range, t] leaves out the reading at t - range
            stat[0] -= 1
            stat[1] -= gone
        come = bound.get(t)
        if come is not None:
            stat = [stat[0] + 1, stat[1] + come, min(stat[2], come), max(stat[3], come)]
        return stat, gone

    async def _combine(
        self,
        matchers: list[Matcher],
        function: str,
        range_ms: int,
        at: list[int],
        stats: dict[Labels, dict[int, Stat]],
        edges: dict[Labels, dict[int, float]],
    ) -> dict[Labels, list[float | None]]:
        columns: dict[Labels, list[float | None]] = {}
        redo: dict[Labels, list[int]] = {}
        for labels in sorted(set(stats) | set(edges)):
            if not matches_all(matchers, dict(labels)):
                continue
            mine, bound = stats.get(labels, {}), edges.get(labels, {})
            column: list[float | None] = []
            for n, t in enumerate(at):
                stat, gone = self.window_stat(mine, bound, t, range_ms)
                extreme = function in {"min_over_time", "max_over_time"}
                if extreme and gone is not None and stat[0] > 0 and not stat[2] < gone < stat[3]:
                    redo.setdefault(labels, []).append(n)  # the extreme may have gone
                column.append(_result(function, stat))
            columns[labels] = column
        if redo:
            raw = await self.fetch(matchers, min(at) - range_ms, max(at))
            by_labels = {s.labels: s for s in raw}
            for labels, steps in redo.items():
                for n in steps:
                    columns[labels][n] = window(
                        function, by_labels[labels], at[n] - range_ms, at[n], range_ms
                    )
        out: dict[Labels, list[float | None]] = {}
        for labels, column in columns.items():
            if any(v is not None for v in column):
                put_unique(out, drop_name(labels), column)
        return out

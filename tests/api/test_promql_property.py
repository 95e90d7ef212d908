"""Generated readings and generated queries of the supported subset: the same answer from
both layouts, and the answer of the reference evaluation over the readings written.

In-process over the emulator (the real writers, the real pipelines, the evaluator without
HTTP); few examples, since every example writes two collections.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ingest.api.prom_http import DEFAULT_LOOKBACK_MS, PromApi, range_result
from ingest.api.promql import Steps, parse
from ingest.api.read_queries import Layout
from ingest.model import Reading
from ingest.store.schema import Schema
from ingest.store.writers.bucket import BucketWriter
from ingest.store.writers.timeseries import TimeseriesWriter
from tests.api.promql_reference import Reference, close

START = datetime(2026, 5, 1, 8, tzinfo=UTC)
SERIES = {"a": {"room": "x"}, "b": {"room": "y"}, "$c": {}}
_count = itertools.count()


@st.composite
def readings(draw: st.DrawFn) -> list[Reading]:
    out = []
    for sensor, tags in SERIES.items():
        # minutes of three hours; some readings exactly on the hour (the buckets' bounds)
        minutes = draw(st.sets(st.integers(0, 179), min_size=0, max_size=25))
        minutes |= draw(st.sets(st.sampled_from([0, 60, 120]), max_size=3))
        for m in sorted(minutes):
            ts = START + timedelta(minutes=m, seconds=draw(st.sampled_from([0, 0, 17, 42])))
            value: Any = draw(
                st.one_of(
                    st.integers(-50, 50),
                    st.floats(-100, 100, allow_nan=False).map(lambda f: round(f, 3)),
                    st.booleans(),
                )
            )
            out.append(Reading(sensor, ts, ts.timestamp(), {"v": value}, None, tags=tags or None))
    return out


SELECTORS = ["v", 'v{sensor_id="a"}', 'v{room=~"x|y"}', 'v{room!="x"}', 'v{sensor_id=~".*c"}']
FUNCTIONS = [
    "avg_over_time",
    "min_over_time",
    "max_over_time",
    "sum_over_time",
    "count_over_time",
    "last_over_time",
    "rate",
    "increase",
    "delta",
]


@st.composite
def queries(draw: st.DrawFn) -> str:
    selector = draw(st.sampled_from(SELECTORS))
    function = draw(st.sampled_from([None, *FUNCTIONS]))
    expr = selector
    if function is not None:
        span = draw(st.sampled_from(["10m", "30m", "1h", "2h"]))
        offset = draw(st.sampled_from(["", "", " offset 1h"]))
        expr = f"{function}({selector}[{span}]{offset})"
    aggregation = draw(st.sampled_from([None, "sum", "avg", "min", "max", "count"]))
    if aggregation is not None:
        grouping = draw(st.sampled_from(["", " by (room)", " without (room)", " by (sensor_id)"]))
        expr = f"{aggregation}{grouping} ({expr})"
    tail = draw(st.sampled_from(["", "", " * 2", " > bool 0", " > 10", " - 1"]))
    return expr + tail


async def write(db: Any, layout: str, rows: list[Reading]) -> Any:
    name = f"{layout}_{next(_count)}"
    schema = Schema(
        db,
        name,
        rejects_collection="rejects",
        rejects_max_bytes=1 << 20,
        retention_days=None,
        span_seconds=3600,
    )
    if layout == "bucket":
        writer: Any = BucketWriter(db[name], schema, 3600, max_readings=7)
    else:
        writer = TimeseriesWriter(db[name], schema)
    await writer.ensure_schema()
    if rows:
        await writer.write(writer.plan(rows))
    return db[name]


@settings(
    max_examples=12,
    deadline=None,
    # no shrinking: each step writes two collections to the emulator (minutes); the
    # failing example is printed whole, small enough to read
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    rows=readings(),
    query=queries(),
    first=st.sampled_from([timedelta(hours=1), timedelta(hours=2), timedelta(minutes=47)]),
    step=st.sampled_from([300, 3600, 7200]),
)
async def test_both_layouts_and_the_reference_agree(
    db: Any, rows: list[Reading], query: str, first: timedelta, step: int
) -> None:
    start, end = START + first, START + timedelta(hours=3, minutes=30)
    times = list(
        range(round(start.timestamp() * 1000), round(end.timestamp() * 1000) + 1, step * 1000)
    )
    answers = []
    for layout in ("bucket", "timeseries"):
        collection = await write(db, layout, rows)

        async def run(pipeline: list[dict[str, Any]], c: Any = collection) -> list[dict[str, Any]]:
            return await (await c.aggregate(pipeline)).to_list()  # type: ignore[no-any-return]

        api = PromApi(run, Layout(layout, 3600), lambda: end, 10)
        value = await api.evaluate(parse(query), Steps(times, DEFAULT_LOOKBACK_MS, step * 1000))
        answers.append(range_result(value, times))
    expected = Reference(rows).range(query, start, end, step)
    assert close(answers[0], answers[1]), (query, answers)
    assert close(answers[0], expected), (query, answers[0], expected)


async def aligned_answers(db: Any, rows: list[Reading], query: str, raw: bool) -> tuple[Any, Any]:
    """An aligned range query (1h steps, whole hours) in bucket mode; ``raw``: may read raw."""
    collection = await write(db, "bucket", rows)
    start, end = START + timedelta(hours=1), START + timedelta(hours=3)
    times = list(
        range(round(start.timestamp() * 1000), round(end.timestamp() * 1000) + 1, 3_600_000)
    )

    async def run(pipeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return await (await collection.aggregate(pipeline)).to_list()  # type: ignore[no-any-return]

    api = PromApi(run, Layout("bucket", 3600), lambda: end, 10)
    if not raw:

        async def refuse(*_: Any) -> Any:
            raise AssertionError("read raw readings")

        api.fetch = refuse  # type: ignore[method-assign,assignment]
    value = await api.evaluate(parse(query), Steps(times, DEFAULT_LOOKBACK_MS, 3_600_000))
    return range_result(value, times), Reference(rows).range(query, start, end, 3600)


def hourly(values: dict[int, float]) -> list[Reading]:
    """Readings of sensor a at the given minutes (0, 60, 120: on the buckets' bounds)."""
    out = []
    for minute, value in values.items():
        ts = START + timedelta(minutes=minute)
        out.append(Reading("a", ts, ts.timestamp(), {"v": value}, None, tags={"room": "x"}))
    return out


async def test_aligned_over_time_is_answered_from_the_statistics(db: Any) -> None:
    # readings on the bounds (minutes 60 and 120) that are no window's extreme
    rows = hourly({10: 5.0, 30: 1.0, 60: 3.0, 61: 9.0, 90: 2.0, 120: 4.0, 150: 8.0, 170: 0.5})
    for function in ("avg", "min", "max", "sum", "count"):
        got, expected = await aligned_answers(db, rows, f"{function}_over_time(v[1h])", raw=False)
        assert expected
        assert close(got, expected), (function, got, expected)
    got, expected = await aligned_answers(
        db, rows, "sum by (room) (avg_over_time(v[2h]))", raw=False
    )
    assert close(got, expected), (got, expected)


async def test_a_bound_reading_that_was_the_extreme_is_recomputed(db: Any) -> None:
    # minute 60 is the minimum of the second bucket, and not part of the window (60, 120]
    rows = hourly({30: 5.0, 60: 0.1, 70: 3.0, 110: 2.0, 120: 4.0})
    for function in ("min", "max"):
        got, expected = await aligned_answers(db, rows, f"{function}_over_time(v[1h])", raw=True)
        assert close(got, expected), (function, got, expected)

"""PromQL over the stored readings: both layouts answer alike, and as the raw readings imply.

The readings of tests/api/test_api.py (three sensors, three hours, a number, an integer
that is sometimes there, a boolean, a string, tags, overflow documents) go through both
real writers into the emulator; one API serves each collection over HTTP. Every answer
is compared with :mod:`tests.api.promql_reference`, a plain evaluation over the readings
as they were written, and between the layouts.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import aiohttp
import pytest

from tests.api.promql_reference import Reference, close
from tests.api.test_api import START, fleet, serving, write_both

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


@pytest.fixture
async def proms(mongo: Any, db: Any, db_name: str) -> AsyncIterator[dict[str, Any]]:
    readings = fleet()
    await write_both(db, readings)
    async with (
        serving(mongo, db_name, "bucket") as bucket,
        serving(mongo, db_name, "timeseries") as series,
        aiohttp.ClientSession() as http,
    ):
        yield {"bucket": bucket, "timeseries": series, "http": http, "ref": Reference(readings)}


async def call(
    proms: dict[str, Any], mode: str, path: str, params: dict[str, str], post: bool = False
) -> tuple[int, Any]:
    url = proms[mode] + path
    if post:
        async with proms["http"].post(url, data=params) as resp:
            return resp.status, await resp.json()
    async with proms["http"].get(url + "?" + urlencode(params)) as resp:
        return resp.status, await resp.json()


def seconds(delta: timedelta) -> str:
    return str((START + delta).timestamp())


QUERIES = [
    "temp",
    'temp{room="kitchen"}',
    'temp{room=~"hall|attic"}',
    'temp{room!~"h.*"}',
    'temp{room=""}',
    'temp{sensor_id!="s1"}',
    '{__name__="on"}',
    '{__name__=~"temp|hum", sensor_id="s1"}',
    "avg_over_time(temp[20m])",
    "min_over_time(hum[30m])",
    "max_over_time(temp[30m] offset 10m)",
    'sum_over_time({__name__="on"}[1h])',
    "count_over_time(temp[15m])",
    "last_over_time(hum[1h])",
    "rate(temp[30m])",
    "increase(temp[30m])",
    "delta(temp[30m])",
    "sum by (room) (temp)",
    "avg without (room) (avg_over_time(temp[30m]))",
    "max(temp)",
    "count by (sensor_id) (hum)",
    "min by (sensor_id, room) (temp)",
    "temp * 2 - 1",
    "2 ^ hum / 1e9",
    "temp > 20",
    "20 < bool temp",
    "-temp",
    "(1 + 2) * 3",
    "1 > bool 2",
    "temp % 3",
]


@pytest.mark.parametrize("post", [False, True])
async def test_range_queries_match_the_readings_in_both_layouts(
    proms: dict[str, Any], post: bool
) -> None:
    start, end, step = timedelta(minutes=50), timedelta(hours=3, minutes=5), 600
    ref: Reference = proms["ref"]
    for query in QUERIES if not post else QUERIES[:6]:
        params = {"query": query, "start": seconds(start), "end": seconds(end), "step": str(step)}
        answers = [
            await call(proms, mode, "/api/v1/query_range", params, post)
            for mode in ("bucket", "timeseries")
        ]
        for status, body in answers:
            assert status == 200, (query, body)
            assert body["status"] == "success"
            assert body["data"]["resultType"] == "matrix"
        expected = ref.range(query, START + start, START + end, step)
        for _, body in answers:
            assert close(body["data"]["result"], expected), (query, body, expected)


async def test_instant_queries_and_the_lookback(proms: dict[str, Any]) -> None:
    ref: Reference = proms["ref"]
    last = ref.last_time()
    for query in ("temp", "sum by (room) (temp)", "temp[20m]", "avg_over_time(temp[1h])", "3"):
        for at in (last, last + timedelta(minutes=4), last + timedelta(minutes=6)):
            params = {"query": query, "time": str(at.timestamp())}
            for mode in ("bucket", "timeseries"):
                status, body = await call(proms, mode, "/api/v1/query", params)
                assert status == 200, body
                assert close(body["data"], ref.instant(query, at)), (query, at, body)
    # a sensor that stops reporting leaves the answer after the lookback (5 minutes)
    params = {"query": "temp", "time": str((last + timedelta(minutes=6)).timestamp())}
    _, body = await call(proms, "bucket", "/api/v1/query", params)
    assert body["data"]["result"] == []
    params["lookback_delta"] = "10m"
    _, body = await call(proms, "bucket", "/api/v1/query", params)
    assert body["data"]["result"] != []


async def test_series_labels_values_metadata(proms: dict[str, Any]) -> None:
    window = {"start": seconds(timedelta()), "end": seconds(timedelta(hours=4))}
    for mode in ("bucket", "timeseries"):
        status, body = await call(proms, mode, "/api/v1/series", {"match[]": "temp", **window})
        assert status == 200, body
        assert (
            body["data"]
            == [
                {"__name__": "temp", "room": "kitchen", "sensor_id": "s1"},
                {"__name__": "temp", "room": "attic", "sensor_id": "s2"},
                {"__name__": "temp", "room": "hall", "sensor_id": "s2"},
                {"__name__": "temp", "sensor_id": "s3"},
            ]
            or sorted(body["data"], key=lambda d: sorted(d.items())) == body["data"]
        )
        _, body = await call(proms, mode, "/api/v1/labels", window)
        assert body["data"] == ["__name__", "room", "sensor_id"]
        _, body = await call(proms, mode, "/api/v1/label/__name__/values", window)
        assert body["data"] == ["hum", "on", "temp"]  # "state" holds strings: not samples
        _, body = await call(
            proms, mode, "/api/v1/label/room/values", {"match[]": '{sensor_id="s2"}', **window}
        )
        assert body["data"] == ["attic", "hall"]
        _, body = await call(proms, mode, "/api/v1/metadata", window)
        assert body["data"]["temp"] == [
            {"type": "gauge", "help": "the measurement temp of the stored readings", "unit": "Cel"}
        ]
        assert body["data"]["on"][0]["unit"] == ""


@pytest.mark.parametrize(
    ("path", "params", "status", "error_type", "words"),
    [
        ("/api/v1/query", {"query": "temp{"}, 400, "bad_data", "query"),
        (
            "/api/v1/query",
            {"query": "histogram_quantile(0.9, temp)"},
            422,
            "execution",
            "histogram_quantile",
        ),
        ("/api/v1/query", {"query": "temp / hum"}, 422, "execution", "two vectors"),
        ("/api/v1/query", {"query": "topk(2, temp)"}, 422, "execution", "topk"),
        ("/api/v1/query", {"query": "temp", "time": "yesterday"}, 400, "bad_data", '"time"'),
        (
            "/api/v1/query_range",
            {"query": "temp", "start": "1", "end": "0", "step": "1"},
            400,
            "bad_data",
            "before start",
        ),
        (
            "/api/v1/query_range",
            {"query": "temp", "start": "0", "end": "100000", "step": "1"},
            400,
            "bad_data",
            "11,000",
        ),
        (
            "/api/v1/query_range",
            {"query": "temp", "start": "0", "end": "1", "step": "0"},
            400,
            "bad_data",
            "step",
        ),
        (
            "/api/v1/query_range",
            {"query": "temp[5m]", "start": "0", "end": "1", "step": "1"},
            400,
            "bad_data",
            "range vector",
        ),
        ("/api/v1/series", {}, 400, "bad_data", "match[]"),
        ("/api/v1/query", {"query": 'temp{room=~"(a)\\\\1"}'}, 400, "bad_data", "regex"),
    ],
)
async def test_errors_have_prometheus_shape(
    proms: dict[str, Any],
    path: str,
    params: dict[str, str],
    status: int,
    error_type: str,
    words: str,
) -> None:
    got, body = await call(proms, "bucket", path, params)
    assert got == status, body
    assert body["status"] == "error"
    assert body["errorType"] == error_type
    assert words in body["error"]


async def test_the_at_modifier_pins_the_evaluation_time(proms: dict[str, Any]) -> None:
    at = START + timedelta(hours=2, minutes=3)
    ref: Reference = proms["ref"]
    expected = {
        tuple(sorted(s["metric"].items())): s["value"][1] for s in ref.instant("temp", at)["result"]
    }
    assert expected
    for query in (f"temp @ {at.timestamp()}", "temp @ end()"):
        params = {"query": query, "start": seconds(timedelta(hours=1)), "step": "600"}
        params["end"] = str(at.timestamp())
        for mode in ("bucket", "timeseries"):
            status, body = await call(proms, mode, "/api/v1/query_range", params)
            assert status == 200, body
            for series in body["data"]["result"]:
                value = expected[tuple(sorted(series["metric"].items()))]
                assert {v for _, v in series["values"]} == {value}, (query, series)
            assert len(body["data"]["result"]) == len(expected)

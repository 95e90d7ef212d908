"""The read API answers the same from both layouts, and what the readings imply.

The same readings go through both real writers (late readings included, and a small
``bucket_max_readings`` so one sensor-hour spans several documents); one API serves each
collection, over HTTP through the real driver.
"""

from __future__ import annotations

import contextlib
import math
import random
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web

from ingest.api.read_queries import iso
from ingest.api.server import ReadApi
from ingest.config import ApiSettings
from ingest.model import Reading
from ingest.store.schema import Schema
from ingest.store.writers.bucket import BucketWriter
from ingest.store.writers.timeseries import TimeseriesWriter
from loadgen.daemons import parse_metrics

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

START = datetime(2026, 5, 1, 8, tzinfo=UTC)
NOW = START + timedelta(hours=3, minutes=10)
SENSORS = ("s1", "s2", "s3")
MAX_READINGS = 6  # several documents per sensor-hour


UNITS = {"temp": "Cel", "hum": "%RH"}


def fleet() -> list[Reading]:
    """Three sensors over three hours: a number, a sometimes-present integer, a boolean,
    a string; s1 has units and a tag, s2 a tag that changes in the third hour."""
    rng = random.Random(18)
    out = []
    for sensor in SENSORS:
        for i in range(30):  # one every 6 minutes, jittered
            ts = START + timedelta(
                seconds=360 * i + rng.randint(0, 300), milliseconds=rng.randint(0, 999)
            )
            values: dict[str, Any] = {"temp": round(rng.uniform(15, 25), 2)}
            if i % 3 == 0:
                values["hum"] = rng.randint(30, 60)
            if sensor != "s3":
                values["on"] = i % 4 == 0
            tags = units = None
            if sensor == "s1":
                tags = {"room": "kitchen"}
                units = {m: u for m, u in UNITS.items() if m in values}
            elif sensor == "s2":
                values["state"] = "busy" if i % 2 else "idle"
                tags = {"room": "hall" if i < 20 else "attic"}
            out.append(Reading(sensor, ts, ts.timestamp(), values, i, tags=tags, units=units))
    return out


# (sensor, tags) of each series: s2's tag changed, so it has two
SERIES = [
    ("s1", {"room": "kitchen"}),
    ("s2", {"room": "attic"}),
    ("s2", {"room": "hall"}),
    ("s3", {}),
]


def series_of(reading: Reading) -> tuple[str, tuple[tuple[str, str], ...]]:
    return reading.sensor_id, tuple(sorted((reading.tags or {}).items()))


def batches(readings: list[Reading]) -> list[list[Reading]]:
    """In time order, but a fifth of the first hour's readings arrive at the very end."""
    ordered = sorted(readings, key=lambda r: r.epoch)
    late = [r for r in ordered[:40] if r.seq is not None and r.seq % 5 == 1]
    early = [r for r in ordered if r not in late]
    chunks = [early[i : i + 25] for i in range(0, len(early), 25)]
    return [*chunks, late]


async def write_both(db: Any, readings: list[Reading]) -> None:
    def schema(name: str) -> Schema:
        return Schema(
            db,
            name,
            rejects_collection="rejects",
            rejects_max_bytes=1 << 20,
            retention_days=None,
            span_seconds=3600,
        )

    bucket = BucketWriter(db.buckets, schema("buckets"), 3600, max_readings=MAX_READINGS)
    series = TimeseriesWriter(db.readings, schema("readings"))
    await bucket.ensure_schema()
    await series.ensure_schema()
    for batch in batches(readings):
        for writer in (bucket, series):
            outcome = await writer.write(writer.plan(batch))
            assert outcome.written == len(batch)
    await db.rejects.insert_many(
        [
            {
                "at": NOW - timedelta(minutes=m),
                "mode": "bucket",
                "topic": "sensors/x",
                "reason": reason,
                "detail": f"detail {m}",
                "payload": "{}",
                "payload_bytes": 2,
            }
            for m, reason in ((1, "bad_json"), (5, "bad_value"), (7, "bad_json"), (90, "old"))
        ]
    )


@contextlib.asynccontextmanager
async def serving(mongo: Any, db_name: str, mode: str) -> AsyncIterator[str]:
    settings = ApiSettings(
        mode=mode,  # type: ignore[arg-type]
        db=db_name,
        collection="buckets" if mode == "bucket" else "readings",
    )
    api = ReadApi(settings, mongo, clock=lambda: NOW)
    await api.check_layout()
    runner = web.AppRunner(api.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def apis(mongo: Any, db: Any, db_name: str) -> AsyncIterator[dict[str, Any]]:
    readings = fleet()
    await write_both(db, readings)
    # overflow: more documents than sensor-hours, and a first-hour document that is not
    # full (the late readings, written after the third hour's)
    assert await db.buckets.count_documents({}) > 3 * 3
    assert (
        await db.buckets.count_documents({"bucket_start": START, "count": {"$lt": MAX_READINGS}})
        > 0
    )
    async with (
        serving(mongo, db_name, "bucket") as bucket,
        serving(mongo, db_name, "timeseries") as series,
        aiohttp.ClientSession() as http,
    ):
        yield {"bucket": bucket, "timeseries": series, "http": http, "readings": readings, "db": db}


async def get(apis: dict[str, Any], mode: str, path: str, status: int = 200) -> Any:
    async with apis["http"].get(apis[mode] + path) as resp:
        body = await resp.json()
        assert resp.status == status, body
        return body


async def both(apis: dict[str, Any], path: str) -> Any:
    """The answer of both layouts, which must be identical."""
    bucket = await get(apis, "bucket", path)
    series = await get(apis, "timeseries", path)
    assert bucket == series, path
    return bucket


def numeric(value: Any) -> float:
    return int(value) if isinstance(value, bool) else value


async def test_sensors_list_is_the_same_and_complete(apis: dict[str, Any]) -> None:
    readings = apis["readings"]
    since = START + timedelta(minutes=30)
    answer = await both(apis, f"/api/sensors?since={iso(since)}")
    assert [(s["sensor_id"], s["tags"]) for s in answer["sensors"]] == SERIES
    for entry in answer["sensors"]:
        key = (entry["sensor_id"], tuple(sorted(entry["tags"].items())))
        mine = [r for r in readings if series_of(r) == key and r.ts >= since]
        assert entry["readings"] == len(mine)
        assert entry["first_seen"] == iso(min(r.ts for r in mine))
        assert entry["last_seen"] == iso(max(r.ts for r in mine))
        assert entry["measurements"] == sorted({m for r in mine for m in r.values})
        assert entry["units"] == (UNITS if entry["sensor_id"] == "s1" else {})
        assert entry["info"] == {}
    assert [s["label"] for s in answer["sensors"]] == [
        "s1{room=kitchen}",
        "s2{room=attic}",
        "s2{room=hall}",
        "s3",
    ]
    # paging: one series a page, the cursor leads through all of them
    seen, path = [], f"/api/sensors?since={iso(since)}&limit=1"
    while True:
        page = await both(apis, path)
        seen += [(s["sensor_id"], s["tags"]) for s in page["sensors"]]
        if page["next"] is None:
            break
        path = f"/api/sensors?since={iso(since)}&limit=1&cursor={page['next']}"
    assert seen == SERIES
    # search: the sensor id or a tag (key=value) holding the text, ignoring case; paged
    for text, found in (
        ("S2", SERIES[1:3]),
        ("ROOM=K", SERIES[:1]),
        ("hal", SERIES[2:3]),
        ("3", SERIES[3:]),
        (".*", []),  # text, not a regular expression
        ("$room", []),
    ):
        query = f"/api/sensors?since={iso(since)}&search={quote(text)}"
        answer = await both(apis, query)
        assert [(s["sensor_id"], s["tags"]) for s in answer["sensors"]] == found, text
    page = await both(apis, f"/api/sensors?since={iso(since)}&search=s2&limit=1")
    rest = await both(
        apis, f"/api/sensors?since={iso(since)}&search=s2&limit=1&cursor={page['next']}"
    )
    assert [s["tags"] for s in page["sensors"] + rest["sensors"]] == [
        {"room": "attic"},
        {"room": "hall"},
    ]
    assert rest["next"] is None
    error = await get(apis, "bucket", "/api/sensors?search=" + "x" * 129, 400)
    assert error["error"]["parameter"] == "search"


async def test_raw_readings_page_through_both_layouts_alike(apis: dict[str, Any]) -> None:
    readings = apis["readings"]
    since, until = START + timedelta(minutes=20), START + timedelta(hours=2, minutes=5)
    base = f"/api/readings?sensor=s3,s1&since={iso(since)}&until={iso(until)}&limit=7"
    got, path, pages = [], base, 0
    while path:
        page = await both(apis, path)
        assert len(page["readings"]) <= 7
        got += page["readings"]
        pages += 1
        path = f"{base}&cursor={page['next']}" if page["next"] else ""
    expected = sorted(
        (r for r in readings if r.sensor_id in {"s1", "s3"} and since <= r.ts < until),
        key=lambda r: (series_of(r), r.epoch),
    )
    assert pages == math.ceil(len(expected) / 7)
    assert [(g["sensor_id"], g["tags"], g["ts"], g["seq"]) for g in got] == [
        (r.sensor_id, r.tags or {}, iso(r.ts), r.seq) for r in expected
    ]
    assert [g["values"] for g in got] == [r.values for r in expected]
    # one measurement: only readings that have it, and only its value
    hum = await both(
        apis, f"/api/readings?sensor=s2&measurement=hum&since={iso(START)}&until={iso(NOW)}"
    )
    assert [g["values"] for g in hum["readings"]] == [
        {"hum": r.values["hum"]}
        for r in sorted(readings, key=lambda r: (series_of(r), r.epoch))
        if r.sensor_id == "s2" and "hum" in r.values
    ]
    # one series of s2, by its tag
    hall = await both(
        apis, f"/api/readings?sensor=s2&tag=room:hall&since={iso(START)}&until={iso(NOW)}"
    )
    assert [g["seq"] for g in hall["readings"]] == list(range(20))
    assert {g["tags"]["room"] for g in hall["readings"]} == {"hall"}


def expected_series(
    readings: list[Reading],
    sensor: str,
    tags: dict[str, str],
    name: str,
    low: datetime,
    high: datetime,
    step: timedelta,
) -> list[tuple[str, int, float, float, float]]:
    groups: dict[datetime, list[float]] = {}
    for r in readings:
        if (
            series_of(r) == (sensor, tuple(sorted(tags.items())))
            and name in r.values
            and low <= r.ts < high
        ):
            t = low + step * ((r.ts - low) // step)
            groups.setdefault(t, []).append(numeric(r.values[name]))
    return [(iso(t), len(v), min(v), sum(v) / len(v), max(v)) for t, v in sorted(groups.items())]


@pytest.mark.parametrize(
    ("step", "source"), [("10m", "readings"), ("1h", "stats"), ("2h", "stats"), ("90m", "readings")]
)
async def test_series_match_each_other_and_the_readings(
    apis: dict[str, Any], step: str, source: str
) -> None:
    readings = apis["readings"]
    since, until = START + timedelta(minutes=7), START + timedelta(hours=2, minutes=50)
    path = (
        f"/api/series?sensor=s1,s2,s3&measurement=temp,hum,on,state&since={iso(since)}"
        f"&until={iso(until)}&step={step}"
    )
    bucket = await get(apis, "bucket", path)
    series = await get(apis, "timeseries", path)
    assert bucket["source"] == source
    assert series["source"] == "readings"
    assert (bucket["since"], bucket["until"]) == (series["since"], series["until"])
    low = datetime.fromisoformat(bucket["since"])
    high = datetime.fromisoformat(bucket["until"])
    step_td = timedelta(seconds=bucket["step_seconds"])
    assert low <= since
    assert high >= until
    pairs = [
        (s, t, m)
        for s, t in SERIES
        for m in ("temp", "hum", "on")
        if any(
            series_of(r) == (s, tuple(t.items())) and m in r.values and low <= r.ts < high
            for r in readings
        )
    ]
    assert [
        (e["sensor_id"], e["tags"], e["measurement"]) for e in bucket["series"]
    ] == pairs  # no strings
    for answer in (bucket, series):
        assert [e["unit"] for e in answer["series"]] == [
            UNITS.get(m) if s == "s1" else None for s, _, m in pairs
        ]
    for b, s in zip(bucket["series"], series["series"], strict=True):
        want = expected_series(
            readings, b["sensor_id"], b["tags"], b["measurement"], low, high, step_td
        )
        for points in (b["points"], s["points"]):
            assert [(p["t"], p["count"], p["min"], p["max"]) for p in points] == [
                (t, n, lo, hi) for t, n, lo, _, hi in want
            ]
            for p, w in zip(points, want, strict=True):
                assert math.isclose(p["avg"], w[3], rel_tol=1e-9)


async def test_rejects_of_the_last_hour(apis: dict[str, Any]) -> None:
    answer = await both(apis, "/api/rejects")
    assert [r["reason"] for r in answer["rejects"]] == ["bad_json", "bad_value", "bad_json"]
    assert "payload" not in answer["rejects"][0]
    assert answer["reasons"] == [
        {"reason": "bad_json", "count": 2},
        {"reason": "bad_value", "count": 1},
    ]


@pytest.mark.parametrize(
    ("path", "parameter"),
    [
        ("/api/readings?sensor=s1&since=yesterday", "since"),
        ("/api/readings?sensor=s1&since=2026-05-01T08:00:00", "since"),
        ("/api/readings?since=now-1h", "sensor"),
        ("/api/readings?sensor=a%01b", "sensor"),  # a control character
        ("/api/readings?sensor=s1&limit=0", "limit"),
        ("/api/readings?sensor=s1&limit=10001", "limit"),
        ("/api/readings?sensor=s1&cursor=xyz", "cursor"),
        ("/api/readings?sensor=s1&since=now-40d", "since"),
        ("/api/readings?sensor=s1&since=now&until=now-1h", "since"),
        ("/api/readings?sensor=s1&measurement=$where", "measurement"),
        ("/api/readings?sensor=s1&sensors=s2", "sensors"),
        ("/api/sensors?since=now-2h&step=1m", "step"),  # a parameter of another endpoint
        ("/api/info?since=now", "since"),
        ("/api/series?sensor=s1", "measurement"),
        ("/api/series?sensor=s1&measurement=temp&step=fast", "step"),
        ("/api/series?sensor=s1&measurement=temp&step=1s&since=now-1d", "step"),
        ("/api/series?sensor=s1&measurement=temp&step=1m&step=2m", "step"),
        ("/api/sensors?cursor=WyJyIiwiczEiLDEsMV0", "cursor"),  # a readings cursor
        # what int() and datetime refuse or cannot hold: a 400, never a 500
        ("/api/readings?sensor=s1&limit=%C2%B2", "limit"),  # "²": isdigit() but not int()
        ("/api/readings?sensor=s1&limit=" + "1" * 5000, "limit"),  # over int()'s 4300 digits
        ("/api/readings?sensor=s1&limit=" + "0" * 5000, "limit"),
        ("/api/readings?sensor=s1&since=%C2%B2", "since"),
        ("/api/rejects?since=%D9%A3", "since"),  # an Arabic-Indic 3: int() reads it
        ("/api/readings?sensor=s1&since=999999999999999", "since"),  # 15 digits: year 33658
        ("/api/readings?sensor=s1&since=now-99999999999w", "since"),
        ("/api/readings?sensor=s1&since=now-999999d", "since"),
        ("/api/series?sensor=s1&measurement=temp&since=now-" + "9" * 400 + "w", "since"),
        ("/api/readings?sensor=s1&since=0001-01-01T00:00:00%2B01:00", "since"),
        ("/api/readings?sensor=s1&until=9999-12-31T23:59:59-01:00", "until"),
        ("/api/series?sensor=s1&measurement=temp&since=0001-01-01T00:00:00Z", "since"),
        ("/api/series?sensor=s1&measurement=temp&until=9999-12-31T00:00:00Z", "until"),
        ("/api/rejects?since=1969-12-31T23:59:59Z", "since"),
        ("/api/series?sensor=s1&measurement=temp&step=99999999999999999999w", "step"),
        ("/api/series?sensor=s1&measurement=temp&step=" + "9" * 400, "step"),
        (
            (
                "/api/series?sensor=s1&measurement=temp&since=8999-01-01T00:00:00Z"
                "&until=8999-01-02T00:00:00Z&step=366d"
            ),
            "step",
        ),
        # a readings cursor whose time or count is out of range
        ("/api/readings?sensor=s1&cursor=WyJyIiwiczEiLDk5OTk5OTk5OTk5OTk5OTk5LDFd", "cursor"),
        ("/api/readings?sensor=s1&cursor=WyJyIiwiczEiLDEsMTg0NDY3NDQwNzM3MDk1NTE2MTVd", "cursor"),
    ],
)
async def test_bad_parameters_are_one_json_error_naming_the_parameter(
    apis: dict[str, Any], path: str, parameter: str
) -> None:
    for mode in ("bucket", "timeseries"):
        body = await get(apis, mode, path, status=400)
        assert set(body) == {"error"}
        assert body["error"]["parameter"] == parameter
        assert body["error"]["message"]


async def test_metrics_page_and_unknown_paths(apis: dict[str, Any]) -> None:
    await get(apis, "bucket", "/api/sensors")
    await get(apis, "bucket", "/api/series?sensor=s1", status=400)
    body = await get(apis, "bucket", "/api/nothing", status=404)
    assert body["error"]["message"]
    async with apis["http"].get(apis["bucket"] + "/metrics") as resp:
        metrics = parse_metrics(await resp.text())
    count = "ingest_api_request_seconds_count"
    assert metrics[f'{count}{{endpoint="sensors",status="2xx"}}'] == 1
    assert metrics[f'{count}{{endpoint="series",status="4xx"}}'] == 1
    assert metrics[f'{count}{{endpoint="other",status="4xx"}}'] == 1
    assert metrics[f'{count}{{endpoint="readings",status="5xx"}}'] == 0
    async with apis["http"].get(apis["bucket"] + "/") as resp:
        assert resp.status == 200
        assert "<html" in (await resp.text()).lower()
    for asset in ("page.js", "vendor/uPlot.iife.min.js", "vendor/uPlot.min.css"):
        async with apis["http"].get(f"{apis['bucket']}/static/{asset}") as resp:
            assert resp.status == 200, asset
    info = await get(apis, "timeseries", "/api/info")
    assert info["mode"] == "timeseries"
    assert info["grafana_dashboard"] is None  # no --grafana-url: the page shows no link
    assert info["measurement_order"]["first"][0] == "temperature"
    assert "battery*" in info["measurement_order"]["last"]


async def test_the_api_refuses_a_collection_of_the_other_layout(
    mongo: Any, db: Any, db_name: str
) -> None:
    await write_both(db, fleet()[:3])
    settings = ApiSettings(mode="bucket", db=db_name, collection="readings")
    with pytest.raises(Exception, match=r"--mode bucket: .*readings is a time-series collection"):
        await ReadApi(settings, mongo).check_layout()

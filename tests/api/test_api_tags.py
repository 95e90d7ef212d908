"""Series with tags, and an instant written in two batches, read back alike from both layouts.

A Telegraf-like host ``h1``: ``disk_free`` under ``path=/`` and ``path=/boot`` (two series
of one sensor) and ``mem_free`` without tags. A Sparkplug-like device whose instants were
each written in two batches: in timeseries mode that is two documents at one ``ts``
(written through the real writers). A sensor id with a comma, asked for percent-encoded.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from yarl import URL

from ingest.api.read_queries import iso
from ingest.model import Reading
from ingest.store.schema import Schema
from ingest.store.writers.bucket import BucketWriter
from ingest.store.writers.timeseries import TimeseriesWriter
from tests.api.test_api import NOW, get, serving

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

START = NOW - timedelta(minutes=50)
DEVICE = "Plant1/Edge1/Press"
COMMA = "Hall, east"


def at(minute: int) -> datetime:
    return START + timedelta(minutes=minute)


def telegraf() -> list[Reading]:
    out = []
    for i in range(10):
        ts = at(i * 4)
        for path, free in (("/", 200 + i), ("/boot", 300 - i)):
            out.append(
                Reading(
                    "h1",
                    ts,
                    ts.timestamp(),
                    {"disk_free": free, "disk_used": i},
                    tags={"path": path},
                    info={"os": "linux-6.1" if i == 9 else "linux"},
                )
            )
        out.append(Reading("h1", ts, ts.timestamp(), {"mem_free": 1000 + i}, tags={}))
        out.append(Reading(COMMA, ts, ts.timestamp(), {"temp": 20 + i}, tags={}))
    return out


def sparkplug() -> tuple[list[Reading], list[Reading]]:
    """Two batches: the same instants, the second adds other fields (and other seqs)."""
    first = [
        Reading(
            DEVICE,
            at(i * 5),
            at(i * 5).timestamp(),
            {"pressure": 1.5 + i},
            i,
            tags={},
            units={"pressure": "bar"},
        )
        for i in range(8)
    ]
    second = [
        Reading(
            DEVICE,
            at(i * 5),
            at(i * 5).timestamp(),
            {"temp": 40.0 + i, "on": i % 2 == 0},
            100 + i,
            tags={},
            units={"temp": "Cel"},
        )
        for i in range(8)
    ]
    return first, second


@pytest.fixture
async def apis(mongo: Any, db: Any, db_name: str) -> AsyncIterator[dict[str, Any]]:
    def schema(name: str) -> Schema:
        return Schema(
            db,
            name,
            rejects_collection="rejects",
            rejects_max_bytes=1 << 20,
            retention_days=None,
            span_seconds=3600,
        )

    bucket = BucketWriter(db.buckets, schema("buckets"), 3600, max_readings=4)
    series = TimeseriesWriter(db.readings, schema("readings"))
    for writer in (bucket, series):
        await writer.ensure_schema()
        for batch in (telegraf(), *sparkplug()):
            outcome = await writer.write(writer.plan(batch))
            assert outcome.written == len(batch)
    # the merged instants: two documents each in timeseries mode, one entry in bucket mode
    assert await db.readings.count_documents({"meta.sensor_id": DEVICE}) == 16
    assert (
        sum(len(d["readings"]) for d in await db.buckets.find({"sensor_id": DEVICE}).to_list()) == 8
    )
    async with (
        serving(mongo, db_name, "bucket") as b,
        serving(mongo, db_name, "timeseries") as t,
        aiohttp.ClientSession() as http,
    ):
        yield {"bucket": b, "timeseries": t, "http": http}


async def get_raw(apis: dict[str, Any], mode: str, path: str) -> Any:
    """As sent: aiohttp's URL would turn %2C into a literal comma."""
    async with apis["http"].get(URL(apis[mode] + path, encoded=True)) as resp:
        body = await resp.json()
        assert resp.status == 200, body
        return body


async def both(apis: dict[str, Any], path: str) -> Any:
    """Both layouts' answer, which must be the same (but for where series came from)."""
    bucket = await get_raw(apis, "bucket", path)
    series = await get_raw(apis, "timeseries", path)
    if "source" in bucket:
        assert bucket.pop("source") in {"stats", "readings"}
        assert series.pop("source") == "readings"
    assert bucket == series, path
    return bucket


WINDOW = f"since={iso(START)}&until={iso(NOW)}"


async def test_sensors_lists_each_series_with_its_tags(apis: dict[str, Any]) -> None:
    answer = await both(apis, f"/api/sensors?{WINDOW}")
    got = [(s["sensor_id"], s["tags"], s["readings"], s["measurements"]) for s in answer["sensors"]]
    assert got == [
        ("Hall, east", {}, 10, ["temp"]),
        (DEVICE, {}, 8, ["on", "pressure", "temp"]),  # 16 documents, 8 readings
        ("h1", {}, 10, ["mem_free"]),
        ("h1", {"path": "/"}, 10, ["disk_free", "disk_used"]),
        ("h1", {"path": "/boot"}, 10, ["disk_free", "disk_used"]),
    ]
    by_label = {s["label"]: s for s in answer["sensors"]}
    assert by_label["h1{path=/boot}"]["info"] == {"os": "linux-6.1"}  # the latest
    assert by_label["h1"]["info"] == {}
    assert by_label[DEVICE]["units"] == {"pressure": "bar", "temp": "Cel"}
    # a page per series
    seen, path = [], f"/api/sensors?{WINDOW}&limit=2"
    while path:
        page = await both(apis, path)
        seen += [s["label"] for s in page["sensors"]]
        path = f"/api/sensors?{WINDOW}&limit=2&cursor={page['next']}" if page["next"] else ""
    assert seen == [s["label"] for s in answer["sensors"]]


async def test_readings_carry_tags_and_merge_an_instant_of_two_documents(
    apis: dict[str, Any],
) -> None:
    answer = await both(apis, f"/api/readings?sensor=h1&{WINDOW}")
    assert [(r["tags"], r["ts"]) for r in answer["readings"]] == [
        (tags, iso(at(i * 4))) for tags in ({}, {"path": "/"}, {"path": "/boot"}) for i in range(10)
    ]
    device = await both(apis, f"/api/readings?sensor={DEVICE}&{WINDOW}")
    assert [(r["ts"], r["seq"], r["values"]) for r in device["readings"]] == [
        (iso(at(i * 5)), i, {"on": i % 2 == 0, "pressure": 1.5 + i, "temp": 40.0 + i})
        for i in range(8)
    ]
    # only a field of the second document: the reading's seq is still its first one's
    temp = await both(apis, f"/api/readings?sensor={DEVICE}&measurement=temp&{WINDOW}")
    assert [(r["seq"], r["values"]) for r in temp["readings"]] == [
        (i, {"temp": 40.0 + i}) for i in range(8)
    ]
    # pages of one reading: an instant of two documents is neither cut nor repeated
    for limit in (1, 2, 3):
        base = f"/api/readings?sensor={DEVICE}&sensor=h1&{WINDOW}&limit={limit}"
        got, path = [], base
        while path:
            page = await both(apis, path)
            assert len(page["readings"]) <= limit
            got += page["readings"]
            path = f"{base}&cursor={page['next']}" if page["next"] else ""
        assert got == device["readings"] + answer["readings"], limit


async def test_tag_selects_series(apis: dict[str, Any]) -> None:
    boot = await both(apis, f"/api/readings?sensor=h1&tag=path:/boot&{WINDOW}")
    assert {r["tags"]["path"] for r in boot["readings"]} == {"/boot"}
    assert len(boot["readings"]) == 10
    disks = await both(apis, f"/api/readings?sensor=h1&tag=path:/&tag=path:/boot&{WINDOW}")
    assert len(disks["readings"]) == 20
    none = await both(apis, f"/api/readings?sensor=h1&tag=path:/&tag=os:linux-6.1&{WINDOW}")
    assert none["readings"] == []  # os is descriptive (info), not a tag of the series
    series = await both(
        apis, f"/api/series?sensor=h1&tag=path:/boot&measurement=disk_free&{WINDOW}&step=1h"
    )
    assert [(s["label"], s["points"][0]["count"]) for s in series["series"]] == [
        ("h1{path=/boot}", 10)
    ]
    for path in (
        "/api/readings?sensor=h1&tag=path",
        "/api/series?sensor=h1&measurement=x&tag=sensor_id:h1",
        "/api/readings?sensor=h1&tag=a.b:c",
    ):
        for mode in ("bucket", "timeseries"):
            error = await get(apis, mode, path, status=400)
            assert error["error"]["parameter"] == "tag"


@pytest.mark.parametrize("step", ["5m", "1h"])
async def test_series_per_series_and_a_merged_instant_counted_once(
    apis: dict[str, Any], step: str
) -> None:
    answer = await both(
        apis,
        f"/api/series?sensor=h1&sensor={DEVICE}"
        f"&measurement=disk_free,mem_free,temp,pressure&{WINDOW}"
        f"&step={step}",
    )
    assert [(s["label"], s["measurement"]) for s in answer["series"]] == [
        ("h1", "mem_free"),
        ("h1{path=/}", "disk_free"),
        ("h1{path=/boot}", "disk_free"),
        (DEVICE, "temp"),
        (DEVICE, "pressure"),
    ]
    counts = {
        (s["label"], s["measurement"]): sum(p["count"] for p in s["points"])
        for s in answer["series"]
    }
    assert counts == {
        ("h1", "mem_free"): 10,
        ("h1{path=/}", "disk_free"): 10,
        ("h1{path=/boot}", "disk_free"): 10,
        (DEVICE, "temp"): 8,
        (DEVICE, "pressure"): 8,
    }
    boot = answer["series"][2]
    assert boot["tags"] == {"path": "/boot"}
    assert min(p["min"] for p in boot["points"]) == 291
    assert max(p["max"] for p in boot["points"]) == 300


async def test_a_sensor_id_with_a_comma_is_asked_for_percent_encoded(apis: dict[str, Any]) -> None:
    encoded = await both(apis, f"/api/readings?sensor=Hall%2C%20east&{WINDOW}")
    assert {r["sensor_id"] for r in encoded["readings"]} == {COMMA}
    assert len(encoded["readings"]) == 10
    # a literal comma separates ids: two sensors, neither of which exists
    split = await both(apis, f"/api/readings?sensor=Hall,%20east&{WINDOW}")
    assert split["readings"] == []
    both_ids = await both(apis, f"/api/readings?sensor=Hall%2C%20east,h1&tag=path:/&{WINDOW}")
    assert {r["sensor_id"] for r in both_ids["readings"]} == {"h1"}  # the tag selects
    series = await both(apis, f"/api/series?sensor=Hall%2C+east&measurement=temp&{WINDOW}&step=1h")
    assert [s["sensor_id"] for s in series["series"]] == [COMMA]


async def test_a_sensor_of_many_series_is_bounded_by_the_points_answered(
    mongo: Any, db: Any, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # at most 100 points here (20,000 in the product, too many for the emulator): 3 series
    # of one sensor, a reading a second; 40 steps of 1 s pass the first check (steps x
    # sensors x measurements) but the answer would hold 120 points
    monkeypatch.setattr("ingest.api.server.MAX_POINTS", 100)
    await db.create_collection("readings", timeseries={"timeField": "ts", "metaField": "meta"})
    start = NOW - timedelta(seconds=40)
    await db.readings.insert_many(
        [
            {"ts": start + timedelta(seconds=i), "meta": {"sensor_id": "h1", "k": k}, "v": i}
            for k in "abc"
            for i in range(40)
        ]
    )
    window = f"since={iso(start)}&until={iso(NOW)}&step=1s"
    async with serving(mongo, db_name, "timeseries") as url, aiohttp.ClientSession() as http:
        apis = {"timeseries": url, "http": http}
        error = await get(
            apis, "timeseries", f"/api/series?sensor=h1&measurement=v&{window}", status=400
        )
        assert error["error"]["parameter"] == "step"
        assert "holds 120 points" in error["error"]["message"]
        one = await get(apis, "timeseries", f"/api/series?sensor=h1&measurement=v&tag=k:b&{window}")
    assert [(s["label"], len(s["points"])) for s in one["series"]] == [("h1{k=b}", 40)]

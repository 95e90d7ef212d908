"""Every stored string is data in the read API's queries, whatever it looks like.

Sensor ids and tag values are plain text (docs/readings.md): ``$evil``, ``$$foo`` or a
Telegraf tag ``path=$HOME`` are stored as such, and an aggregation expression would read
``"$HOME"`` as a field path, ``"$$foo"`` as a variable and ``"$$REMOVE"`` as nothing.
Read back through every route and cursor (``next`` followed to the end), in both layouts:
every reading once, and never a 5xx.

The three named cases go through the real processes (mosquitto, ``ingest run`` with
Telegraf's line protocol, ``ingest api``); hypothesis then stores generated ids and tag
values through the real writers and reads them back over HTTP from the app.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import aiohttp
from aiohttp import web
from hypothesis import example, given, settings
from hypothesis import strategies as st
from yarl import URL

from ingest.api.read_queries import SeriesKey, iso, series_order
from ingest.api.server import ReadApi
from ingest.config import ApiSettings
from ingest.model import Reading
from ingest.store.schema import Schema
from ingest.store.writers.bucket import BucketWriter
from ingest.store.writers.timeseries import TimeseriesWriter
from tests.support.procs import eventually

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path

    from tests.support.procs import Daemon


def param(values: list[str]) -> str:
    """Sensor ids as the ``sensor`` parameter: each percent-encoded, a literal comma between
    (sent with ``URL(..., encoded=True)``: yarl would turn ``%2C`` into a comma)."""
    return ",".join(quote(v, safe="") for v in values)


async def follow(
    http: aiohttp.ClientSession, url: str, key: str, most_pages: int
) -> list[dict[str, Any]]:
    """Every entry of a paged answer, following ``next`` to the end (at most ``most_pages``:
    a cursor that does not advance would go on for ever)."""
    out: list[dict[str, Any]] = []
    cursor = None
    for _ in range(most_pages):
        page_url = url + (f"&cursor={cursor}" if cursor else "")
        async with http.get(URL(page_url, encoded=True)) as resp:
            body = await resp.json()
            assert resp.status == 200, (page_url, resp.status, body, len(out))
        out += body[key]
        cursor = body["next"]
        if cursor is None:
            return out
    raise AssertionError(
        f"{url}: still a next page after {most_pages} pages; {len(out)} entries so far"
    )


# -- the three named cases, through mosquitto, ingest run and ingest api -------------------


async def test_dollar_strings_read_back_once_through_the_real_processes(
    mode: str,
    daemon: Callable[..., Daemon],
    publish: Callable[..., Any],
    topic_root: str,
    api_process: Callable[..., int],
    tmp_path: Path,
) -> None:
    """Telegraf's ``disk,path=$HOME``, and sensors ``$evil`` and ``$$foo``: 5 readings
    each, read 2 a page following ``next``: each reading once, the last page says no
    more."""
    rules = tmp_path / "lp.toml"
    rules.write_text(
        f'[[rule]]\nname = "lp"\ntopic = "{topic_root}/{{sensor_id}}"\nformat = "influx"\n'
    )
    proc = daemon("--mapping", str(rules))
    start = datetime.fromtimestamp(int(time.time()) // 60 * 60 - 1200, UTC)

    def ns(i: int) -> int:
        return int((start + timedelta(seconds=10 * i)).timestamp()) * 10**9

    lines = {
        "h1": [f"disk,path=$HOME free={i}i {ns(i)}" for i in range(5)]
        + [f"disk,path=/ free={10 + i}i {ns(i)}" for i in range(5)],
        "$evil": [f"env value={20 + i} {ns(i)}" for i in range(5)],
        "$$foo": [f"env value={30 + i} {ns(i)}" for i in range(5)],
    }
    await publish([(f"{topic_root}/{sensor}", "\n".join(text)) for sensor, text in lines.items()])
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 3)
    assert {
        k: v
        for k, v in proc.metrics().items()
        if v and k.startswith(("ingest_readings_written", "ingest_readings_rejected"))
    } == {f'ingest_readings_written_total{{mode="{mode}"}}': 20}
    port = api_process("--mode", mode)
    base = f"http://127.0.0.1:{port}"
    window = f"since={quote(iso(start))}&until={quote(iso(start + timedelta(hours=1)))}"

    def reading(
        sensor: str, tags: dict[str, str], i: int, values: dict[str, Any]
    ) -> tuple[str, dict[str, str], str, dict[str, Any]]:
        return sensor, tags, iso(start + timedelta(seconds=10 * i)), values

    home = [reading("h1", {"path": "$HOME"}, i, {"disk_free": i}) for i in range(5)]
    root = [reading("h1", {"path": "/"}, i, {"disk_free": 10 + i}) for i in range(5)]
    evil = [reading("$evil", {}, i, {"env": 20.0 + i}) for i in range(5)]
    foo = [reading("$$foo", {}, i, {"env": 30.0 + i}) for i in range(5)]
    async with aiohttp.ClientSession() as http:

        async def readings(query: str) -> list[tuple[str, dict[str, str], str, Any]]:
            got = await follow(
                http, f"{base}/api/readings?{query}&{window}&limit=2", "readings", 12
            )
            return [(r["sensor_id"], r["tags"], r["ts"], r["values"]) for r in got]

        assert await readings("sensor=h1&tag=path:%24HOME") == home
        assert await readings("sensor=h1") == home + root  # "$" sorts before "/"
        assert await readings("sensor=%24evil") == evil
        assert await readings("sensor=%24%24foo") == foo
        assert await readings("sensor=%24evil,%24%24foo&measurement=env") == foo + evil
        sensors = await follow(http, f"{base}/api/sensors?{window}&limit=1", "sensors", 6)
        assert [(s["label"], s["readings"]) for s in sensors] == [
            ("$$foo", 5),
            ("$evil", 5),
            ("h1{path=$HOME}", 5),
            ("h1{path=/}", 5),
        ]
        async with http.get(
            f"{base}/api/series?sensor=%24evil,%24%24foo,h1"
            f"&measurement=env,disk_free&step=1h&{window}"
        ) as resp:
            assert resp.status == 200
            series = (await resp.json())["series"]
        assert [(s["label"], sum(p["count"] for p in s["points"])) for s in series] == [
            ("$evil", 5),
            ("$$foo", 5),
            ("h1{path=$HOME}", 5),
            ("h1{path=/}", 5),
        ]
    assert proc.stop() == 0


# -- any stored strings, through the real writers and the app over HTTP ------------------

START = datetime(2026, 5, 1, 8, tzinfo=UTC)
END = START + timedelta(hours=1)
WINDOW = f"since={quote(iso(START))}&until={quote(iso(END))}"
# What an expression would read as something else: field paths, variables (NOW, REMOVE,
# ROOT), operator names, dotted paths, an operator object as text.
LOOKALIKES = [
    "$evil",
    "$$foo",
    "$HOME",
    "$",
    "$$",
    "$$ROOT",
    "$$CURRENT",
    "$$NOW",
    "$$REMOVE",
    "$literal",
    "$gt",
    "$expr",
    "$a.b",
    "a.b",
    ".",
    "$meta.sensor_id",
    '{"$gt": ""}',
    "a,b",
    "+ %2C",
    "Кухня",
    "客厅",
    "h1",
]
plain_text = st.characters(exclude_categories=("Cs", "Cc"))  # no control characters
sensor_ids = st.sampled_from(LOOKALIKES) | st.text(plain_text, min_size=1, max_size=10)
tag_values = st.sampled_from(LOOKALIKES) | st.text(plain_text, max_size=10)
tag_sets = st.dictionaries(st.sampled_from(["path", "a", "Z", "k-1"]), tag_values, max_size=2)


@st.composite
def stores(draw: st.DrawFn) -> tuple[list[Reading], int]:
    """1 to 4 series of 1 to 3 readings each in one hour, and a page size."""
    keys = draw(
        st.lists(
            st.tuples(sensor_ids, tag_sets),
            min_size=1,
            max_size=4,
            unique_by=lambda k: (k[0], tuple(sorted(k[1].items()))),
        )
    )
    readings = []
    for n, (sensor, tags) in enumerate(keys):
        offsets = draw(st.lists(st.integers(0, 3_599_999), min_size=1, max_size=3, unique=True))
        for i, ms in enumerate(sorted(offsets)):
            ts = START + timedelta(milliseconds=ms)
            readings.append(Reading(sensor, ts, ts.timestamp(), {"v": 10 * n + i}, i, tags=tags))
    return readings, draw(st.integers(1, 3))


def named(*series: tuple[str, dict[str, str]]) -> tuple[list[Reading], int]:
    """An example of the property: the given series, two readings each, pages of 1."""
    readings = []
    for n, (sensor, tags) in enumerate(series):
        for i in range(2):
            ts = START + timedelta(minutes=10 * i + n)
            readings.append(Reading(sensor, ts, ts.timestamp(), {"v": 10 * n + i}, i, tags=tags))
    return readings, 1


def key_of(reading: Reading) -> SeriesKey:
    return SeriesKey(reading.sensor_id, tuple(sorted((reading.tags or {}).items())))


@contextlib.asynccontextmanager
async def serving(mongo: Any, db_name: str, mode: str, collection: str) -> AsyncIterator[str]:
    """The read API's app over one collection, on a free port."""
    api = ReadApi(
        ApiSettings(mode=mode, db=db_name, collection=collection),  # type: ignore[arg-type]
        mongo,
        clock=lambda: END,
    )
    runner = web.AppRunner(api.app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def store(db: Any, n: int, readings: list[Reading]) -> dict[str, str]:
    """The readings through both real writers into collections of their own, by mode."""
    names = {"bucket": f"b{n}", "timeseries": f"r{n}"}

    def schema(name: str) -> Schema:
        return Schema(
            db,
            name,
            rejects_collection="rejects",
            rejects_max_bytes=1 << 20,
            retention_days=None,
            span_seconds=3600,
        )

    writers = (
        BucketWriter(db[names["bucket"]], schema(names["bucket"]), 3600, max_readings=2),
        TimeseriesWriter(db[names["timeseries"]], schema(names["timeseries"])),
    )
    for writer in writers:
        await writer.ensure_schema()
        outcome = await writer.write(writer.plan(readings))
        assert outcome.written == len(readings)
    return names


async def read_back(
    http: aiohttp.ClientSession, base: str, readings: list[Reading], limit: int
) -> dict[str, Any]:
    """Every route over the stored readings, checked against them; the answers by route."""
    keys = sorted({key_of(r) for r in readings}, key=series_order)
    ids = list(dict.fromkeys(k.sensor_id for k in keys))
    expected = [
        (r.sensor_id, dict(key_of(r).tags), iso(r.ts), {"v": r.values["v"]})
        for r in sorted(readings, key=lambda r: (series_order(key_of(r)), r.ts))
    ]
    pages = len(readings) + 2
    sensors = await follow(http, f"{base}/api/sensors?{WINDOW}&limit={limit}", "sensors", pages)
    assert [(s["sensor_id"], s["tags"], s["readings"]) for s in sensors] == [
        (k.sensor_id, k.tag_dict, sum(key_of(r) == k for r in readings)) for k in keys
    ]
    got = await follow(
        http, f"{base}/api/readings?sensor={param(ids)}&{WINDOW}&limit={limit}", "readings", pages
    )
    assert [(r["sensor_id"], r["tags"], r["ts"], r["values"]) for r in got] == expected
    # one series by its tags, with a measurement (time-series mode then asks for seqs)
    first = keys[0]
    tags = "".join(f"&tag={quote(k, safe='')}:{quote(v, safe='')}" for k, v in first.tags)
    chosen = [
        e
        for e in expected
        if e[0] == first.sensor_id and all(e[1].get(k) == v for k, v in first.tags)
    ]
    one = await follow(
        http,
        f"{base}/api/readings?sensor={param([first.sensor_id])}{tags}"
        f"&measurement=v&{WINDOW}&limit={limit}",
        "readings",
        pages,
    )
    assert [(r["sensor_id"], r["tags"], r["ts"], r["values"], r["seq"]) for r in one] == [
        (*e, r.seq)
        for e, r in zip(
            chosen,
            sorted(
                (
                    r
                    for r in readings
                    if r.sensor_id == first.sensor_id
                    and all((r.tags or {}).get(k) == v for k, v in first.tags)
                ),
                key=lambda r: (series_order(key_of(r)), r.ts),
            ),
            strict=True,
        )
    ]
    series = {}
    for step in ("1h", "7m"):  # bucket mode: statistics, then raw readings
        async with http.get(
            URL(
                f"{base}/api/series?sensor={param(ids)}&measurement=v&step={step}&{WINDOW}",
                encoded=True,
            )
        ) as resp:
            body = await resp.json()
            assert resp.status == 200, body
        counts = {
            (s["sensor_id"], tuple(sorted(s["tags"].items()))): sum(p["count"] for p in s["points"])
            for s in body["series"]
        }
        assert counts == {k: sum(key_of(r) == k for r in readings) for k in keys}
        series[step] = body["series"]
    return {"sensors": sensors, "readings": got, "one": one, "series": series}


async def test_any_stored_strings_read_back_once_through_every_route(
    mongo: Any, db: Any, db_name: str
) -> None:
    loop = asyncio.get_running_loop()
    numbers = itertools.count()
    async with aiohttp.ClientSession() as http:

        async def check_one(readings: list[Reading], limit: int) -> None:
            names = await store(db, next(numbers), readings)
            answers = {}
            for mode, collection in names.items():
                async with serving(mongo, db_name, mode, collection) as base:
                    answers[mode] = await read_back(http, base, readings, limit)
            assert answers["bucket"] == answers["timeseries"]
            for collection in names.values():
                await db.drop_collection(collection)

        # Each example is a round trip to the store: a count of its own, not the profile's.
        @settings(max_examples=25, database=None)
        @given(stored=stores())
        @example(stored=named(("h1", {"path": "$HOME"}), ("h1", {"path": "/"})))
        @example(stored=named(("$evil", {}), ("$$foo", {}), ("$$REMOVE", {"a": "$$REMOVE"})))
        def check(stored: tuple[list[Reading], int]) -> None:
            asyncio.run_coroutine_threadsafe(check_one(*stored), loop).result(300)

        await asyncio.to_thread(check)

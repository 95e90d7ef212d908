"""The page at ``/`` in a real headless Chromium, over readings published a moment before.

Real broker, real daemon, real ``ingest api`` process; Chromium (Debian's package,
installed by ``.ci/run``) loads the page through the DevTools protocol.
"""

from __future__ import annotations

import contextlib
import math
import re
import secrets
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson
import pytest

from ingest.model import Reading
from ingest.store.schema import Schema
from ingest.store.writers.bucket import BucketWriter
from ingest.store.writers.timeseries import TimeseriesWriter
from tests.support.browser import Chromium, chromium_binary
from tests.support.png import Image, read_png
from tests.support.procs import eventually

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path

    from tests.support.procs import Daemon

pytestmark = pytest.mark.skipif(
    chromium_binary() is None, reason="needs chromium (apt-get install chromium; .ci/run does)"
)

# Per chart, the pixels of its line's colour in its canvas: uPlot drew a curve.
CURVE_PIXELS = """
[...document.querySelectorAll('.card .chart')].map((chart) => {
  const c = chart.querySelector('canvas');
  const color = chart.uplot.series[1].stroke();
  const want = [1, 3, 5].map((i) => parseInt(color.slice(i, i + 2), 16));
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 4) {
    if ([0, 1, 2].every((k) => Math.abs(d[i + k] - want[k]) < 30)) n++;
  }
  return n;
})
"""


async def log_in(browser: Chromium, token: str) -> tuple[list[str], list[dict[str, Any]]]:
    """Type the token into the page's login form, submit, wait for the data; the URLs the
    page loaded and the cookies it holds."""
    await eventually(lambda: browser.evaluate("document.body.dataset.login === '1'"))
    assert await browser.evaluate("document.querySelectorAll('.card').length") == 0
    assert await browser.evaluate("document.getElementById('content').hidden")
    await browser.evaluate("document.getElementById('token').focus()")
    await browser.send("Input.insertText", text=token)
    await browser.evaluate("document.querySelector('#login button').click()")
    await eventually(lambda: browser.evaluate("document.body.dataset.ready === '1'"))
    assert await browser.evaluate("document.getElementById('token').value") == ""
    urls = await browser.evaluate(
        "[location.href, ...performance.getEntriesByType('resource').map((e) => e.name)]"
    )
    return urls, (await browser.send("Network.getCookies"))["cookies"]


async def test_page_shows_sensors_published_a_moment_before(
    mode: str,
    daemon: Callable[..., Daemon],
    publish: Callable[..., Any],
    topic_root: str,
    db: Any,
    api_process: Callable[..., int],
    tmp_path: Path,
) -> None:
    daemon()
    collection = db.buckets if mode == "bucket" else db.readings
    now = time.time()
    messages: list[tuple[str, bytes | str]] = []
    for n, sensor in enumerate(("kitchen", "cellar")):
        readings = [
            {
                "ts": round(now - 60 * (40 - i), 3),
                "seq": i,
                "temp": 20 + n * 3 + (i % 10) / 2,
                "hum": 40 + i % 7,
            }
            for i in range(40)
        ]
        messages.append((f"{topic_root}/{sensor}", orjson.dumps(readings)))
    messages.append((f"{topic_root}/attic", b"{not json"))
    await publish(messages)

    async def stored() -> bool:
        if mode == "bucket":
            docs = await collection.find({}, {"count": 1}).to_list()
            readings = sum(d["count"] for d in docs)
        else:
            readings = await collection.count_documents({})
        return readings == 80 and int(await db.rejects.count_documents({})) >= 1

    await eventually(stored)

    # The API takes a token (from a file): the page asks for it, POSTs it to /login and
    # reads with the session cookie it gets; the token is in no URL and no log line.
    token = secrets.token_urlsafe(32)
    (tmp_path / "tokens").write_text(f"{token}\n")
    port = api_process(
        "--mode",
        mode,
        "--api-tokens-file",
        str(tmp_path / "tokens"),
        "--grafana-url",
        "http://grafana.example:3000",
    )
    async with Chromium(tmp_path / "chromium") as browser:
        await browser.open(f"http://127.0.0.1:{port}/")
        urls, cookies = await log_in(browser, token)
        cards = await browser.evaluate(
            "[...document.querySelectorAll('.card')].map((c) => c.dataset.sensor)"
        )
        reasons = await browser.evaluate("document.querySelector('#reasons tbody').textContent")
        link = await browser.evaluate("document.getElementById('grafana').href")
        curves = await browser.evaluate(CURVE_PIXELS)
        await browser.screenshot(tmp_path / "page.png")
        errors = list(browser.errors)
        # logging out ends the session: the page asks again, the API refuses the cookie
        await browser.evaluate("document.getElementById('logout').click()")
        await eventually(lambda: browser.evaluate("!document.getElementById('login').hidden"))
        refused = await browser.evaluate("fetch('api/sensors').then((r) => r.status)")
    assert urls[0] == f"http://127.0.0.1:{port}/"
    assert any("/api/readings?" in url for url in urls)
    assert not any(token in url for url in urls)
    assert [(c["name"], c["httpOnly"], c["sameSite"]) for c in cookies] == [
        ("ingest_session", True, "Strict")
    ]
    assert token not in cookies[0]["value"]
    assert refused == 401
    log = (tmp_path / "api.log").read_text()
    assert "page login with token line-1" in log
    assert token not in log
    assert cards == ["cellar", "kitchen"]
    assert "invalid_json" in reasons
    assert link == "http://grafana.example:3000/d/iot-sensors/sensors"
    assert len(curves) == 4  # hum and temp of each sensor
    assert all(pixels > 50 for pixels in curves), curves
    assert errors == []
    assert (tmp_path / "page.png").stat().st_size > 10_000


# -- a sensor of one reading, of two, and of many ----------------------------------------

SOLO = {"battery": 3.1, "co2": 612, "hum": 41, "pressure": 1013.2, "temp": 21.5}


def few_and_many(now: float) -> list[Reading]:
    """``solo``: one reading of five measurements; ``pair``: two readings; ``many``: 45."""

    def at(sensor: str, minutes_ago: float, values: dict[str, Any], seq: int) -> Reading:
        epoch = round(now - 60 * minutes_ago, 3)
        return Reading(sensor, datetime.fromtimestamp(epoch, UTC), epoch, values, seq)

    readings = [
        at("solo", 12, SOLO, 0),
        at("pair", 31, {"temp": 19.0, "hum": 55}, 0),
        at("pair", 6, {"temp": 20.5, "hum": 52}, 1),
    ]
    readings += [
        at(
            "many",
            50 - i,
            {"temp": 18 + math.sin(i / 5) * 3, "hum": 40 + i % 9, "on": i % 7 == 0},
            i,
        )
        for i in range(45)
    ]
    return readings


async def store(db: Any, mode: str, readings: list[Reading]) -> None:
    """Through the mode's real writer, and one rejection of each mode in ``rejects``."""
    name = "buckets" if mode == "bucket" else "readings"
    schema = Schema(
        db,
        name,
        rejects_collection="rejects",
        rejects_max_bytes=1 << 20,
        retention_days=None,
        span_seconds=3600,
    )
    writer: BucketWriter | TimeseriesWriter = (
        BucketWriter(db[name], schema, 3600, max_readings=1000)
        if mode == "bucket"
        else TimeseriesWriter(db[name], schema)
    )
    await writer.ensure_schema()
    outcome = await writer.write(writer.plan(readings))
    assert outcome.written == len(readings)
    at = datetime.now(UTC) - timedelta(minutes=3)
    await db.rejects.insert_many(
        [
            {
                "at": at - timedelta(seconds=n),
                "mode": m,
                "topic": f"sensors/{m}",
                "reason": "bad_json",
                "detail": "not JSON",
                "payload": "{",
                "payload_bytes": 1,
            }
            for n, m in enumerate(("bucket", "timeseries"))
        ]
    )


# Per card: its text, and per chart what uPlot drew: the data, the scales' ranges, the
# time axis' tick labels, and where each value is on the page (CSS pixels of the document).
CHARTS = """
[...document.querySelectorAll('.card')].map((card) => {
  const box = card.getBoundingClientRect();
  return {
    sensor: card.dataset.sensor, meta: card.querySelector('.meta').textContent,
    clip: {x: box.left + scrollX, y: box.top + scrollY, width: box.width, height: box.height},
    charts: [...card.querySelectorAll('.chart')].map((chart) => {
      const u = chart.uplot;
      const plot = chart.querySelector('.u-over').getBoundingClientRect();  // valToPos's origin
      const [xs, ys] = u.data;
      const at = (x, y) => [plot.left + scrollX + u.valToPos(x, 'x'),
                            plot.top + scrollY + u.valToPos(y, 'y')];
      return {
        measurement: chart.dataset.measurement, color: u.series[1].stroke(),
        caption: chart.previousElementSibling.textContent, xs, ys,
        x: [u.scales.x.min, u.scales.x.max], y: [u.scales.y.min, u.scales.y.max],
        ticks: u.axes[0].show ? u.axes[0]._values : null,
        points: xs.map((x, i) => at(x, ys[i])),
      };
    }),
  };
})
"""


def rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def drawn(image: Image, x: float, y: float, color: tuple[int, int, int]) -> bool:
    """Whether a pixel of ``color`` (within anti-aliasing) is within 2 pixels of (x, y)."""
    near = [
        image[i, j]
        for i in range(round(x) - 2, round(x) + 3)
        for j in range(round(y) - 2, round(y) + 3)
        if 0 <= i < image.width and 0 <= j < image.height
    ]
    return any(sum(abs(a - b) for a, b in zip(p, color, strict=True)) < 90 for p in near)


@contextlib.asynccontextmanager
async def page_of(
    readings: list[Reading], db: Any, mode: str, api_process: Callable[..., int], tmp_path: Path
) -> AsyncIterator[Chromium]:
    """The page of an API over ``readings``, loaded in Chromium (screenshot: page.png)."""
    await store(db, mode, readings)
    port = api_process("--mode", mode)
    async with Chromium(tmp_path / "chromium") as browser:
        await browser.open(f"http://127.0.0.1:{port}/")
        await eventually(lambda: browser.evaluate("document.body.dataset.ready === '1'"))
        await browser.screenshot(tmp_path / "page.png")
        yield browser


async def test_page_draws_every_value_of_a_sensor_of_one_two_or_many_readings(
    mode: str, db: Any, api_process: Callable[..., int], tmp_path: Path
) -> None:
    readings = few_and_many(time.time())
    async with page_of(readings, db, mode, api_process, tmp_path) as browser:
        metas = await browser.evaluate(
            "Object.fromEntries([...document.querySelectorAll('.card')].map((c) => "
            "[c.dataset.sensor, c.querySelector('.meta').textContent]))"
        )
        about = await browser.evaluate("document.querySelector('main section').textContent")
        more = await browser.evaluate(
            "Object.fromEntries([...document.querySelectorAll('.card')].map((c) => "
            "[c.dataset.sensor, c.querySelector('.more') && c.querySelector('.more').textContent]))"
        )
        rejects = await browser.evaluate(
            "[...document.querySelectorAll('#rejects tr')].map((r) => r.cells[1].textContent)"
        )
        # what a newcomer reads: a count in words, the four-chart limit, both modes' rejects
        assert sorted(metas) == ["many", "pair", "solo"]
        assert metas["solo"].startswith("1 reading, last ")
        assert metas["solo"].endswith("; temp, hum, pressure, co2, battery")
        assert more == {"solo": "1 more: click the card to show all", "pair": None, "many": None}
        assert metas["pair"].startswith("2 readings, last ")
        assert "charts up to four measurements" in " ".join(about.split())
        assert rejects == ["Mode", "bucket", "timeseries"]
        cards = {c["sensor"]: c for c in await browser.evaluate(CHARTS)}
        for sensor, card in cards.items():
            await browser.screenshot(tmp_path / f"{sensor}.png", card["clip"])
        errors = list(browser.errors)
    assert errors == []
    assert cards["solo"]["charts"][0]["caption"] == "temp: latest 21.5"
    # the measurements a person looks for first, battery last
    charted = {
        "solo": ["temp", "hum", "pressure", "co2"],
        "pair": ["temp", "hum"],
        "many": ["temp", "hum", "on"],
    }
    for sensor, card in cards.items():
        image = read_png(tmp_path / f"{sensor}.png")
        mine = sorted((r for r in readings if r.sensor_id == sensor), key=lambda r: r.epoch)
        assert [c["measurement"] for c in card["charts"]] == charted[sensor], sensor
        for chart in card["charts"]:
            what = f"{sensor}.{chart['measurement']}: {tmp_path / sensor}.png"
            values = [float(r.values[chart["measurement"]]) for r in mine]
            # one point per reading, the value as stored (booleans as 0 and 1)
            assert len(chart["xs"]) == len(values), what
            assert [round(y, 9) for y in chart["ys"]] == [round(v, 9) for v in values], what
            # the time axis follows the data: from the series' first reading to now
            low, high = chart["x"]
            first = min(r.epoch for r in mine)
            assert low < first <= max(chart["xs"]) < high, what
            assert first - low <= max(60, (high - first) * 0.05), what
            assert abs(high - time.time()) < 300, what
            # (a tick too near the right edge for its label has none: null)
            assert chart["ticks"] is None or not any(
                re.fullmatch(r"\d{4}", t) for t in chart["ticks"] if t is not None
            ), (what, chart["ticks"])
            # every value inside the value scale, and drawn where it should be
            assert chart["y"][0] < min(values) <= max(values) < chart["y"][1], what
            color = rgb(chart["color"])
            for (x, y), value in zip(chart["points"], values, strict=True):
                assert drawn(image, x - card["clip"]["x"], y - card["clip"]["y"], color), (
                    what,
                    value,
                )
    assert sum(1 for c in cards.values() for chart in c["charts"] if chart["ticks"]) == 3


async def test_each_series_is_a_card_titled_with_its_tags(
    mode: str, db: Any, api_process: Callable[..., int], tmp_path: Path
) -> None:
    now = time.time()
    readings = []
    for i in range(5):
        epoch = round(now - 60 * (30 - 5 * i), 3)
        ts = datetime.fromtimestamp(epoch, UTC)
        for path, free in (("/", 200.0 + i), ("/boot", 300.0 + i)):
            readings.append(Reading("h1", ts, epoch, {"disk_free": free}, i, tags={"path": path}))
        readings.append(Reading("h1", ts, epoch, {"mem_free": 1000.0 + i}, i, tags={}))
    async with page_of(readings, db, mode, api_process, tmp_path) as browser:
        cards = await browser.evaluate(
            "[...document.querySelectorAll('.card')].map((c) => ({"
            "title: c.querySelector('h3').textContent, meta: c.querySelector('.meta').textContent,"
            "charts: [...c.querySelectorAll('.chart')].map((b) => ({"
            "measurement: b.dataset.measurement, ys: b.uplot.data[1]}))}))"
        )
        errors = list(browser.errors)
    assert errors == []
    assert [c["title"] for c in cards] == ["h1", "h1 {path=/}", "h1 {path=/boot}"]
    assert all(c["meta"].startswith("5 readings, last ") for c in cards)
    # each card charts its own series only
    assert [c["charts"] for c in cards] == [
        [{"measurement": "mem_free", "ys": [1000.0 + i for i in range(5)]}],
        [{"measurement": "disk_free", "ys": [200.0 + i for i in range(5)]}],
        [{"measurement": "disk_free", "ys": [300.0 + i for i in range(5)]}],
    ]

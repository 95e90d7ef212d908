"""The page as a first look: readable axes, the measurements a person looks for, every
sensor reachable, in a real headless Chromium.

Readings go through the real broker and the real daemon (the default format and the
Zigbee2MQTT preset); a real ``ingest api`` process serves them. Every text the page's
canvases draw is captured (a wrapper around ``fillText``, installed before the page's own
scripts) with its measured extent, so the tests check labels as drawn: whole, inside their
canvas, left of the plot, and with the precision the values need. Screenshots are kept in
the test's ``tmp_path``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson
import pytest

from ingest.model import Reading, Scalar
from tests.api.test_page import store
from tests.support.browser import Chromium, chromium_binary
from tests.support.procs import eventually

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.support.procs import Daemon

pytestmark = pytest.mark.skipif(
    chromium_binary() is None, reason="needs chromium (apt-get install chromium; .ci/run does)"
)

# Every fillText of every canvas: the text, and its extent in canvas pixels as drawn
# (measured with the context's own font, alignment and transform).
CAPTURE = """
(() => {
  const fill = CanvasRenderingContext2D.prototype.fillText;
  CanvasRenderingContext2D.prototype.fillText = function (text, x, y, ...rest) {
    const m = this.measureText(String(text));
    const t = this.getTransform();
    const a = t.transformPoint(new DOMPoint(x - m.actualBoundingBoxLeft, y));
    const b = t.transformPoint(new DOMPoint(x + m.actualBoundingBoxRight, y));
    (this.canvas.drawnTexts ||= []).push(
      {text: String(text), left: Math.min(a.x, b.x), right: Math.max(a.x, b.x), y: a.y});
    return fill.call(this, text, x, y, ...rest);
  };
  const clear = CanvasRenderingContext2D.prototype.clearRect;
  CanvasRenderingContext2D.prototype.clearRect = function (x, y, w, h) {
    if (x <= 0 && y <= 0 && w >= this.canvas.width && h >= this.canvas.height) {
      this.canvas.drawnTexts = [];  // a redraw: what was drawn before is gone
    }
    return clear.call(this, x, y, w, h);
  };
})();
"""

# Per card: what it charts, and per chart its kind, caption, data, scales, the y axis'
# splits and the texts drawn on its canvas, with the plot's box (canvas pixels).
CARDS = """
[...document.querySelectorAll(ROOT + ' .chart')].map((box) => {
  const u = box.uplot;
  const canvas = box.querySelector('canvas');
  const card = box.closest('.card');
  return {
    sensor: card ? card.dataset.sensor : null,
    measurement: box.dataset.measurement, kind: box.dataset.kind,
    caption: box.previousElementSibling.textContent,
    xs: u.data[0], ys: u.data[1],
    x: [u.scales.x.min, u.scales.x.max], y: [u.scales.y.min, u.scales.y.max],
    splits: u.axes[1]._splits, values: u.axes[1]._values,
    width: canvas.width, plotLeft: u.bbox.left, plotTop: u.bbox.top,
    plotBottom: u.bbox.top + u.bbox.height,
    texts: canvas.drawnTexts || [],
  };
})
"""


def card_js(sensor: str) -> str:
    """The card of a sensor, as a JavaScript expression."""
    return (
        "[...document.querySelectorAll('.card')]"
        f".find((c) => c.dataset.sensor === {orjson.dumps(sensor).decode()})"
    )


def charts_js(root: str) -> str:
    return CARDS.replace("ROOT", repr(root))


def y_labels(chart: dict[str, Any]) -> list[str]:
    """The texts drawn left of the plot, top to bottom: the y axis' labels."""
    left = [t for t in chart["texts"] if t["right"] <= chart["plotLeft"] + 1]
    return [t["text"] for t in sorted(left, key=lambda t: t["y"])]


def assert_whole(chart: dict[str, Any]) -> None:
    """Every drawn text inside its canvas; the y labels left of the plot, never on it."""
    what = f"{chart['sensor']}.{chart['measurement']}"
    assert chart["texts"], what
    for t in chart["texts"]:
        assert t["left"] >= 0, (what, t)
        assert t["right"] <= chart["width"], (what, t)
        if chart["plotTop"] <= t["y"] <= chart["plotBottom"]:  # beside the plot: a y label
            assert t["right"] <= chart["plotLeft"], (what, t, chart["plotLeft"])
    assert len(y_labels(chart)) == len(chart["values"]), (what, chart["texts"])


def number(text: str) -> float:
    return float(text.replace(",", ""))


async def publish_fleet(publish: Callable[..., Any], root: str, now: float) -> dict[str, int]:
    """60 series: a Zigbee2MQTT sensor, switch and door (a boolean), a one-reading sensor,
    a meter of values over 1,000 and under 1, and 55 plain ones. Returns readings a series."""

    def at(minutes_ago: float) -> float:
        return round(now - 60 * minutes_ago, 3)

    def z2m_time(minutes_ago: float) -> str:
        return datetime.fromtimestamp(at(minutes_ago), UTC).isoformat()

    living = [
        {
            "battery": 97 - i,
            "humidity": 45.2 + i / 10,
            "linkquality": 134 - i,
            "occupancy": i % 2 == 0,
            "temperature": 21.7 + i / 20,
            "last_seen": z2m_time(9 - i),
        }
        for i in range(6)
    ]
    switch = [
        {"action": action, "linkquality": 90, "last_seen": z2m_time(8 - i)}
        for i, action in enumerate(["single", "double", "single", "hold", "single"])
    ]
    door = [{"contact": i % 2 == 1, "last_seen": z2m_time(20 - 4 * i)} for i in range(5)]
    door.append({"contact": False, "last_seen": z2m_time(1)})
    messages: list[tuple[str, bytes | str]] = [
        (f"zigbee2mqtt/Living Room {root}", orjson.dumps(r)) for r in living
    ]
    messages += [(f"zigbee2mqtt/Hall switch {root}", orjson.dumps(r)) for r in switch]
    messages += [(f"zigbee2mqtt/Front door {root}", orjson.dumps(r)) for r in door]
    meter = [
        {"ts": at(15 - i), "aenergy_total": 1234.55 + i * 0.013, "pf": 0.0042 + i * 0.0003}
        for i in range(10)
    ]
    messages += [
        (f"{root}/solo", orjson.dumps({"ts": at(3), "temp": 21.5})),
        (f"{root}/meter", orjson.dumps(meter)),
    ]
    plain = {f"s{n:02d}": 2 for n in range(1, 56)}
    messages += [
        (
            f"{root}/{s}",
            orjson.dumps(
                [{"ts": at(5), "temp": 20 + n / 10}, {"ts": at(4), "temp": 20.5 + n / 10}]
            ),
        )
        for n, s in enumerate(plain)
    ]
    await publish(messages)
    return {
        f"Living Room {root}": 6,
        f"Hall switch {root}": 5,
        f"Front door {root}": 6,
        "solo": 1,
        "meter": 10,
        **plain,
    }


async def stored_all(db: Any, mode: str, expected: int) -> None:
    collection = db.buckets if mode == "bucket" else db.readings

    async def done() -> bool:
        if mode == "bucket":
            docs = await collection.find({}, {"count": 1}).to_list()
            total: int = sum(d["count"] for d in docs)
            return total == expected
        count: int = await collection.count_documents({})
        return count == expected

    await eventually(done, timeout=60)


async def wait_ready(browser: Chromium) -> None:
    await eventually(lambda: browser.evaluate("document.body.dataset.ready === '1'"), timeout=60)


CARD_IDS = "[...document.querySelectorAll('.card')].map((c) => c.dataset.sensor)"
TEXT_OF = "document.getElementById({!r}).textContent"


async def overview(browser: Chromium, living: str, tmp_path: Path) -> dict[str, Any]:
    """What the overview shows: its three pages, a card opened, a search, the rejects."""
    seen: dict[str, Any] = {"pages": [await browser.evaluate(CARD_IDS)]}
    await browser.screenshot(tmp_path / "page-1.png")
    seen["charts"] = await browser.evaluate(charts_js("#sensors"))
    seen["note"] = await browser.evaluate(TEXT_OF.format("sensors-note"))
    seen["grafana_hidden"] = await browser.evaluate("document.getElementById('grafana').hidden")
    seen["rejects"] = await browser.evaluate(
        "[document.getElementById('no-rejects').hidden, "
        "document.getElementById('no-rejects').textContent, "
        "document.getElementById('reasons').hidden, "
        "document.getElementById('rejects').hidden]"
    )
    # a click on a card of more than four measurements shows all of them
    await browser.evaluate(f"{card_js(living)}.querySelector('.meta').click()")
    await eventually(
        lambda: browser.evaluate(f"{card_js(living)}.querySelectorAll('.chart').length === 5")
    )
    seen["opened"] = await browser.evaluate(
        f"[...{card_js(living)}.querySelectorAll('.chart')].map((b) => b.dataset.measurement)"
    )
    # the pages beyond the first 24
    for n in (2, 3):
        await browser.evaluate("document.getElementById('next').click()")
        await wait_ready(browser)
        await browser.screenshot(tmp_path / f"page-{n}.png")
        seen["pages"].append(await browser.evaluate(CARD_IDS))
        seen["charts"] += await browser.evaluate(charts_js("#sensors"))
    seen["last_note"] = await browser.evaluate(TEXT_OF.format("sensors-note"))
    seen["next_disabled"] = await browser.evaluate("document.getElementById('next').disabled")
    # search, as typed
    await browser.evaluate(
        "(() => { const s = document.getElementById('search'); s.value = 'SOL';"
        " s.dispatchEvent(new Event('input')); })()"
    )
    await eventually(
        lambda: browser.evaluate(
            "document.body.dataset.ready === '1' && document.querySelectorAll('.card').length === 1"
        )
    )
    seen["found"] = await browser.evaluate(CARD_IDS)
    return seen


async def sensor_view(browser: Chromium, tmp_path: Path) -> dict[str, Any]:
    """A card's link to its sensor's view; then the meter's view over the last day."""
    await browser.evaluate(f"{card_js('solo')}.querySelector('h3 a').click()")
    await eventually(
        lambda: browser.evaluate("document.getElementById('sensor-view').dataset.ready === '1'")
    )
    seen: dict[str, Any] = {"hash": await browser.evaluate("location.hash")}
    await browser.evaluate("location.hash = '#window=day&sensor=meter'")
    await eventually(
        lambda: browser.evaluate(
            "document.getElementById('sensor-view').dataset.ready === '1' && "
            "document.getElementById('view-title').textContent === 'meter'"
        )
    )
    await browser.screenshot(tmp_path / "meter.png")
    seen |= await browser.evaluate(
        "({stats: [...document.querySelectorAll('#view-stats tbody tr')]"
        ".map((r) => [...r.cells].map((c) => c.textContent)),"
        " source: document.getElementById('view-stats-source').textContent,"
        " readings: [...document.querySelectorAll('#view-readings tr')]"
        ".map((r) => [...r.cells].map((c) => c.textContent)),"
        " window: document.getElementById('window').value,"
        " meta: document.getElementById('view-meta').textContent})"
    )
    seen["charts"] = await browser.evaluate(charts_js("#view-charts"))
    seen["urls"] = await browser.evaluate(
        "[location.href, ...performance.getEntriesByType('resource').map((e) => e.name)]"
    )
    return seen


async def test_a_first_look_without_grafana(
    mode: str,
    daemon: Callable[..., Daemon],
    publish: Callable[..., Any],
    topic_root: str,
    db: Any,
    api_process: Callable[..., int],
    tmp_path: Path,
) -> None:
    rules = tmp_path / "plain.toml"
    rules.write_text(f'[[rule]]\nname = "plain"\ntopic = "{topic_root}/#"\nformat = "ingest"\n')
    daemon("--mapping", str(rules), "--preset", "zigbee2mqtt", rule_topics=True)
    counts = await publish_fleet(publish, topic_root, time.time())
    await stored_all(db, mode, sum(counts.values()))
    # no --grafana-url (as ingest local runs it): no link; the preset orders the charts
    port = api_process("--mode", mode, "--preset", "zigbee2mqtt")
    living = f"Living Room {topic_root}"
    async with Chromium(tmp_path / "chromium") as browser:
        await browser.before_load(CAPTURE)
        await browser.open(f"http://127.0.0.1:{port}/")
        await wait_ready(browser)
        seen = await overview(browser, living, tmp_path)
        view = await sensor_view(browser, tmp_path)
        errors = list(browser.errors)
    assert errors == []
    # 60 series over three pages of 24, in series order; the 60th on the third
    assert [len(p) for p in seen["pages"]] == [24, 24, 12]
    everything = [s for p in seen["pages"] for s in p]
    assert everything == sorted(counts)
    assert everything[59] == "solo"
    assert seen["note"] == "Series 1\u201324, more follow."
    assert seen["last_note"] == "Series 49\u201360."
    assert seen["next_disabled"]
    assert seen["found"] == ["solo"]
    assert seen["grafana_hidden"]
    assert seen["rejects"] == [False, "No rejections.", True, True]
    assert seen["opened"] == ["temperature", "humidity", "occupancy", "battery", "linkquality"]
    check_charts(seen["charts"], topic_root)
    check_view(view, mode)


def check_charts(charts: list[dict[str, Any]], root: str) -> None:
    """What the cards chart, and how: the measurements chosen, labels whole and exact."""
    by = {(c["sensor"], c["measurement"]): c for c in charts}
    measurements: dict[str, list[str]] = {}
    for sensor, name in by:
        measurements.setdefault(sensor, []).append(name)
    # what a person looks for first: temperature, not battery or link quality
    assert measurements[f"Living Room {root}"] == [
        "temperature",
        "humidity",
        "occupancy",
        "battery",
    ]
    assert measurements[f"Hall switch {root}"] == ["action", "linkquality"]
    assert measurements["meter"] == ["aenergy_total", "pf"]
    # every label whole as drawn, on every chart of every page; a card's charts share
    # one time axis (their plots start at the same x)
    for chart in charts:
        assert_whole(chart)
    for sensor in measurements:
        assert len({c["plotLeft"] for c in charts if c["sensor"] == sensor}) == 1, sensor
    # numbers with the precision they need: over 1,000 and under 1
    for name, low, high in (("aenergy_total", 1234.55, 1234.67), ("pf", 0.0042, 0.0069)):
        chart = by[("meter", name)]
        labels = y_labels(chart)
        values = [number(t) for t in labels]
        assert len(set(labels)) == len(labels), labels
        assert len(labels) >= 2, labels
        for text, split in zip(reversed(values), chart["splits"], strict=True):
            assert abs(text - split) <= 1e-9 + abs(split) * 1e-9, (labels, chart["splits"])
        assert chart["y"][0] < low
        assert high < chart["y"][1]
    assert y_labels(by[("meter", "aenergy_total")])[0].startswith("1,234.")
    assert by[("meter", "aenergy_total")]["caption"] == "aenergy_total: latest 1,234.67"
    assert by[("meter", "pf")]["caption"] == "pf: latest 0.0069"
    # a boolean: on/off steps
    door = by[(f"Front door {root}", "contact")]
    assert door["kind"] == "boolean"
    assert y_labels(door) == ["on", "off"]
    assert door["caption"] == "contact: latest off"
    assert door["ys"] == [0, 1, 0, 1, 0, 0]
    # a string: a timeline of its last values, the latest on top
    action = by[(f"Hall switch {root}", "action")]
    assert action["kind"] == "string"
    assert y_labels(action) == ["single", "hold", "double"]
    assert action["caption"] == "action: latest single"
    # one reading: one point, on a time axis from it to now, not the whole hour
    solo = by[("solo", "temp")]
    assert solo["ys"] == [21.5]
    assert solo["x"][0] < solo["xs"][0] < solo["x"][1]
    assert solo["x"][1] - solo["x"][0] < 10 * 60


def check_view(view: dict[str, Any], mode: str) -> None:
    """A sensor's own view: every measurement, per-hour statistics, the latest readings."""
    assert view["hash"] == "#sensor=solo"
    assert not any("token" in url for url in view["urls"])
    charts = view["charts"]
    assert [c["measurement"] for c in charts] == ["aenergy_total", "pf"]
    for chart in charts:
        assert_whole(chart)
    assert len({c["plotLeft"] for c in charts}) == 1
    assert view["window"] == "day"
    assert view["meta"].startswith("10 readings in the last day, first ")
    assert sorted({row[1] for row in view["stats"]}) == ["aenergy_total", "pf"]
    assert sum(int(r[2]) for r in view["stats"] if r[1] == "pf") == 10
    if mode == "bucket":
        assert view["source"] == "From the bucket documents' running statistics."
    assert view["readings"][0] == ["Time", "aenergy_total", "pf"]
    assert len(view["readings"]) == 11
    assert view["readings"][1][1:] == ["1,234.667", "0.0069"]  # as stored


async def test_a_busy_series_is_charted_from_averages_per_step(
    mode: str, db: Any, api_process: Callable[..., int], tmp_path: Path
) -> None:
    """Over 500 readings in the window: numbers and booleans as the series endpoint's
    averages per step, strings as a timeline of their latest readings."""
    now = time.time()
    readings = []
    for i in range(600):  # one every 5 s over the last 50 minutes
        epoch = round(now - 3000 + 5 * i, 3)
        values: dict[str, Scalar] = {
            "power": 1500 + (i % 40) * 2.5,
            "on": i % 100 < 50,
            "mode": f"m{i // 150}",
        }
        when = datetime.fromtimestamp(epoch, UTC)
        readings.append(Reading("busy", when, epoch, values, i, tags={}))  # as a rule reads
    await store(db, mode, readings)
    port = api_process("--mode", mode)
    async with Chromium(tmp_path / "chromium") as browser:
        await browser.before_load(CAPTURE)
        await browser.open(f"http://127.0.0.1:{port}/")
        await wait_ready(browser)
        await browser.screenshot(tmp_path / "busy.png")
        charts = await browser.evaluate(charts_js("#sensors"))
        urls = await browser.evaluate("performance.getEntriesByType('resource').map((e) => e.name)")
        errors = list(browser.errors)
    assert errors == []
    by = {c["measurement"]: c for c in charts}
    assert list(by) == ["power", "mode", "on"]  # power first; the rest by name
    assert any("/api/series?" in u and "step=30s" in u for u in urls), urls
    power = by["power"]
    assert power["caption"] == f"power: latest {1500 + 599 % 40 * 2.5:,.1f} (average per 30s)"
    assert 100 <= len(power["xs"]) <= 102  # 50 minutes in steps of 30 s
    assert by["on"]["kind"] == "boolean"
    assert y_labels(by["on"]) == ["on", "off"]
    assert min(by["on"]["ys"]) == 0
    assert max(by["on"]["ys"]) == 1
    assert by["mode"]["kind"] == "string"
    assert by["mode"]["caption"] == "mode: latest m3"
    assert y_labels(by["mode"])[0] == "m3"
    for chart in charts:
        assert_whole(chart)
    assert len({c["plotLeft"] for c in charts}) == 1
    labels = [number(t) for t in y_labels(power)]
    assert all(1500 <= v <= 1600 for v in labels), labels


# Charts drawn by the page's own chart() with spans whose right end is a tick of the time
# axis (on the hour, at midnight UTC) or near one: where a centred label would run past
# the canvas. Per chart: its drawn texts, the time axis' ticks and labels, the plot's box.
EDGE_CHARTS = """
(async (cases) => {
  const out = [];
  for (const [from, to] of cases) {
    const box = document.createElement('div');
    document.body.append(box);
    const spec = {name: 't', kind: 'number', xs: [from, to], ys: [1, 2], unit: '',
                  latest: 2, span: [from, to]};
    const u = chart(box, spec, 0, {width: 320, timeAxis: true});
    await new Promise((r) => setTimeout(r, 0));
    const canvas = box.querySelector('canvas');
    out.push({span: [from, to], texts: canvas.drawnTexts || [], width: canvas.width,
              plotLeft: u.bbox.left, plotTop: u.bbox.top,
              plotBottom: u.bbox.top + u.bbox.height, values: u.axes[1]._values,
              timeSplits: u.axes[0]._splits, timeValues: u.axes[0]._values,
              sensor: 'edge', measurement: `${from}-${to}`});
    u.destroy();
    box.remove();
  }
  return out;
})
"""


async def test_time_labels_at_the_right_edge_are_whole_or_absent(
    api_process: Callable[..., int], tmp_path: Path
) -> None:
    """A tick at or near the plot's right edge: its label is drawn whole or not at all,
    and every label drawn is the time of a tick (none stands for a tick left unlabelled)."""
    hour = int(time.time()) // 3600 * 3600
    midnight = hour // 86400 * 86400
    cases = [
        (end + offset - length, end + offset)
        for end in (hour, midnight)
        for offset in (-90, -30, -10, 0, 10, 30)
        for length in (600, 3600, 86400, 7 * 86400)
    ]
    port = api_process("--mode", "bucket")
    async with Chromium(tmp_path / "chromium") as browser:
        await browser.before_load(CAPTURE)
        await browser.open(f"http://127.0.0.1:{port}/")
        await wait_ready(browser)
        charts = await browser.evaluate(f"{EDGE_CHARTS}({orjson.dumps(cases).decode()})")
        errors = list(browser.errors)
    assert errors == []
    assert len(charts) == len(cases)
    dropped = 0
    for chart in charts:
        assert_whole(chart)
        drawn = [t["text"] for t in chart["texts"] if t["y"] > chart["plotBottom"]]
        labels = [v for v in chart["timeValues"] if v is not None]
        lines = [line for v in labels for line in v.split("\n")]
        assert sorted(drawn) == sorted(lines), chart
        assert labels, chart
        dropped += len(chart["timeSplits"]) - len(labels)
    assert dropped > 0  # some cases put a tick at the edge: it went unlabelled

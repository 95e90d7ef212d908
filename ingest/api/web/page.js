// The page of `ingest api`: the series (a sensor and its tags) of the last hour, day or
// week as cards of small charts, a sensor's own view, and the rejections of the last hour.
// Plain JS over the API's own endpoints; uPlot draws. The session cookie (HttpOnly, from
// POST login) authenticates every fetch: no token is ever part of a URL.
"use strict";

const PAGE_SIZE = 24;  // cards a page; the API pages on with its cursor
const MAX_CHARTS = 4;  // measurements charted on a closed card (a click opens it)
const RAW_LIMIT = 500;  // a series of this many readings or fewer is drawn reading by reading
const TABLE_READINGS = 100;  // rows of the sensor view's readings table
const MAX_CATEGORIES = 6;  // distinct values of a string timeline (older ones: "(other)")
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"];
const AXIS_FONT = "12px system-ui, sans-serif";
const WINDOWS = { hour: ["now-1h", 3600, "hour"], day: ["now-24h", 86400, "day"],
                  week: ["now-7d", 7 * 86400, "week"] };
const STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
               43200, 86400];  // seconds: a series' step is the first giving <= 200 points
const MAX_PARALLEL = 4;  // the page's own queries at once (the API bounds each caller)

class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Same-origin fetch with the session cookie; a 429 (too many queries of this caller at
// once) is retried after its Retry-After.
async function getJSON(path, tries = 4) {
  const resp = await fetch(path, { credentials: "same-origin" });
  if (resp.status === 429 && tries > 1) {
    await sleep(1000 * (Number(resp.headers.get("Retry-After")) || 1));
    return getJSON(path, tries - 1);
  }
  const body = await resp.json();
  if (!resp.ok) {
    throw new HttpError(resp.status, body.error ? body.error.message : resp.statusText);
  }
  return body;
}

// fn over items, at most MAX_PARALLEL at once, results in order.
async function mapLimited(items, fn) {
  const results = new Array(items.length);
  let next = 0;
  async function worker() {
    while (next < items.length) {
      const i = next++;
      results[i] = await fn(items[i]);
    }
  }
  await Promise.all(Array.from({ length: Math.min(MAX_PARALLEL, items.length) }, worker));
  return results;
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;  // never innerHTML: text comes from devices
  if (cls) node.className = cls;
  return node;
}

function plural(n, word) {
  return `${n.toLocaleString()} ${n === 1 ? word : `${word}s`}`;
}

function age(iso) {
  const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (seconds < 90) return `${seconds} s ago`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 129600) return `${Math.round(seconds / 3600)} h ago`;
  return `${Math.round(seconds / 86400)} d ago`;
}

// -- what the page shows: its state in the URL's fragment (no token, no data) ------------

const state = { window: "hour", search: "", sensor: null, tags: {}, cursors: [null],
                open: new Set() };

function readHash() {
  const h = new URLSearchParams(location.hash.slice(1));
  state.window = WINDOWS[h.get("window")] ? h.get("window") : "hour";
  state.search = h.get("search") || "";
  state.sensor = h.get("sensor");
  state.tags = {};
  h.getAll("tag").forEach((t) => {
    const i = t.indexOf(":");
    if (i > 0) state.tags[t.slice(0, i)] = t.slice(i + 1);
  });
}

function hashOf(changes) {
  const h = new URLSearchParams();
  const next = { window: state.window, search: state.search, ...changes };
  if (next.window !== "hour") h.set("window", next.window);
  if (next.sensor) {
    h.set("sensor", next.sensor);
    Object.entries(next.tags || {}).forEach(([k, v]) => h.append("tag", `${k}:${v}`));
  } else if (next.search) {
    h.set("search", next.search);
  }
  const text = h.toString();
  return text ? `#${text}` : "#";
}

// -- which measurements first ------------------------------------------------------------

function globRegExp(pattern) {
  const body = pattern.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*")
    .replace(/\?/g, ".");
  return new RegExp(`^${body}$`, "i");
}

let orderRules = { first: [], last: [] };

function setOrder(order) {
  orderRules = { first: order.first.map(globRegExp), last: order.last.map(globRegExp) };
}

// Housekeeping (a `last` pattern) after everything; then what a person looks for (a
// `first` pattern) before the rest; by pattern order, then by name.
function rank(name) {
  const last = orderRules.last.findIndex((re) => re.test(name));
  if (last >= 0) return [2, last];
  const first = orderRules.first.findIndex((re) => re.test(name));
  return first >= 0 ? [0, first] : [1, 0];
}

function ordered(names) {
  return [...names].sort((a, b) => {
    const [ra, rb] = [rank(a), rank(b)];
    return ra[0] - rb[0] || ra[1] - rb[1] || (a < b ? -1 : a > b ? 1 : 0);
  });
}

// -- numbers as labels: the precision the values need ------------------------------------

// Decimals of a tick increment (0.025 -> 3), so that no two ticks read alike.
function decimalsOf(incr) {
  const text = String(Number(incr.toPrecision(9)));
  const exp = text.match(/e-(\d+)$/);
  if (exp) return Number(exp[1]) + (text.split("e")[0].split(".")[1] || "").length;
  return (text.split(".")[1] || "").length;
}

function tickText(value, decimals) {
  const v = Math.abs(value) < 1e-12 ? 0 : value;  // no "-0"
  return v.toLocaleString(undefined, { minimumFractionDigits: decimals,
                                       maximumFractionDigits: decimals });
}

// A value as its caption says it: whole digits of large values, three significant ones
// of small values, never more than the value holds.
function valueText(v) {
  if (typeof v === "boolean") return v ? "on" : "off";
  if (typeof v === "string") return v;
  if (v !== 0 && Math.abs(v) < 1) {
    return v.toLocaleString(undefined, { maximumSignificantDigits: 3 });
  }
  return v.toLocaleString(undefined, { maximumFractionDigits: 2 });
}

// A stored value in full (a table of readings).
function exactText(v) {
  if (typeof v !== "number") return valueText(v);
  return v.toLocaleString(undefined, { maximumSignificantDigits: 15 });
}

const measurer = document.createElement("canvas").getContext("2d");

// The time axis: a tick so near the plot's right edge that its label, centred on it,
// would run past the canvas goes unlabelled, so that every label is drawn whole. The
// widest label of a time tick is a time of day ("12:00am"); 2 px spare for rounding.
// uPlot's own time labels are kept (they name the day where it changes); the labels of
// such ticks are dropped from them. (uPlot's axis `filter` cannot do it: its time
// formatter reads a filtered-out tick as the epoch and draws it.)
const TIME_LABELS = ["12:00am", "12:00pm", "10:00am", "10:00pm", "12:55pm"];
let timeLabelHalf;  // measured once: the font and the labels do not change
function wholeTimeLabels(u) {
  const axis = u.axes[0];
  const labels = axis.values;  // uPlot's, resolved when the chart was made
  axis.values = (self, splits, ...rest) => {
    if (timeLabelHalf === undefined) {
      measurer.font = AXIS_FONT;
      timeLabelHalf = Math.max(...TIME_LABELS.map((t) => measurer.measureText(t).width)) / 2 + 2;
    }
    const half = timeLabelHalf * devicePixelRatio;
    const edge = self.ctx.canvas.width;
    return labels(self, splits, ...rest)
      .map((text, k) => (self.valToPos(splits[k], "x", true) + half <= edge ? text : null));
  };
}

// The width an axis needs for its labels as drawn: tick, gap, the widest label, margin.
function axisSize(_u, values) {
  if (!values) return 40;
  measurer.font = AXIS_FONT;
  const widest = Math.max(0, ...values.map((v) => measurer.measureText(String(v ?? "")).width));
  return Math.ceil(widest) + 10 + 5 + 6;
}

// A value's scale: a little room above and below, and room around a single value (whose
// own range would be empty).
function valueRange(_u, min, max) {
  if (min === null || max === null) return [0, 1];
  if (min === max) {
    const room = Math.abs(min) / 10 || 1;
    return [min - room, max + room];
  }
  return uPlot.rangeNum(min, max, 0.15, false);
}

// -- one chart ---------------------------------------------------------------------------

// spec: {name, kind: number|boolean|string, xs (epoch s), ys, categories (string), unit,
// latest (the last value as stored), span: [from, to] (epoch s)}. A chart per measurement,
// each with its own labelled scale.
function chart(target, spec, i, opts) {
  const color = COLORS[i % COLORS.length];
  const caption = el("div", undefined, "caption");
  const name = el("span", spec.name, "name");
  name.style.color = color;
  const unit = spec.unit && spec.kind === "number" ? ` ${spec.unit}` : "";
  const latest = spec.latest === undefined ? "" : `: latest ${valueText(spec.latest)}${unit}`;
  caption.append(name, el("span", latest, "last"));
  if (spec.note) caption.append(el("span", ` (${spec.note})`, "note"));
  const box = el("div", undefined, "chart");
  box.dataset.measurement = spec.name;
  box.dataset.kind = spec.kind;
  target.append(caption, box);
  // as wide as its labels, and as the widest of its group (one time axis under all)
  const group = opts.group || { width: 0 };
  const y = { size: (u, values) => Math.max(axisSize(u, values), group.width), space: 18, stroke: color, font: AXIS_FONT, gap: 5 };
  const series = { label: spec.name, stroke: color, width: 1.5, spanGaps: true,
                   points: { show: spec.xs.length <= 30, size: 6, fill: color } };
  let range = valueRange;
  if (spec.kind === "number") {
    y.values = (_u, splits, _ax, _space, incr) => {
      const d = decimalsOf(incr);
      return splits.map((v) => tickText(v, d));
    };
  } else {
    // on/off, or the categories of a string: one tick each, named; steps between them
    const names = spec.kind === "boolean" ? ["off", "on"] : spec.categories;
    y.splits = () => names.map((_n, k) => k);
    y.values = (_u, splits) => splits.map((k) => names[k] ?? "");
    range = () => [-0.3, names.length - 0.7];
    series.paths = uPlot.paths.stepped({ align: 1 });
  }
  const timeAxis = opts.timeAxis;
  const u = new uPlot({
    width: opts.width, height: (timeAxis ? 44 : 0) + (opts.height || 84),
    padding: [8, 24, timeAxis ? 0 : 8, 0],
    legend: { show: false }, cursor: { show: false },
    scales: { x: { time: true, range: () => spec.span }, y: { range } },
    axes: [{ show: timeAxis, size: 44, font: AXIS_FONT }, y],
    hooks: { init: [wholeTimeLabels] },
    series: [{}, series],
  }, [spec.xs, spec.ys], box);
  box.uplot = u;  // the tests read its scales and draw positions through DevTools
  return u;
}

// -- a series' data ----------------------------------------------------------------------

// A series' tags as written in its title: {path=/boot} ("" without tags).
function tagText(tags) {
  const pairs = Object.entries(tags).map(([k, v]) => `${k}=${v}`);
  return pairs.length ? `{${pairs.join(",")}}` : "";
}

// Whether two tag objects are the same (the API gives keys in name order).
function sameTags(a, b) {
  return JSON.stringify(Object.entries(a)) === JSON.stringify(Object.entries(b));
}

// The query of one series: its sensor, its tags as `tag` (which also selects series of
// more tags: answers are filtered by sameTags).
function seriesQuery(sensor, extra) {
  const q = new URLSearchParams({ sensor: sensor.sensor_id, ...extra });
  Object.entries(sensor.tags).forEach(([k, v]) => q.append("tag", `${k}:${v}`));
  return q;
}

// Readings of this series only in [since, now): pages on while the answer holds other
// series' readings, until `want` of its own or the end.
async function readingsOf(sensor, since, extra, want) {
  const mine = [];
  let cursor = null;
  for (let page = 0; page < 5; page++) {
    const q = seriesQuery(sensor, { since, limit: "1000", ...extra });
    if (cursor) q.set("cursor", cursor);
    const answer = await getJSON(`api/readings?${q}`);
    mine.push(...answer.readings.filter((r) => sameTags(r.tags, sensor.tags)));
    cursor = answer.next;
    if (!cursor || mine.length >= want) break;
  }
  return mine;
}

function kindOf(value) {
  return typeof value === "boolean" ? "boolean" : typeof value === "string" ? "string" : "number";
}

// A string measurement's timeline: the last MAX_CATEGORIES distinct values as categories.
function timeline(points) {
  const recent = [];
  for (let k = points.length - 1; k >= 0 && recent.length < MAX_CATEGORIES; k--) {
    if (!recent.includes(points[k][1])) recent.push(points[k][1]);
  }
  const older = points.some(([, v]) => !recent.includes(v));
  const categories = [...(older ? ["(other)"] : []), ...recent.reverse()]
    .map((c) => (c.length > 16 ? `${c.slice(0, 15)}…` : c));
  const index = (v) => (recent.includes(v) ? recent.indexOf(v) + (older ? 1 : 0) : 0);
  return { categories, ys: points.map(([, v]) => index(v)) };
}

function specFromPoints(name, points, unit, span) {
  const kind = kindOf(points[points.length - 1][1]);
  const same = points.filter(([, v]) => kindOf(v) === kind);
  const spec = { name, kind, unit, span, latest: same[same.length - 1][1],
                 xs: same.map(([t]) => t) };
  if (kind === "string") Object.assign(spec, timeline(same));
  else spec.ys = same.map(([, v]) => (kind === "boolean" ? Number(v) : v));
  return spec;
}

// The window a series' charts span: from its first reading in the window to now.
function spanOf(sensor) {
  const now = Date.now() / 1000;
  const first = Date.parse(sensor.first_seen) / 1000;
  const pad = Math.max(30, (now - first) * 0.03);
  return [Math.min(first - pad, now - 120), now + 5];
}

function stepFor(seconds) {
  const step = STEPS.find((s) => seconds / s <= 200) || STEPS[STEPS.length - 1];
  return step % 60 === 0 ? `${step / 60}m` : `${step}s`;
}

// The charts' data of `names` of a series: every reading when there are few, else the
// series endpoint's averages per step (strings: their last readings).
async function chartData(sensor, names, since) {
  const span = spanOf(sensor);
  const unit = (m) => sensor.units[m];
  const measurement = names.join(",");
  if (sensor.readings <= RAW_LIMIT) {
    const readings = await readingsOf(sensor, since, { measurement }, sensor.readings);
    return names.map((m) => {
      const points = readings.filter((r) => m in r.values)
        .map((r) => [Date.parse(r.ts) / 1000, r.values[m]]);
      return points.length ? specFromPoints(m, points, unit(m), span) : null;
    });
  }
  // many readings: the last one tells each measurement's kind and latest value
  const last = await readingsOf(sensor, sensor.last_seen, { measurement }, 1);
  const latest = {};
  last.forEach((r) => Object.assign(latest, r.values));
  const strings = names.filter((m) => typeof latest[m] === "string");
  const others = names.filter((m) => !strings.includes(m));
  const specs = {};
  for (let k = 0; k < others.length; k += 10) {
    const q = seriesQuery(sensor, { measurement: others.slice(k, k + 10).join(","),
                                    since: sensor.first_seen, step: stepFor(span[1] - span[0]) });
    const answer = await getJSON(`api/series?${q}`);
    answer.series.filter((s) => sameTags(s.tags, sensor.tags)).forEach((s) => {
      const kind = typeof latest[s.measurement] === "boolean" ? "boolean" : "number";
      specs[s.measurement] = {
        name: s.measurement, kind, unit: s.unit, span, latest: latest[s.measurement],
        xs: s.points.map((p) => Date.parse(p.t) / 1000), ys: s.points.map((p) => p.avg),
        note: `average per ${stepFor(span[1] - span[0])}`,
      };
    });
  }
  // strings (and what the series endpoint does not answer): their latest readings, from
  // an estimate of when the last RAW_LIMIT of them began
  const rest = names.filter((m) => !specs[m]);
  if (rest.length) {
    const from = Date.parse(sensor.first_seen);
    const to = Date.parse(sensor.last_seen);
    const start = to - ((to - from) * 2 * RAW_LIMIT) / sensor.readings;
    const readings = await readingsOf(sensor, new Date(Math.max(from, start)).toISOString(),
                                      { measurement: rest.join(",") }, RAW_LIMIT);
    rest.forEach((m) => {
      const points = readings.filter((r) => m in r.values)
        .map((r) => [Date.parse(r.ts) / 1000, r.values[m]]);
      if (points.length) specs[m] = specFromPoints(m, points, unit(m), span);
    });
  }
  return names.map((m) => specs[m] || null);
}

// The charts of one card (or view), one under another: their y axes as wide as the
// widest, so that the time axis under the last holds for all.
async function drawAll(target, specs, width) {
  const shown = specs.filter((s) => s);
  const group = { width: 0 };
  const plots = shown.map((s, i) => chart(target, s, i, { width, group,
                                                          timeAxis: i === shown.length - 1 }));
  await sleep(0);  // uPlot sizes its axes once it has drawn (a microtask after new)
  group.width = Math.max(0, ...plots.map((u) => u.axes[1]._size));
  plots.filter((u) => u.axes[1]._size < group.width)
    .forEach((u) => u.setSize({ width: u.width, height: u.height }));
  if (shown.length === 0) target.append(el("div", "nothing to draw", "empty"));
}

// -- the cards ---------------------------------------------------------------------------

function cardKey(sensor) {
  return `${sensor.sensor_id}\u0000${tagText(sensor.tags)}`;
}

async function sensorCard(sensor) {
  const card = el("div", undefined, "card");
  card.dataset.sensor = sensor.sensor_id;
  card.dataset.tags = tagText(sensor.tags);
  const title = el("h3");
  const link = el("a", sensor.sensor_id);
  link.href = hashOf({ sensor: sensor.sensor_id, tags: sensor.tags });
  link.className = "open-sensor";
  title.append(link);
  if (card.dataset.tags) title.append(" ", el("span", card.dataset.tags, "tags"));
  card.append(title);
  const names = ordered(sensor.measurements);
  const open = state.open.has(cardKey(sensor));
  const charted = open ? names : names.slice(0, MAX_CHARTS);
  const left = names.length - charted.length;
  card.dataset.measurements = JSON.stringify(charted);
  card.append(el("div", `${plural(sensor.readings, "reading")}, last ${age(sensor.last_seen)}; ` +
                        names.join(", "), "meta"));
  if (left > 0) {
    card.append(el("div", `${left} more: click the card to show all`, "more"));
  }
  card.classList.toggle("open", open);
  card.addEventListener("click", (event) => {
    if (event.target.closest("a")) return;
    if (names.length <= MAX_CHARTS) return;
    const key = cardKey(sensor);
    if (state.open.has(key)) state.open.delete(key);
    else state.open.add(key);
    sensorCard(sensor).then((fresh) => card.replaceWith(fresh)).catch(showError);
  });
  const since = WINDOWS[state.window][0];
  await drawAll(card, await chartData(sensor, charted, since), 320);
  return card;
}

async function showSensors(mine) {
  const [since, , word] = WINDOWS[state.window];
  document.getElementById("sensors-title").textContent =
    `Sensors that reported in the last ${word}`;
  const page = state.cursors.length - 1;
  const q = new URLSearchParams({ since, limit: String(PAGE_SIZE) });
  if (state.search) q.set("search", state.search);
  if (state.cursors[page]) q.set("cursor", state.cursors[page]);
  const answer = await getJSON(`api/sensors?${q}`);
  const cards = await mapLimited(answer.sensors, sensorCard);
  if (mine !== generation) return;
  document.getElementById("sensors").replaceChildren(...cards);
  const first = page * PAGE_SIZE + 1;
  const note = document.getElementById("sensors-note");
  note.className = "";
  note.textContent = answer.sensors.length === 0 ?
    (state.search ? `No series matches "${state.search}" in the last ${word}.` :
      `No sensor reported in the last ${word}.`) :
    (answer.sensors.length === 1 ? `Series ${first}` :
      `Series ${first}–${first + answer.sensors.length - 1}`) +
    (answer.next ? ", more follow." : ".");
  const prev = document.getElementById("prev");
  const next = document.getElementById("next");
  prev.disabled = page === 0;
  next.disabled = !answer.next;
  next.onclick = () => {
    state.cursors.push(answer.next);
    refresh();
  };
}

// -- a sensor's own view -----------------------------------------------------------------

async function showSensorView(mine) {
  const [since, , word] = WINDOWS[state.window];
  const view = document.getElementById("sensor-view");
  delete view.dataset.ready;
  document.getElementById("back").href = hashOf({ sensor: null });
  const wanted = { sensor_id: state.sensor, tags: state.tags };
  document.getElementById("view-title").textContent =
    `${state.sensor} ${tagText(state.tags)}`.trim();
  // this series' entry in the sensors list (found by searching for its id)
  let sensor = null;
  let cursor = null;
  for (let page = 0; page < 20 && !sensor; page++) {
    const q = new URLSearchParams({ since, search: state.sensor, limit: "1000" });
    if (cursor) q.set("cursor", cursor);
    const answer = await getJSON(`api/sensors?${q}`);
    sensor = answer.sensors.find((s) => s.sensor_id === wanted.sensor_id &&
                                        sameTags(s.tags, wanted.tags)) || null;
    cursor = answer.next;
    if (!cursor) break;
  }
  const charts = document.getElementById("view-charts");
  const stats = document.querySelector("#view-stats tbody");
  const rows = document.querySelector("#view-readings tbody");
  if (!sensor) {
    document.getElementById("view-meta").textContent = `No readings in the last ${word}.`;
    charts.replaceChildren();
    stats.replaceChildren();
    rows.replaceChildren();
    view.dataset.ready = "1";
    return;
  }
  if (mine !== generation) return;
  const names = ordered(sensor.measurements);
  document.getElementById("view-meta").textContent =
    `${plural(sensor.readings, "reading")} in the last ${word}, first ` +
    `${new Date(sensor.first_seen).toLocaleString()}, last ${age(sensor.last_seen)}; ` +
    (Object.keys(sensor.info).length ? `info ${tagText(sensor.info)}; ` : "") +
    names.join(", ");
  const box = el("div");
  await drawAll(box, await chartData(sensor, names, since), 720);
  if (mine !== generation) return;
  charts.replaceChildren(box);
  await Promise.all([statsTable(sensor, names, since, stats), readingsTable(sensor, names, rows)]);
  view.dataset.ready = "1";
}

// Per-hour count/min/avg/max of each measurement, newest hour first (bucket mode answers
// from its statistics, without reading a reading).
async function statsTable(sensor, names, since, tbody) {
  const rows = [];
  let source = null;
  for (let k = 0; k < names.length; k += 10) {
    const q = seriesQuery(sensor, { measurement: names.slice(k, k + 10).join(","), since,
                                    step: "1h" });
    const answer = await getJSON(`api/series?${q}`);
    source = answer.source;
    answer.series.filter((s) => sameTags(s.tags, sensor.tags)).forEach((s) => {
      s.points.forEach((p) => rows.push([p.t, s.measurement, p]));
    });
  }
  rows.sort((a, b) => (a[0] < b[0] ? 1 : a[0] > b[0] ? -1 : names.indexOf(a[1]) -
                                                            names.indexOf(b[1])));
  document.getElementById("view-stats-source").textContent = source === "stats" ?
    "From the bucket documents' running statistics." : "Aggregated from the readings.";
  tbody.replaceChildren(...rows.map(([t, m, p]) => {
    const row = el("tr");
    row.append(el("td", new Date(t).toLocaleString()), el("td", m),
               el("td", String(p.count)), el("td", valueText(p.min)),
               el("td", valueText(p.avg)), el("td", valueText(p.max)));
    return row;
  }));
}

// The latest TABLE_READINGS readings, newest first.
async function readingsTable(sensor, names, tbody) {
  const from = Date.parse(sensor.first_seen);
  const to = Date.parse(sensor.last_seen);
  const start = sensor.readings <= TABLE_READINGS ? from :
    Math.max(from, to - ((to - from) * 2 * TABLE_READINGS) / sensor.readings);
  const readings = await readingsOf(sensor, new Date(start).toISOString(), {}, sensor.readings);
  const latest = readings.slice(-TABLE_READINGS).reverse();
  const head = document.querySelector("#view-readings thead tr");
  head.replaceChildren(el("th", "Time"), ...names.map((m) => el("th", m)));
  document.getElementById("view-readings-note").textContent =
    `The latest ${plural(latest.length, "reading")} of ${sensor.readings.toLocaleString()}.`;
  tbody.replaceChildren(...latest.map((r) => {
    const row = el("tr");
    row.append(el("td", new Date(r.ts).toLocaleString()),
               ...names.map((m) => el("td", m in r.values ? exactText(r.values[m]) : "")));
    return row;
  }));
}

// -- rejections, info --------------------------------------------------------------------

async function showRejects() {
  const answer = await getJSON("api/rejects?since=now-1h&limit=50");
  const none = answer.reasons.length === 0 && answer.rejects.length === 0;
  document.getElementById("no-rejects").hidden = !none;
  document.getElementById("reasons").hidden = none;
  document.getElementById("rejects").hidden = none;
  document.querySelector("#reasons tbody").replaceChildren(...answer.reasons.map((r) => {
    const row = el("tr");
    row.append(el("td", r.reason), el("td", String(r.count)));
    return row;
  }));
  document.querySelector("#rejects tbody").replaceChildren(...answer.rejects.map((r) => {
    const row = el("tr");
    row.append(el("td", new Date(r.at).toLocaleTimeString()), el("td", r.mode || ""),
               el("td", r.reason), el("td", r.topic || ""), el("td", r.detail || "", "detail"));
    return row;
  }));
}

async function showInfo() {
  const info = await getJSON("api/info");
  document.getElementById("about").textContent =
    `Reading ${info.db}.${info.collection} (${info.mode} layout).`;
  const grafana = document.getElementById("grafana");
  grafana.hidden = !info.grafana_dashboard;
  if (info.grafana_dashboard) grafana.href = info.grafana_dashboard;
  setOrder(info.measurement_order || { first: [], last: [] });
}

// -- refresh, login ----------------------------------------------------------------------

let timer = null;
let generation = 0;  // of the latest refresh: an older one, still loading, draws nothing

function showError(err) {
  if (err.status === 401) {  // the session ended (expired, or the API restarted)
    showLogin();
    return;
  }
  const note = document.getElementById(state.sensor ? "view-meta" : "sensors-note");
  note.textContent = `Cannot load: ${err.message}`;
  note.className = "error";
}

async function refresh() {
  const viewing = Boolean(state.sensor);
  document.getElementById("overview").hidden = viewing;
  document.getElementById("sensor-view").hidden = !viewing;
  document.getElementById("window").value = state.window;
  document.getElementById("search").value = state.search;
  delete document.body.dataset.ready;
  const mine = ++generation;
  try {
    await Promise.all([viewing ? showSensorView(mine) : showSensors(mine), showRejects()]);
  } catch (err) {
    if (mine !== generation) return;
    showError(err);
    if (err.status === 401) return;
  }
  if (mine === generation) document.body.dataset.ready = "1";
}

function showLogin(message) {
  clearInterval(timer);
  document.getElementById("content").hidden = true;
  document.getElementById("logout").hidden = true;
  document.getElementById("controls").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = message || "";
  document.getElementById("about").textContent = "Log in to see what arrived.";
  document.body.dataset.login = "1";
  document.getElementById("token").focus();
}

// GET session answers without a token: whether the API takes tokens, and whether this
// browser's session is live (so the page asks for a token without a 401 first).
async function start() {
  const session = await getJSON("session");
  if (session.tokens && !session.name) {
    showLogin();
    return;
  }
  document.getElementById("logout").hidden = !session.tokens;
  await showInfo().catch(() => {});
  document.getElementById("login").hidden = true;
  document.getElementById("content").hidden = false;
  document.getElementById("controls").hidden = false;
  delete document.body.dataset.login;
  readHash();
  await refresh();
  clearInterval(timer);
  timer = setInterval(refresh, 30000);
}

// The token goes in a POST body, never in a URL; the answer sets the session cookie.
async function logIn(event) {
  event.preventDefault();
  const input = document.getElementById("token");
  const resp = await fetch("login", {
    method: "POST", credentials: "same-origin", headers: { Accept: "application/json" },
    body: new URLSearchParams({ token: input.value }),
  });
  input.value = "";
  if (!resp.ok) {
    const body = await resp.json().catch(() => ({}));
    showLogin(body.error ? body.error.message : resp.statusText);
    return;
  }
  await start();
}

async function logOut() {
  await fetch("logout", { method: "POST", credentials: "same-origin" });
  showLogin();
}

let typing = null;

document.getElementById("login").addEventListener("submit", logIn);
document.getElementById("logout").addEventListener("click", logOut);
document.getElementById("window").addEventListener("change", (event) => {
  location.hash = hashOf({ window: event.target.value, sensor: state.sensor, tags: state.tags });
});
document.getElementById("search").addEventListener("input", (event) => {
  clearTimeout(typing);
  typing = setTimeout(() => {
    location.hash = hashOf({ search: event.target.value.trim(), sensor: null });
  }, 300);
});
document.getElementById("prev").addEventListener("click", () => {
  if (state.cursors.length > 1) state.cursors.pop();
  refresh();
});
window.addEventListener("hashchange", () => {
  const before = [state.window, state.search];
  readHash();
  if (before[0] !== state.window || before[1] !== state.search) state.cursors = [null];
  if (document.getElementById("content").hidden) return;
  refresh();
});
start().catch((err) => {
  document.getElementById("about").textContent = `Cannot load: ${err.message}`;
});

// The page of `ingest api`: the series (a sensor and its tags) of the last hour with small
// charts each, and the rejections of the last hour. Plain JS over the API's own endpoints; uPlot draws.
"use strict";

const MAX_CARDS = 24;
const MAX_CHARTS = 4;  // measurements charted per card (index.html says so)
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
const NUMBER = new Intl.NumberFormat(undefined, { maximumFractionDigits: 2 });

const MAX_PARALLEL = 4;  // the page's own queries at once (the API bounds each caller)

class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// The session cookie (HttpOnly, set by POST login) goes with every same-origin fetch; a
// 429 (too many queries of this caller at once) is retried after its Retry-After.
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
  if (text !== undefined) node.textContent = text;  // never innerHTML: topics come from devices
  if (cls) node.className = cls;
  return node;
}

function plural(n, word) {
  return `${n} ${n === 1 ? word : `${word}s`}`;
}

function age(iso) {
  const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  return seconds < 90 ? `${seconds} s ago` : `${Math.round(seconds / 60)} min ago`;
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

// One small chart per measurement, each with its own labelled scale: in one chart, lines
// of few points on scales of their own lie on top of each other. The time axis is the
// window the series answer covered, even for one point (which uPlot alone would put on
// an axis of years).
function chart(target, answer, series, i, withTimeAxis) {
  const xs = series.points.map((p) => Date.parse(p.t) / 1000);
  const ys = series.points.map((p) => p.avg);
  const color = COLORS[i % COLORS.length];
  const caption = el("div", undefined, "caption");
  const name = el("span", series.measurement, "name");
  name.style.color = color;
  const unit = series.unit ? ` ${series.unit}` : "";
  caption.append(name, el("span", `: latest ${NUMBER.format(ys[ys.length - 1])}${unit}`,
                          "last"));
  const box = el("div", undefined, "chart");
  box.dataset.measurement = series.measurement;
  target.append(caption, box);
  const hour = [Date.parse(answer.since) / 1000, Date.parse(answer.until) / 1000];
  const u = new uPlot({
    width: 320, height: withTimeAxis ? 116 : 72,
    padding: [8, 24, withTimeAxis ? 0 : 8, 0],  // one plot width with or without time axis
    legend: { show: false }, cursor: { show: false },
    scales: { x: { time: true, range: () => hour }, y: { range: valueRange } },
    axes: [{ show: withTimeAxis, size: 44 }, { size: 50, space: 20, stroke: color }],
    series: [{}, { label: series.measurement, stroke: color, width: 1.5, spanGaps: true,
                   points: { show: xs.length <= 30, size: 6, fill: color } }],
  }, [xs, ys], box);
  box.uplot = u;  // the tests read its scales and draw positions through DevTools
}

// A series' tags as written in its title: {path=/boot} ("" without tags).
function tagText(tags) {
  const pairs = Object.entries(tags).map(([k, v]) => `${k}=${v}`);
  return pairs.length ? `{${pairs.join(",")}}` : "";
}

// Whether two tag objects are the same (the API gives keys in name order).
function sameTags(a, b) {
  return JSON.stringify(Object.entries(a)) === JSON.stringify(Object.entries(b));
}

async function sensorCard(sensor) {
  const card = el("div", undefined, "card");
  card.dataset.sensor = sensor.sensor_id;
  card.dataset.tags = tagText(sensor.tags);
  const title = el("h3", sensor.sensor_id);
  if (card.dataset.tags) {
    title.append(" ", el("span", card.dataset.tags, "tags"));
  }
  card.append(title);
  const names = sensor.measurements.slice(0, MAX_CHARTS);
  const left = sensor.measurements.length - names.length;
  card.append(el("div", `${plural(sensor.readings, "reading")}, last ${age(sensor.last_seen)}; ` +
                        sensor.measurements.join(", ") +
                        (left > 0 ? ` (charts of the first ${MAX_CHARTS})` : ""), "meta"));
  if (names.length === 0) return card;
  // this series only: its tags select it and the series with more tags, left out here
  const query = new URLSearchParams({ sensor: sensor.sensor_id, measurement: names.join(","),
                                      since: "now-1h", step: "1m" });
  Object.entries(sensor.tags).forEach(([k, v]) => query.append("tag", `${k}:${v}`));
  const answer = await getJSON(`api/series?${query}`);
  const mine = answer.series.filter((s) => sameTags(s.tags, sensor.tags));
  if (mine.length === 0) {
    card.append(el("div", "no numeric measurements to draw", "empty"));
  }
  mine.forEach((s, i) => chart(card, answer, s, i, i === mine.length - 1));
  return card;
}

async function showSensors() {
  const answer = await getJSON(`api/sensors?since=now-1h&limit=${MAX_CARDS}`);
  const target = document.getElementById("sensors");
  const cards = await mapLimited(answer.sensors, sensorCard);
  target.replaceChildren(...cards);
  const note = document.getElementById("sensors-note");
  note.textContent = answer.sensors.length === 0 ? "No sensor reported in the last hour." :
    answer.next ? `The first ${MAX_CARDS} series by name; Grafana shows them all.` : "";
}

async function showRejects() {
  const answer = await getJSON("api/rejects?since=now-1h&limit=50");
  const reasons = document.querySelector("#reasons tbody");
  reasons.replaceChildren(...answer.reasons.map((r) => {
    const row = el("tr");
    row.append(el("td", r.reason), el("td", String(r.count)));
    return row;
  }));
  if (answer.reasons.length === 0) {
    const row = el("tr");
    row.append(el("td", "none"), el("td", "0"));
    reasons.append(row);
  }
  const latest = document.querySelector("#rejects tbody");
  latest.replaceChildren(...answer.rejects.map((r) => {
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
  document.getElementById("grafana").href = info.grafana_dashboard;
}

let timer = null;

async function refresh() {
  try {
    await Promise.all([showSensors(), showRejects()]);
  } catch (err) {
    if (err.status === 401) {  // the session ended (expired, or the API restarted)
      showLogin();
      return;
    }
    const note = document.getElementById("sensors-note");
    note.textContent = `Cannot load: ${err.message}`;
    note.className = "error";
  }
  document.body.dataset.ready = "1";
}

function showLogin(message) {
  clearInterval(timer);
  document.getElementById("content").hidden = true;
  document.getElementById("logout").hidden = true;
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
  delete document.body.dataset.login;
  await refresh();
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

document.getElementById("login").addEventListener("submit", logIn);
document.getElementById("logout").addEventListener("click", logOut);
start().catch((err) => {
  document.getElementById("about").textContent = `Cannot load: ${err.message}`;
});

// The page of `ingest api`: sensors of the last hour with a small chart each, and the
// rejections of the last hour. Plain JS over the API's own endpoints; uPlot draws.
"use strict";

const MAX_CARDS = 24;
const MAX_LINES = 4;
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

async function getJSON(path) {
  const resp = await fetch(path);
  const body = await resp.json();
  if (!resp.ok) {
    throw new Error(body.error ? body.error.message : resp.statusText);
  }
  return body;
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;  // never innerHTML: topics come from devices
  if (cls) node.className = cls;
  return node;
}

function age(iso) {
  const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  return seconds < 90 ? `${seconds} s ago` : `${Math.round(seconds / 60)} min ago`;
}

function chart(target, answer) {
  const times = new Set();
  answer.series.forEach((s) => s.points.forEach((p) => times.add(Date.parse(p.t) / 1000)));
  const xs = [...times].sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const data = [xs];
  const series = [{}];
  answer.series.forEach((s, i) => {
    const ys = new Array(xs.length).fill(null);
    s.points.forEach((p) => { ys[index.get(Date.parse(p.t) / 1000)] = p.avg; });
    data.push(ys);
    series.push({ label: s.measurement, stroke: COLORS[i % COLORS.length], width: 1.5,
                  scale: `m${i}`, spanGaps: true, points: { size: 4 } });
  });
  const axes = [{}, { scale: "m0", size: 40 }];
  if (answer.series.length > 1) {  // the second line's scale on the right; others unlabelled
    axes.push({ scale: "m1", side: 1, size: 40, grid: { show: false },
                stroke: COLORS[1] });
  }
  const scales = { x: { time: true } };
  return new uPlot({ width: 320, height: 130, series, axes, scales,
                     legend: { show: true, live: false }, cursor: { show: false } },
                   data, target);
}

async function sensorCard(sensor) {
  const card = el("div", undefined, "card");
  card.dataset.sensor = sensor.sensor_id;
  card.append(el("h3", sensor.sensor_id));
  card.append(el("div", `${sensor.readings} readings, last ${age(sensor.last_seen)}; ` +
                        sensor.measurements.join(", "), "meta"));
  const names = sensor.measurements.slice(0, MAX_LINES);
  if (names.length === 0) return card;
  const query = new URLSearchParams({ sensor: sensor.sensor_id, measurement: names.join(","),
                                      since: "now-1h", step: "1m" });
  const answer = await getJSON(`api/series?${query}`);
  if (answer.series.length === 0) {
    card.append(el("div", "no numeric measurements to draw", "empty"));
  } else {
    const box = el("div", undefined, "chart");
    card.append(box);
    chart(box, answer);
  }
  return card;
}

async function showSensors() {
  const answer = await getJSON(`api/sensors?since=now-1h&limit=${MAX_CARDS}`);
  const target = document.getElementById("sensors");
  const cards = await Promise.all(answer.sensors.map(sensorCard));
  target.replaceChildren(...cards);
  const note = document.getElementById("sensors-note");
  note.textContent = answer.sensors.length === 0 ? "No sensor reported in the last hour." :
    answer.next ? `The first ${MAX_CARDS} sensors by name; Grafana shows them all.` : "";
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
    row.append(el("td", new Date(r.at).toLocaleTimeString()), el("td", r.reason),
               el("td", r.topic || ""), el("td", r.detail || "", "detail"));
    return row;
  }));
}

async function showInfo() {
  const info = await getJSON("api/info");
  document.getElementById("about").textContent =
    `Reading ${info.db}.${info.collection} (${info.mode} layout).`;
  document.getElementById("grafana").href = info.grafana_dashboard;
}

async function refresh() {
  try {
    await Promise.all([showSensors(), showRejects()]);
  } catch (err) {
    const note = document.getElementById("sensors-note");
    note.textContent = `Cannot load: ${err.message}`;
    note.className = "error";
  }
  document.body.dataset.ready = "1";
}

showInfo().catch(() => {});
refresh();
setInterval(refresh, 30000);

// The dashboard: polls the job's REST API once a second and draws with inline SVG.
// No libraries: the machines that run jobs have no internet, and the page must load anyway.
"use strict";

// A job with rest.token: the operator types it once into the page's form; it is kept for
// this tab only and sent as a header, never in a URL (URLs end up in logs and history).
const TOKEN_KEY = "sparkpoint-rest-token";
function headers() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: "Bearer " + token } : {};
}
const samples = [];  // {t, rate, lag}: the throughput and lag charts, kept in the browser
let jobName = null;
let selected = null;

const $ = (id) => document.getElementById(id);
const fmt = (n) => (n === null || n === undefined ? "-" : Number(n).toLocaleString("en-US"));
const time = (ms) => (ms ? new Date(ms).toLocaleTimeString() : "-");
function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n.toFixed(0)) + units[i];
}
function el(tag, attrs, text) {
  const node = tag === "svg" || ["rect", "polyline", "line", "title"].includes(tag)
    ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

async function get(path) {
  const r = await fetch(path, { headers: headers(), cache: "no-store" });
  if (r.status === 401) $("login").hidden = false;
  const body = await r.json();
  if (!r.ok) throw new Error((body.errors || [r.statusText]).join("; "));
  return body;
}

function line(svg, values) {
  svg.replaceChildren();
  if (values.length < 2) return;
  const max = Math.max(1, ...values);
  const pts = values.map((v, i) => `${(i * 400) / (values.length - 1)},${98 - (v / max) * 90}`);
  svg.append(el("polyline", { points: pts.join(" "), fill: "none", stroke: "#2563eb", "stroke-width": 2,
                              "vector-effect": "non-scaling-stroke" }));
  svg.append(el("title", {}, "max " + fmt(Math.round(max))));
}

function bars(svg, history, key) {
  svg.replaceChildren();
  const items = history.filter((h) => h[key] !== null && h[key] !== undefined);
  if (!items.length) return;
  const max = Math.max(1, ...items.map((h) => h[key]));
  const w = 400 / items.length;
  items.forEach((h, i) => {
    const height = Math.max(1, (h[key] / max) * 95);
    const bar = el("rect", { x: i * w + 1, y: 100 - height, width: Math.max(1, w - 2), height, class: h.status,
                             "data-id": h.id });
    bar.append(el("title", {}, `#${h.id} ${key === "state_size" ? bytes(h[key]) : h[key] + " ms"}`));
    svg.append(bar);
  });
}

function timeline(svg, history) {
  svg.replaceChildren();
  const w = 800 / Math.max(history.length, 20);
  history.forEach((h, i) => {
    const mark = el("rect", { x: i * w + 1, y: 2, width: Math.max(1, w - 2), height: 20, class: h.status,
                              "data-id": h.id, "data-status": h.status });
    mark.append(el("title", {}, `#${h.id} ${h.status}${h.failure_reason ? ": " + h.failure_reason : ""}`));
    mark.addEventListener("click", () => showDetails(h.id));
    svg.append(mark);
  });
}

function historyTable(history) {
  const body = $("history").querySelector("tbody");
  body.replaceChildren();
  for (const h of [...history].reverse()) {
    const row = el("tr", { "data-id": h.id, "data-status": h.status });
    row.append(el("td", {}, "#" + h.id), el("td", { class: "status " + h.status }, h.status),
               el("td", {}, time(h.trigger_timestamp)),
               el("td", {}, h.end_to_end_duration === null ? "-" : h.end_to_end_duration + " ms"),
               el("td", {}, bytes(h.state_size)),
               el("td", {}, h.failure_reason ? `${h.failure_reason}: ${h.failure_message || ""}` : ""));
    row.addEventListener("click", () => showDetails(h.id));
    body.append(row);
  }
}

async function showDetails(id) {
  selected = id;
  const d = await get(`/jobs/${encodeURIComponent(jobName)}/checkpoints/details/${id}`);
  $("details").hidden = false;
  $("details-id").textContent = `#${d.id} (${d.status})`;
  const body = $("participants").querySelector("tbody");
  body.replaceChildren();
  for (const p of d.participants) {
    const row = el("tr", { "data-participant": p.id });
    row.append(el("td", {}, p.id), el("td", {}, time(p.ack_timestamp)),
               el("td", {}, p.sync_duration === null ? "-" : p.sync_duration + " ms"),
               el("td", {}, p.async_duration === null ? "-" : p.async_duration + " ms"),
               el("td", {}, bytes(p.bytes)));
    body.append(row);
  }
}

function events(overview, checkpoints, exceptions) {
  const reasons = $("reasons");
  reasons.replaceChildren();
  const entries = Object.entries(checkpoints.failures_by_reason || {}).sort((a, b) => b[1] - a[1]);
  if (!entries.length) reasons.append(el("li", {}, "none"));
  for (const [reason, n] of entries) reasons.append(el("li", { "data-reason": reason }, `${reason}: ${n}`));
  const alarms = $("alarms");
  alarms.replaceChildren();
  const items = [
    ...exceptions.failovers.map((f) => ({ t: f.timestamp, text: `${f.kind}: ${f.exception || ""}`, cls: "failover" })),
    ...exceptions.alarms.map((a) => ({ t: a.timestamp, cls: "alarm",
      text: `checkpoint ${a.checkpoint_id ?? "-"} ${a.reason}${a.participant ? " (" + a.participant + ")" : ""}` +
            `${a.error ? ": " + a.error : ""}. ${a.action}` })),
  ].sort((a, b) => b.t - a.t).slice(0, 30);
  if (!items.length) alarms.append(el("li", {}, "none"));
  for (const i of items) alarms.append(el("li", { class: i.cls }, `${time(i.t)} ${i.text}`));
}

async function refresh() {
  try {
    const [overview] = (await get("/jobs/overview")).jobs;
    jobName = overview.name;
    const job = encodeURIComponent(jobName);
    const [checkpoints, exceptions] = await Promise.all([get(`/jobs/${job}/checkpoints`), get(`/jobs/${job}/exceptions`)]);
    document.title = `sparkpoint: ${overview.name} ${overview.state}`;
    $("job-name").textContent = overview.name;
    $("job-state").textContent = overview.state;
    $("job-state").className = "badge " + overview.state;
    $("job-meta").textContent = `run ${overview["run-id"]} · started ${new Date(overview["start-time"]).toLocaleString()}` +
      ` · up ${Math.round(overview.duration / 1000)} s`;
    $("rate").textContent = fmt(Math.round(overview["records-in-per-second"]));
    $("records-in").textContent = fmt(overview["records-in"]);
    $("records-out").textContent = fmt(overview["records-out"]);
    $("lag").textContent = fmt(overview.lag);
    $("watermark").textContent = overview.watermark === null ? "-" : new Date(overview.watermark).toISOString().slice(11, 19);
    $("epoch").textContent = fmt(overview.epoch);
    $("restarts").textContent = fmt(overview.restarts);
    samples.push({ rate: overview["records-in-per-second"], lag: overview.lag });
    if (samples.length > 120) samples.shift();
    line($("chart-rate"), samples.map((s) => s.rate));
    line($("chart-lag"), samples.map((s) => s.lag));

    const c = checkpoints.counts;
    $("checkpoint-counts").textContent =
      `${c.completed} completed · ${c.failed} failed · ${c.in_progress} in progress · ${c.restored} restored`;
    const history = [...checkpoints.history].reverse();  // oldest first, left to right
    timeline($("timeline"), history);
    bars($("chart-duration"), history, "end_to_end_duration");
    bars($("chart-size"), history, "state_size");
    const d = checkpoints.summary.end_to_end_duration, s = checkpoints.summary.state_size;
    $("summary").textContent = d.count
      ? `duration p50 ${d.p50} ms · p90 ${d.p90} ms · p99 ${d.p99} ms · max ${d.max} ms — size p50 ${bytes(s.p50)} · max ${bytes(s.max)}`
      : "no completed checkpoint yet";
    historyTable(history);
    events(overview, checkpoints, exceptions);
    if (selected === null) {
      const latest = checkpoints.latest.completed;
      if (latest) await showDetails(latest.id);
    }
    $("error").hidden = true;
  } catch (e) {
    $("error").hidden = false;
    $("error").textContent = "cannot reach the job: " + e.message;
  }
}

$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("token").value);
  $("token").value = "";
  $("login").hidden = true;
  refresh();
});

refresh();
setInterval(refresh, 1000);

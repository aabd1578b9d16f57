// doq dashboard: one page, no library, no build step. It reads the node's `GET /events`
// stream (Server-Sent Events, read with fetch so a key can be sent as a header) and the
// `/API/v1` and `/cluster` endpoints. Every value from the server is written with
// textContent (never as HTML).
"use strict";

const HISTORY_MS = 10 * 60 * 1000; // rate history shown per queue (the node keeps 10 minutes too)
const PAGE = 20; // messages per browser page
const state = {
  snapshot: null, // the last /events snapshot
  history: new Map(), // queue name -> [{t, enqueued, delivered, acked}]
  rates: new Map(), // queue name -> {enq, deq, ack} per second
  sort: { key: "name", asc: true },
  browse: { queue: "", state: "ready", offset: 0 },
  redrives: new Map(), // queue name -> its last redrive task (GET .../redrive)
};
window.doqDashboard = state; // for people in the console, and for the browser test

// -- small helpers -------------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}
// Replace `node`'s children (nulls, for "nothing here", are left out).
function put(node, ...kids) {
  node.replaceChildren(...kids.flat().filter((k) => k !== null && k !== undefined));
}
const fmt = (n) => (n === undefined || n === null ? "–" : Number(n).toLocaleString("en-US"));
const fmtRate = (r) => (r === undefined ? "–" : r < 10 ? r.toFixed(1) : Math.round(r).toLocaleString("en-US"));
// bytes in the largest binary unit that keeps them whole-ish (as the CLI's format_size)
function fmtBytes(n) {
  for (const [u, s] of [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]]) {
    if (n >= s) return `${(n / s).toFixed(1)} ${u}`;
  }
  return `${n} B`;
}
// an age in ms as its two largest units: "850 ms", "42 s", "3 min 12 s", "5 h 4 min", "2 d 7 h"
function fmtAge(ms) {
  if (ms === undefined || ms === null) return "–";
  if (ms < 1000) return `${ms} ms`;
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${s} s`;
  const units = [["d", 86400], ["h", 3600], ["min", 60], ["s", 1]];
  const i = units.findIndex(([, n]) => s >= n);
  const [u1, n1] = units[i], [u2, n2] = units[i + 1];
  const a = Math.floor(s / n1), b = Math.floor((s % n1) / n2);
  return b ? `${a} ${u1} ${b} ${u2}` : `${a} ${u1}`;
}
state.fmtAge = fmtAge; // the browser test checks the units

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const key = sessionStorage.getItem("doq-key");
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function api(method, path, body) {
  const init = { method, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const r = await fetch(path, init);
  if (r.status === 401) showKeyForm("this node needs an API key");
  const text = await r.text();
  let doc = null;
  try { doc = text ? JSON.parse(text) : null; } catch (e) { doc = null; }
  if (!r.ok) {
    const detail = doc && (doc.detail || doc.title) ? doc.detail || doc.title : text || r.statusText;
    throw new Error(`${r.status} ${detail}${doc && doc.reason ? " (" + doc.reason + ")" : ""}`);
  }
  return doc;
}

function banner(text, isError) {
  const b = document.getElementById("banner");
  b.hidden = !text;
  b.className = isError ? "error" : "";
  b.textContent = text || "";
}

function showKeyForm(why) {
  document.getElementById("key-form").hidden = false;
  if (why) banner(why, true);
}

// -- the live stream -----------------------------------------------------------------------
async function follow() {
  for (;;) {
    try {
      const r = await fetch("/events", { headers: headers({ Accept: "text/event-stream" }) });
      if (r.status === 401) { showKeyForm("this node needs an API key"); await sleep(3000); continue; }
      if (!r.ok || !r.body) throw new Error(`/events answered ${r.status}`);
      banner("");
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
          if (data && /(^|\n)event: snapshot/.test(block)) onSnapshot(JSON.parse(data));
        }
      }
    } catch (e) {
      banner(`live updates stopped (${e.message}); retrying…`, true);
    }
    await sleep(2000);
  }
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function onSnapshot(snap) {
  const prev = state.snapshot;
  state.snapshot = snap;
  const before = new Map((prev ? prev.queues : []).map((q) => [q.name, q]));
  const dt = prev ? (snap.time_ms - prev.time_ms) / 1000 : 0;
  for (const q of snap.queues) {
    const p = before.get(q.name);
    if (p && dt > 0) {
      state.rates.set(q.name, {
        enq: Math.max(0, q.enqueued - p.enqueued) / dt,
        deq: Math.max(0, q.delivered - p.delivered) / dt,
        ack: Math.max(0, q.acked - p.acked) / dt,
      });
    }
    const h = state.history.get(q.name) || [];
    h.push({ t: snap.time_ms, enqueued: q.enqueued, delivered: q.delivered, acked: q.acked });
    while (h.length && h[0].t < snap.time_ms - HISTORY_MS) h.shift();
    state.history.set(q.name, h);
  }
  const n = snap.node;
  document.getElementById("node-line").textContent =
    `${n.node_id} · ${n.role}${n.ready ? "" : " (not ready)"} · leader ${n.leader_id || "none"} · term ${n.term}` +
    ` · commit ${fmt(n.commit_index)} · applied ${fmt(n.applied_index)}`;
  render(false);
}

// -- views -----------------------------------------------------------------------------------
function route() {
  const hash = location.hash || "#/";
  if (hash.startsWith("#/queue/")) return { view: "queue", name: decodeURIComponent(hash.slice(8)) };
  if (hash === "#/cluster") return { view: "cluster" };
  return { view: "queues" };
}

function render(navigated) {
  const r = route();
  document.getElementById("nav-queues").className = r.view === "cluster" ? "" : "active";
  document.getElementById("nav-cluster").className = r.view === "cluster" ? "active" : "";
  if (r.view === "queues") renderQueues();
  else if (r.view === "queue") renderQueue(r.name, navigated);
  else if (navigated) renderCluster();
}

const COLUMNS = [
  ["name", "Queue", false], ["type", "Type", false], ["ready", "Ready", true], ["delayed", "Delayed", true],
  ["in_flight", "In flight", true], ["dead", "Dead-lettered", true], ["total", "Total", true],
  ["oldest_age_ms", "Oldest", true],
  ["enq", "Enqueued/s", true], ["deq", "Delivered/s", true], ["ack", "Acked/s", true],
];

function renderQueues() {
  const view = document.getElementById("view");
  const snap = state.snapshot;
  const rows = (snap ? snap.queues : []).map((q) => Object.assign({}, q, state.rates.get(q.name) || {}));
  const { key, asc } = state.sort;
  rows.sort((a, b) => {
    const x = a[key] ?? -1, y = b[key] ?? -1;
    const c = typeof x === "string" ? x.localeCompare(y) : x - y;
    return asc ? c : -c;
  });
  const head = el("tr", {}, COLUMNS.map(([k, label, num]) => el("th", {
    class: `sortable${num ? " num" : ""}${key === k ? " sorted" + (asc ? " asc" : "") : ""}`,
    "data-key": k,
    onclick: () => { state.sort = { key: k, asc: state.sort.key === k ? !state.sort.asc : !num }; renderQueues(); },
  }, label)));
  const body = rows.map((q) => el("tr", { class: "clickable", "data-queue": q.name,
    onclick: () => { location.hash = "#/queue/" + encodeURIComponent(q.name); } },
  COLUMNS.map(([k, , num]) => el("td", { class: num ? "num" : "", "data-col": k },
    k === "enq" || k === "deq" || k === "ack" ? fmtRate(q[k]) : k === "oldest_age_ms" ? fmtAge(q[k])
      : num ? fmt(q[k]) : q[k]))));
  const more = snap && snap.queues_total > snap.queues.length
    ? el("p", { class: "muted" }, `showing ${snap.queues.length} of ${snap.queues_total} queues`) : null;
  put(view, 
    el("h1", {}, "Queues"),
    snap && !rows.length ? el("p", { class: "muted", id: "no-queues" }, "No queues yet.") : null,
    el("table", { id: "queues" }, el("thead", {}, head), el("tbody", {}, body)),
    more,
  );
}

function queueRow(name) {
  return state.snapshot ? state.snapshot.queues.find((q) => q.name === name) : undefined;
}

function renderQueue(name, navigated) {
  const view = document.getElementById("view");
  const q = queueRow(name);
  if (navigated || view.dataset.queue !== name) {
    view.dataset.queue = name;
    state.browse = { queue: name, state: "ready", offset: 0 };
    put(view, 
      el("h1", {}, el("a", { href: "#/" }, "Queues"), " / ", el("span", { id: "queue-name" }, name),
        " ", el("span", { class: "badge", id: "queue-type" }, q ? q.type : "")),
      el("div", { class: "cards", id: "cards" }),
      el("h2", {}, "Rates (last 10 minutes)"),
      el("div", { class: "chart" }, el("div", { class: "legend" },
        el("span", { class: "enq" }, "■ enqueued/s"), el("span", { class: "deq" }, "■ delivered/s"),
        el("span", { class: "ack" }, "■ acked/s")), el("div", { id: "chart" })),
      el("div", { id: "groups-box" }),
      el("h2", {}, "Messages ", el("span", { class: "muted" }, "(browsing takes nothing: no lease, no attempt)")),
      el("div", { class: "tabs", id: "tabs" }, ["ready", "delayed", "in_flight"].map((s) =>
        el("button", { type: "button", "data-state": s, onclick: () => browse(name, s, 0) }, s.replace("_", " ")))),
      el("div", { id: "messages" }),
      el("div", { class: "pager", id: "pager" }),
      el("div", { id: "details" }),
      el("h2", {}, "Queue actions"),
      el("div", { class: "actions" },
        el("button", { type: "button", id: "redrive", onclick: () => startRedrive(name) }, "Redrive messages…"),
        el("button", { type: "button", class: "danger", id: "purge", onclick: () => purge(name) }, "Purge all messages")),
      el("div", { id: "redrive-box" }),
    );
    browse(name, "ready", 0);
    loadHistory(name);
    loadRedrive(name);
  } else if ((state.redrives.get(name) || {}).state === "running") {
    loadRedrive(name); // follow a running redrive's progress with the page's updates
  }
  if (q) {
    const type = document.getElementById("queue-type");
    type.textContent = q.type;
    const r = state.rates.get(name) || {};
    put(document.getElementById("cards"), ...[
      ["ready", q.ready], ["delayed", q.delayed], ["in flight", q.in_flight], ["dead-lettered", q.dead],
      ["total", q.total], ["oldest message", fmtAge(q.oldest_age_ms)], ["enqueued/s", fmtRate(r.enq)], ["delivered/s", fmtRate(r.deq)], ["acked/s", fmtRate(r.ack)],
    ].map(([k, v]) => el("div", { class: "card", "data-card": k }, el("div", { class: "v" }, typeof v === "number" ? fmt(v) : v),
      el("div", { class: "k" }, k))));
    drawChart(name);
    if (q.type === "fair") loadGroups(name);
  } else if (state.snapshot) {
    put(document.getElementById("cards"), el("p", { class: "muted" }, "This queue does not exist (any more)."));
  }
}

function drawChart(name) {
  const h = state.history.get(name) || [];
  const box = document.getElementById("chart");
  const W = 900, H = 180, P = 30;
  const points = [];
  for (let i = 1; i < h.length; i++) {
    const dt = (h[i].t - h[i - 1].t) / 1000;
    if (dt <= 0) continue;
    points.push({ t: h[i].t, enq: (h[i].enqueued - h[i - 1].enqueued) / dt,
      deq: (h[i].delivered - h[i - 1].delivered) / dt, ack: (h[i].acked - h[i - 1].acked) / dt });
  }
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("width", "100%");
  svg.setAttribute("height", H);
  const max = Math.max(1, ...points.map((p) => Math.max(p.enq, p.deq, p.ack)));
  const t1 = points.length ? points[points.length - 1].t : 0, t0 = t1 - HISTORY_MS;
  const x = (t) => P + ((t - t0) / HISTORY_MS) * (W - 2 * P);
  const y = (v) => H - P + 10 - (Math.max(0, v) / max) * (H - 2 * P);
  const axis = document.createElementNS(ns, "text");
  axis.setAttribute("x", 2); axis.setAttribute("y", 14); axis.setAttribute("font-size", 11);
  axis.textContent = `${fmtRate(max)}/s`;
  svg.append(axis);
  for (const [k, color] of [["enq", "var(--enq)"], ["deq", "var(--deq)"], ["ack", "var(--ack)"]]) {
    if (!points.length) break;
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", color);
    line.setAttribute("stroke-width", 2);
    line.setAttribute("points", points.map((p) => `${x(p.t).toFixed(1)},${y(p[k]).toFixed(1)}`).join(" "));
    line.dataset.series = k;
    svg.append(line);
  }
  put(box, svg);
}

let groupsLoading = false;
// The node's own samples (one every 5 s since it started) before this page's first one, so
// the chart does not start empty.
async function loadHistory(name) {
  try {
    const doc = await api("GET", `/API/v1/queues/${encodeURIComponent(name)}/history`);
    const h = state.history.get(name) || [];
    const first = h.length ? h[0].t : Infinity;
    const older = doc.samples.filter((x) => x.time_ms < first)
      .map((x) => ({ t: x.time_ms, enqueued: x.enqueued, delivered: x.delivered, acked: x.acked }));
    state.history.set(name, older.concat(h));
    if (route().name === name && document.getElementById("chart")) drawChart(name);
  } catch (e) {
    banner(`history: ${e.message}`, true);
  }
}

async function loadGroups(name) {
  if (groupsLoading) return;
  groupsLoading = true;
  try {
    const doc = await api("GET", `/API/v1/queues/${encodeURIComponent(name)}/groups?limit=200`);
    const box = document.getElementById("groups-box");
    if (!box || route().name !== name) return;
    const rows = doc.groups.map((g) => el("tr", { "data-group": g.group }, el("td", {}, g.group || "(none)"),
      el("td", { class: "num" }, fmt(g.ready)), el("td", { class: "num" }, fmt(g.in_flight)),
      el("td", { class: "num", "data-col": "weight" }, fmt(g.weight)),
      el("td", { class: "num", "data-col": "rate" }, g.max_per_second ? `${fmt(g.max_per_second)}/s` : "no limit"),
      el("td", { "data-col": "state" }, g.throttled ? "over its rate: waits" : "", g.overridden ? " (own policy)" : "")));
    put(box, 
      el("h2", {}, `Groups (${fmt(doc.total)})`,
        el("span", { class: "muted" }, " — each group with a message gets turns of its weight, within its rate")),
      el("table", { id: "groups" }, el("thead", {}, el("tr", {}, el("th", {}, "Group"), el("th", { class: "num" }, "Backlog"),
        el("th", { class: "num" }, "In flight"), el("th", { class: "num" }, "Weight"), el("th", { class: "num" }, "Rate"),
        el("th", {}, ""))), el("tbody", {}, rows)),
    );
  } catch (e) {
    banner(`groups: ${e.message}`, true);
  } finally {
    groupsLoading = false;
  }
}

async function browse(name, st, offset) {
  state.browse = { queue: name, state: st, offset };
  for (const b of document.querySelectorAll("#tabs button")) b.className = b.dataset.state === st ? "active" : "";
  let doc;
  try {
    doc = await api("GET", `/API/v1/queues/${encodeURIComponent(name)}/messages:peek?state=${st}&offset=${offset}&limit=${PAGE}`);
  } catch (e) {
    put(document.getElementById("messages"), el("p", { class: "muted" }, e.message));
    return;
  }
  const box = document.getElementById("messages");
  if (!box) return;
  const rows = doc.messages.map((m, i) => el("tr", { class: "clickable", "data-id": m.id, onclick: () => details(name, m.id) },
    el("td", { class: "num" }, offset + i + 1), el("td", {}, m.id), el("td", {}, m.group), el("td", { class: "num" }, m.priority),
    el("td", { class: "num" }, m.attempts), el("td", {}, m.state), el("td", { class: "content" }, m.content)));
  put(box, doc.messages.length ? el("table", { id: "message-table" },
    el("thead", {}, el("tr", {}, ["#", "Id", "Group", "Priority", "Attempts", "State", "Content"].map((h) =>
      el("th", { class: ["#", "Priority", "Attempts"].includes(h) ? "num" : "" }, h)))),
    el("tbody", {}, rows)) : el("p", { class: "muted", id: "no-messages" }, `No ${st.replace("_", " ")} messages.`));
  put(document.getElementById("pager"), 
    el("button", { type: "button", id: "prev", disabled: offset === 0 ? "" : null,
      onclick: () => browse(name, st, Math.max(0, offset - PAGE)) }, "← Previous"),
    el("span", { class: "muted" }, doc.messages.length ? ` ${offset + 1}–${offset + doc.messages.length} ` : " "),
    el("button", { type: "button", id: "next", disabled: doc.next_offset === null ? "" : null,
      onclick: () => browse(name, st, doc.next_offset) }, "Next →"),
  );
}

async function details(name, id) {
  const box = document.getElementById("details");
  let m;
  try {
    m = await api("GET", `/API/v1/queues/${encodeURIComponent(name)}/messages/${id}`);
  } catch (e) {
    put(box, el("p", { class: "muted" }, e.message));
    return;
  }
  put(box, 
    el("h2", {}, `Message ${m.id}`),
    el("pre", { id: "message-json" }, JSON.stringify(m, null, 2)),
    el("div", { class: "actions" },
      el("button", { type: "button", id: "set-priority", onclick: () => setPriority(name, m) }, "Change priority"),
      el("button", { type: "button", class: "danger", id: "delete-message", onclick: () => removeMessage(name, m.id) }, "Delete message")),
  );
}

async function setPriority(name, m) {
  const raw = prompt(`New priority for message ${m.id} (now ${m.priority})`, String(m.priority));
  if (raw === null) return;
  try {
    await api("PUT", `/API/v1/queues/${encodeURIComponent(name)}/messages/${m.id}/priority`, { priority: Number(raw) });
    banner(`message ${m.id}: priority ${raw}`);
    await details(name, m.id);
    await browse(name, state.browse.state, state.browse.offset);
  } catch (e) { banner(`change priority: ${e.message}`, true); }
}

async function removeMessage(name, id) {
  if (!confirm(`Delete message ${id} of ${name}?`)) return;
  try {
    await api("DELETE", `/API/v1/queues/${encodeURIComponent(name)}/messages/${id}`);
    banner(`message ${id} deleted`);
    put(document.getElementById("details"), );
    await browse(name, state.browse.state, state.browse.offset);
  } catch (e) { banner(`delete: ${e.message}`, true); }
}

// -- redrive: move a dead-letter queue's messages back (a replicated task, paced) ----------
async function startRedrive(name) {
  const to = prompt(`Redrive the messages of ${name} to which queue? (empty: the queue that dead-letters into ${name})`, "");
  if (to === null) return;
  const rate = prompt("At most how many messages per second? (empty: no limit)", "");
  if (rate === null) return;
  const body = {};
  if (to.trim()) body.to = to.trim();
  if (rate.trim()) body.max_per_second = Number(rate.trim());
  try {
    const task = await api("POST", `/API/v1/queues/${encodeURIComponent(name)}/redrive`, body);
    banner(`redriving ${fmt(task.total)} messages of ${name} to ${task.to}`);
    showRedrive(name, task);
  } catch (e) { banner(`redrive: ${e.message}`, true); }
}

async function cancelRedrive(name) {
  try {
    showRedrive(name, await api("DELETE", `/API/v1/queues/${encodeURIComponent(name)}/redrive`));
  } catch (e) { banner(`cancel redrive: ${e.message}`, true); }
}

let redriveLoading = false;
async function loadRedrive(name) {
  if (redriveLoading) return;
  redriveLoading = true;
  try {
    showRedrive(name, await api("GET", `/API/v1/queues/${encodeURIComponent(name)}/redrive`));
  } catch (e) {
    if (!String(e.message).includes("REDRIVE_NOT_FOUND")) banner(`redrive: ${e.message}`, true);
  } finally {
    redriveLoading = false;
  }
}

function showRedrive(name, task) {
  state.redrives.set(name, task);
  const box = document.getElementById("redrive-box");
  if (!box || route().name !== name) return;
  const rate = task.max_per_second ? `${fmt(task.max_per_second)}/s` : "no limit";
  put(box, el("p", { id: "redrive-task", "data-state": task.state },
    `Redrive to ${task.to}: ${task.state}, ${fmt(task.moved)} of ${fmt(task.total)} moved, ${fmt(task.remaining)} left (${rate})`,
    task.reason ? ` — ${task.reason}` : "", " ",
    task.state === "running" ? el("button", { type: "button", id: "redrive-cancel", onclick: () => cancelRedrive(name) }, "Cancel") : null));
}

async function purge(name) {
  if (!confirm(`Remove every message of ${name}?`)) return;
  try {
    const doc = await api("POST", `/API/v1/queues/${encodeURIComponent(name)}/purge`);
    banner(`purged ${doc.purged} messages from ${name}`);
    await browse(name, state.browse.state, 0);
  } catch (e) { banner(`purge: ${e.message}`, true); }
}

async function renderCluster() {
  const view = document.getElementById("view");
  let doc, ready;
  try {
    doc = await api("GET", "/cluster");
  } catch (e) {
    put(view, el("h1", {}, "Cluster"), el("p", { class: "muted" }, e.message));
    return;
  }
  try {
    const r = await fetch("/readyz", { headers: headers() });
    ready = await r.json();
  } catch (e) { ready = null; }
  if (route().view !== "cluster") return;
  const addr = (m, k) => m[k] || (m.addrs || {})[k] || "–";
  // health fields are null where the answering node cannot know (a follower knows itself and its leader)
  const yesNo = (v) => (v === true ? "yes" : v === false ? "NO" : "?");
  const ago = (ms) => (ms === null || ms === undefined ? "?" : ms === 0 ? "–" : fmtAge(ms) + " ago");
  const cols = [["node", "Node"], ["role", "Role"], ["reachable", "Reachable"], ["contact", "Last contact"],
    ["match", "Match index"], ["lag", "Lag"], ["raft", "Raft"], ["grpc", "gRPC"], ["http", "HTTP"]];
  const rows = doc.members.map((m) => el("tr", { "data-member": m.node_id, class: m.reachable === false ? "bad" : "" },
    el("td", { "data-col": "node" }, m.node_id, m.node_id === doc.leader_id ? el("span", { class: "badge leader" }, " leader") : null),
    el("td", { "data-col": "role" }, m.role), el("td", { "data-col": "reachable" }, yesNo(m.reachable)),
    el("td", { "data-col": "contact" }, ago(m.last_contact_ms)),
    el("td", { "data-col": "match", class: "num" }, fmt(m.match_index)), el("td", { "data-col": "lag", class: "num" }, fmt(m.lag)),
    el("td", { "data-col": "raft" }, addr(m, "raft_addr")), el("td", { "data-col": "grpc" }, addr(m, "grpc_addr")),
    el("td", { "data-col": "http" }, addr(m, "http_addr"))));
  const s = doc.storage;
  const summary = [["leader", doc.leader_id || "none"], ["term", doc.term], ["commit", fmt(doc.commit_index)],
    ["applied", fmt(doc.applied_index)], ["cluster id", doc.cluster_id || "–"], ["this node", `${doc.node_id} (${doc.role})`],
    ["data used", s ? `${fmtBytes(s.used_bytes)} of ${fmtBytes(s.max_bytes)}` : "–"],
    ["disk free", s && s.disk_free_bytes !== null ? `${fmtBytes(s.disk_free_bytes)} (limit ${fmtBytes(s.disk_free_limit_bytes)})` : "–"]];
  const alarms = doc.alarms || [];
  put(view, 
    el("h1", {}, "Cluster"),
    el("div", { class: "cards", id: "cluster-cards" }, summary.map(([k, v]) => el("div", { class: "card", "data-card": k },
      el("div", { class: "v" }, v), el("div", { class: "k" }, k)))),
    el("h2", {}, "Members"),
    el("table", { id: "members" }, el("thead", {}, el("tr", {}, cols.map(([k, h]) => el("th", { "data-key": k }, h)))),
      el("tbody", {}, rows)),
    el("h2", {}, "Storage alarms"),
    alarms.length
      ? el("ul", { id: "alarms" }, alarms.map((a) => el("li", { class: "bad", "data-alarm": a.reason }, `${a.node_id} ${a.reason}: ${a.message}`)))
      : el("p", { class: "muted", id: "alarms" }, "None: writes are accepted."),
    el("h2", {}, "This node's readiness"),
    el("pre", { id: "readiness" }, ready ? JSON.stringify(ready, null, 2) : "unknown"),
  );
}

// -- start -----------------------------------------------------------------------------------
document.getElementById("key-button").addEventListener("click", () => showKeyForm());
document.querySelector("#key-form form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem("doq-key", document.getElementById("key-input").value.trim());
  document.getElementById("key-form").hidden = true;
  banner("");
  render(true);
});
document.getElementById("key-clear").addEventListener("click", () => { sessionStorage.removeItem("doq-key"); });
window.addEventListener("hashchange", () => render(true));
setInterval(() => { if (route().view === "cluster") renderCluster(); }, 2000);
render(true);
follow();

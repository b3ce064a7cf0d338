// The Entente dashboard (docs/dashboard.md). Read-only, no framework, no
// request to anything but this node's own API.
//
// Auth: the token (typed in the form, or given as #token=... in the URL
// fragment, which never reaches the server) is traded for a short-lived
// HttpOnly session cookie (POST /v1/ui/session); the REST calls carry the
// cookie. The token stays in this tab's memory only, to renew the session
// before it ends and to open the live tail's WebSocket with the
// subprotocols "entente.v1, entente.bearer.<token>".
//
// Data: live over a WebSocket (/v1/ui/live, the same subprotocols): the
// page names the REST resources it shows (nodes, peers, streams, queries,
// contracts, imports, each contract's usage) and the node pushes a snapshot
// of all of them every `pollMs`; each part is what the REST call would
// answer. Without that socket (closed, refused) the page reads the REST API
// itself every `pollMs` and tries the socket again. Rates are differences
// between two snapshots. The live tail of one stream is a subscription.
"use strict";

const state = {
  token: null,        // kept in memory only
  sessionTimer: null,
  pollTimer: null,
  pollMs: 2000,
  domain: "",
  node: "",
  prev: {},           // key -> {value, at}: for rates
  tail: null,         // {name, ws}
  tailLines: [],
  live: null,         // {ws, parts: the last snapshot's {path: {status, body}}, watch: [paths]}
  liveRetry: null,
  usagePaths: [],     // the usage of the contracts shown
};

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return e;
}

function svg(tag, attrs, ...children) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function stateCell(s) {
  return el("td", { class: "state-" + String(s || "").replace(/[^a-z_-]/g, "") }, s || "");
}

function num(n, digits) {
  if (n == null || Number.isNaN(n)) return "";
  if (digits !== undefined) return Number(n).toFixed(digits);
  return Number(n).toLocaleString("en");
}

function bytes(n) {
  if (n == null) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; ++i; }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}

// The change per second of `value` under `key` since the last read.
function rate(key, value) {
  const now = performance.now();
  const p = state.prev[key];
  state.prev[key] = { value, at: now };
  if (!p || now <= p.at || value < p.value) return null;
  return (value - p.value) / ((now - p.at) / 1000);
}

function fillTable(id, rows, empty) {
  const body = $(id + " tbody");
  body.replaceChildren(...rows);
  if (!rows.length) body.append(el("tr", { class: "empty" }, el("td", { colspan: "9", class: "muted" }, empty)));
}

// --- API

class ApiError extends Error {
  constructor(status, detail) { super(detail); this.status = status; }
}

async function api(path) {
  const part = state.live && state.live.parts && state.live.parts[path];
  if (part) {
    if (part.status === 401) throw new ApiError(401, "signed out");
    if (part.status === 404) return null;
    if (part.status >= 300) throw new ApiError(part.status, (part.body && part.body.detail) || String(part.status));
    return part.body;
  }
  const r = await fetch(path, { credentials: "same-origin", cache: "no-store" });
  if (r.status === 401) throw new ApiError(401, "signed out");
  if (r.status === 404) return null;  // e.g. no federation section: the part stays empty
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new ApiError(r.status, body.detail || r.statusText);
  return body;
}

async function openSession() {
  const r = await fetch("/v1/ui/session", {
    method: "POST",
    credentials: "same-origin",
    headers: { "Authorization": "Bearer " + state.token },
  });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new ApiError(r.status, body.detail || r.statusText);
  clearTimeout(state.sessionTimer);
  // Renewed at half its life, while the tab holds the token.
  state.sessionTimer = setTimeout(() => openSession().catch(signedOut), body.expires_in_s * 500);
  return body;
}

// --- the parts of the page

async function showHealth() {
  const h = await api("/v1/health");
  state.domain = h.domain;
  state.node = h.node;
  $("#where").textContent = `${h.domain}/${h.node} · ${h.version}`;
}

async function showNodes() {
  const n = await api("/v1/nodes");
  const rows = (n ? n.nodes : []).map((m) => el("tr", { "data-node": m.node },
    el("td", {}, m.node), stateCell(m.state), el("td", {}, m.role), el("td", {}, m.api), el("td", {}, m.peer || ""),
    el("td", { class: "num" }, m.load ? num(m.load.cpu, 2) : ""), el("td", {}, m.version)));
  fillTable("#nodes", rows, "no nodes");
}

async function showPeers() {
  const p = await api("/v1/peers");
  const rows = (p ? p.peers : []).map((x) => {
    const rin = rate("peer-in " + x.identity, x.bytes_in), rout = rate("peer-out " + x.identity, x.bytes_out);
    return el("tr", { "data-peer": x.identity },
      el("td", {}, x.identity), stateCell(x.state),
      el("td", { class: "num" }, x.rtt_us >= 0 ? num(x.rtt_us / 1000, 2) + " ms" : "–"),
      el("td", { class: "num" }, bytes(x.bytes_in)), el("td", { class: "num" }, bytes(x.bytes_out)),
      el("td", { class: "num" }, rin == null ? "" : bytes(Math.round(rin)) + "/s"),
      el("td", { class: "num" }, rout == null ? "" : bytes(Math.round(rout)) + "/s"),
      el("td", { class: "num" }, `${num(x.tuples_in)} / ${num(x.tuples_out)}`),
      el("td", { class: "error" }, x.refusal || x.last_error || ""));
  });
  fillTable("#peers", rows, p ? "no peers configured" : "this node has no federation section");
  const refused = p ? p.refused : [];
  $("#refused").textContent = refused.length
    ? "Refused: " + refused.map((r) => `${r.identity || r.address} (${r.refusal}, ${r.count}×)`).join(", ") : "";
}

async function showStreams() {
  const s = await api("/v1/streams");
  const rows = (s ? s.streams : []).map((x) => {
    const r = x.next_seq == null ? null : rate("stream " + x.name, x.next_seq);
    return el("tr", { "data-stream": x.name },
      el("td", {}, x.name), el("td", {}, x.node || ""), el("td", {}, x.producer || ""),
      el("td", { class: "num" }, num(x.tuples)), el("td", { class: "num" }, num(x.next_seq)),
      el("td", { class: "num rate" }, r == null ? "" : num(r, 1)),
      el("td", {}, el("button", { type: "button", onclick: () => startTail(x.name) }, "Tail")));
  });
  fillTable("#streams", rows, "no streams");
}

async function showQueries() {
  const q = await api("/v1/queries");
  const list = q ? q.queries : [];
  const host = $("#queries");
  host.replaceChildren(...list.map(queryView));
  if (!list.length) host.append(el("p", { class: "muted" }, "no queries"));
}

function queryView(q) {
  const lag = q.lag_tuples ? ` · lag ${num(q.lag_tuples)} tuples` : "";
  const cpu = q.load ? ` · ${num(q.load.cpu_ms_per_s, 1)} CPU ms/s` : "";
  return el("div", { class: "query", "data-query": q.name },
    el("h3", {}, q.name + " ", el("span", { class: "state-" + q.state }, q.state),
      el("span", { class: "muted" }, cpu + lag)),
    queryGraph(q));
}

// The query's network as boxes and arcs: its inputs on the left, each box
// in the column after the boxes it reads, its outputs on the right.
function queryGraph(q) {
  const net = q.network || {};
  const stats = new Map((q.boxes || []).map((b) => [b.id, b]));
  const vertices = new Map();  // id -> {kind, label, sub, col}
  for (const i of net.inputs || []) vertices.set(i.name, { kind: "stream", label: i.stream || i.name, sub: "input", col: 0 });
  for (const b of net.boxes || []) vertices.set(b.id, { kind: "box", label: b.id, sub: b.type, col: 1 });
  const arcs = (net.arcs || []).map((a) => [a.from, a.to]);
  for (const o of net.outputs || []) {
    const id = "out:" + o.name;
    vertices.set(id, { kind: "stream", label: (q.outputs || []).find((n) => n.endsWith(o.name)) || o.name, sub: "output", col: 1 });
    arcs.push([o.from, id]);
  }
  // Longest path from the inputs, bounded (a network is acyclic).
  for (let round = 0; round < vertices.size; ++round) {
    let moved = false;
    for (const [from, to] of arcs) {
      const a = vertices.get(from), b = vertices.get(to);
      if (a && b && b.col < a.col + 1) { b.col = a.col + 1; moved = true; }
    }
    if (!moved) break;
  }
  const W = 190, H = 64, GX = 60, GY = 18, M = 8;
  const rows = new Map();
  for (const v of vertices.values()) { v.row = rows.get(v.col) || 0; rows.set(v.col, v.row + 1); }
  const cols = Math.max(1, ...[...vertices.values()].map((v) => v.col + 1));
  const height = Math.max(1, ...rows.values()) * (H + GY) + 2 * M;
  const g = svg("svg", { class: "query-graph", width: cols * (W + GX) + 2 * M, height,
                         viewBox: `0 0 ${cols * (W + GX) + 2 * M} ${height}`, role: "img",
                         "aria-label": "query " + q.name });
  g.append(svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: "10", refY: "5",
    markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" }, svg("path", { d: "M0,0 L10,5 L0,10 z", fill: "#8a96a3" }))));
  const at = (v) => ({ x: M + v.col * (W + GX), y: M + v.row * (H + GY) });
  for (const [from, to] of arcs) {
    const a = vertices.get(from), b = vertices.get(to);
    if (!a || !b) continue;
    const p = at(a), r = at(b);
    const x1 = p.x + W, y1 = p.y + H / 2, x2 = r.x, y2 = r.y + H / 2;
    g.append(svg("path", { class: "arc", "data-from": from, "data-to": to, "marker-end": "url(#arrow)",
      d: `M${x1},${y1} C${x1 + GX / 2},${y1} ${x2 - GX / 2},${y2} ${x2},${y2}` }));
  }
  for (const [id, v] of vertices) g.append(vertexView(q, id, v, at(v), stats.get(id), W, H));
  return g;
}

function vertexView(q, id, v, p, s, W, H) {
  const where = s ? placementOf(s.placement) : "";
  const elsewhere = s && where && !where.startsWith(state.domain + "/");
  const g = svg("g", { class: v.kind + (elsewhere ? " elsewhere" : ""), "data-id": id, transform: `translate(${p.x},${p.y})` });
  g.append(svg("rect", { width: W, height: H, rx: 5 }));
  g.append(svg("text", { x: 8, y: 16, class: "title" }, v.label + "  ", svg("tspan", { class: "meta" }, v.sub)));
  if (v.kind === "stream" && v.sub === "input" && q.positions && q.positions[v.label] != null) {
    g.append(svg("text", { x: 8, y: 32, class: "meta" }, `read up to seq ${num(q.positions[v.label])}`));
  }
  if (s) {
    const cpu = (s.cpu_ns_per_tuple || 0) * (s.tuples_in_per_s || 0) / 1e6;
    g.append(svg("text", { x: 8, y: 32, class: "meta where" }, where));
    g.append(svg("text", { x: 8, y: 48, class: "rate" },
      `${num(s.tuples_in_per_s, 1)} in/s → ${num(s.tuples_out_per_s, 1)} out/s`));
    g.append(svg("text", { x: 8, y: 61, class: "meta" }, `CPU ${num(cpu, 2)} ms/s · ${num(s.tuples_out)} out`));
  }
  return g;
}

// A box's placement names its node ("n2"), another domain's node
// ("beta/n1"), or nothing (this node).
function placementOf(p) {
  if (!p || p === "local") return `${state.domain}/${state.node}`;
  return p.includes("/") ? p : `${state.domain}/${p}`;
}

function awaitingMe(c) {
  if (c.state !== "proposed" && c.state !== "countered") return false;
  const last = (c.history || [])[c.history.length - 1];
  return !!last && last.by !== state.domain;
}

function termsText(t) {
  if (!t) return "";
  if (t.kind === "stream" || t.streams)
    return `${(t.streams || []).join(", ")} · ${t.price_per_million} cr/M tuples`;
  return `${(t.box_kinds || []).join(", ")} · max ${t.max_load} ms/s · ${t.price_min}–${t.price_max} cr/CPU-s`;
}

async function showContracts() {
  const c = await api("/v1/contracts");
  const list = (c ? c.contracts : []).slice();
  // Those awaiting this domain's admin first, then the most recent.
  list.sort((a, b) => (awaitingMe(b) - awaitingMe(a)) || ((b.history || []).at(-1)?.at_ms - (a.history || []).at(-1)?.at_ms));
  const rows = list.map((k) => {
    const mine = awaitingMe(k);
    return el("tr", { "data-contract": k.id, class: mine ? "awaiting" : "" },
      el("td", {}, k.id, mine ? " " : "", mine ? el("span", { class: "badge" }, "your turn") : ""),
      el("td", {}, k.kind), el("td", {}, (k.parties || []).join(" ↔ ")), stateCell(k.state),
      el("td", { class: "num" }, k.version), el("td", {}, termsText(k.terms)),
      el("td", {}, (k.terms && k.terms.valid_until) || ""));
  });
  fillTable("#contracts", rows, c ? "no contracts" : "this node negotiates no contracts");
  await showUsage(list.filter((k) => k.state === "accepted" || k.in_force).slice(0, 20));
}

async function showUsage(list) {
  state.usagePaths = list.map((k) => `/v1/contracts/${encodeURIComponent(k.id)}/usage`);
  const usages = await Promise.all(state.usagePaths.map((p) => api(p).catch(() => null)));
  const rows = usages.filter(Boolean).map((u) => el("tr", { "data-usage": u.id },
    el("td", {}, u.id), el("td", {}, u.kind), el("td", { class: "num" }, num(u.tuples)),
    el("td", { class: "num" }, num(u.load_seconds, 2)),
    el("td", {}, u.kind === "stream" ? `${u.price_per_million} cr/M` : `${u.price_min}–${u.price_max} cr/s`),
    el("td", { class: "num" }, num(u.cost_credits, 4))));
  fillTable("#usage", rows, "no contract in force");
}

async function showImports() {
  const i = await api("/v1/imports");
  const rows = (i ? i.imports : []).map((x) => el("tr", { "data-import": x.stream },
    el("td", {}, x.stream), el("td", {}, x.owner), stateCell(x.state), el("td", { class: "num" }, num(x.tuples)),
    el("td", { class: "num" }, num(x.next_seq)), el("td", { class: "error" }, x.reason || "")));
  fillTable("#imports", rows, "no imports");
}

async function refresh() {
  const parts = [showNodes, showPeers, showStreams, showQueries, showContracts, showImports];
  const results = await Promise.allSettled(parts.map((f) => f()));
  const failed = results.filter((r) => r.status === "rejected").map((r) => r.reason);
  if (failed.some((e) => e instanceof ApiError && e.status === 401)) {
    // The session ended (a restart, or the tab slept): renew once.
    try { await openSession(); } catch (e) { signedOut(e); return; }
  }
  const t = new Date().toLocaleTimeString();
  const how = state.live && state.live.parts ? "live (WebSocket)" : `polling every ${state.pollMs / 1000} s`;
  $("#status").textContent = failed.length ? `${how} · updated ${t}; ${failed[0].message}` : `${how} · updated ${t}`;
  if (state.live && state.live.ws.readyState === WebSocket.OPEN) watchAll();
  $("#status").className = failed.length ? "error" : "muted";
}

// --- live updates (WebSocket /v1/ui/live)

const BASE_PATHS = ["/v1/nodes", "/v1/peers", "/v1/streams", "/v1/queries", "/v1/contracts", "/v1/imports"];

function wsUrl(path) {
  return `${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}${path}`;
}

function protocols() {
  const p = ["entente.v1"];
  if (state.token && TOKEN_CHARS.test(state.token)) p.push("entente.bearer." + state.token);
  return p;
}

// Tells the node what to push, when that changed (a contract came or went).
function watchAll() {
  const watch = BASE_PATHS.concat(state.usagePaths).slice(0, 32);
  if (state.live.watch && state.live.watch.join() === watch.join()) return;
  state.live.watch = watch;
  state.live.ws.send(JSON.stringify({ watch, interval_ms: state.pollMs }));
}

function startLive() {
  stopLive();
  const ws = new WebSocket(wsUrl("/v1/ui/live"), protocols());
  state.live = { ws, parts: null, watch: null };
  ws.onopen = () => watchAll();
  ws.onmessage = (ev) => {
    const m = JSON.parse(ev.data);
    if (m.type !== "snapshot" || !state.live || state.live.ws !== ws) return;
    state.live.parts = m.parts;
    clearInterval(state.pollTimer);  // the node pushes now
    state.pollTimer = null;
    refresh();
  };
  ws.onclose = (ev) => {
    if (!state.live || state.live.ws !== ws) return;
    state.live = null;
    if (ev.code === 4401) { signedOut(new ApiError(401, "the token no longer authenticates")); return; }
    // Back to polling, and the socket again in 5 s.
    if (!state.pollTimer) state.pollTimer = setInterval(refresh, state.pollMs);
    state.liveRetry = setTimeout(startLive, 5000);
  };
}

function stopLive() {
  clearTimeout(state.liveRetry);
  if (state.live) { const ws = state.live.ws; state.live = null; ws.close(1000); }
}

// --- the live tail (WebSocket)

// Subprotocol values are HTTP tokens: a token with other characters is not
// offered (the session cookie then authenticates the subscription).
const TOKEN_CHARS = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

function startTail(name) {
  stopTail();
  const ws = new WebSocket(wsUrl(`/v1/streams/${encodeURIComponent(name)}/subscribe?from=0`), protocols());
  state.tail = { name, ws };
  state.tailLines = [];
  $("#tail-section").hidden = false;
  $("#tail-name").textContent = name;
  $("#tail").textContent = "";
  $("#tail-status").textContent = "connecting…";
  ws.onopen = () => { $("#tail-status").textContent = `subscribed (${ws.protocol})`; };
  ws.onmessage = (ev) => {
    for (const line of String(ev.data).split("\n")) if (line) state.tailLines.push(line);
    state.tailLines = state.tailLines.slice(-30);
    $("#tail").textContent = state.tailLines.join("\n");
  };
  ws.onclose = (ev) => {
    if (state.tail && state.tail.ws === ws) $("#tail-status").textContent = `closed (${ev.code}${ev.reason ? ": " + ev.reason : ""})`;
  };
}

function stopTail() {
  if (state.tail) state.tail.ws.close(1000);
  state.tail = null;
  $("#tail-section").hidden = true;
}

// --- sign in and out

async function signIn(token, options) {
  state.token = token;
  await openSession();
  $("#login").hidden = true;
  $("#dashboard").hidden = false;
  $("#logout").hidden = false;
  await showHealth();
  await refresh();
  clearInterval(state.pollTimer);
  state.pollTimer = setInterval(refresh, state.pollMs);
  startLive();
  if (options.tail) startTail(options.tail);
}

function signedOut(err) {
  stopLive();
  clearInterval(state.pollTimer);
  clearTimeout(state.sessionTimer);
  stopTail();
  state.token = null;
  $("#dashboard").hidden = true;
  $("#logout").hidden = true;
  $("#login").hidden = false;
  $("#status").textContent = "not signed in";
  $("#login-error").textContent = err && err.message ? err.message : "";
}

// #token=...&tail=STREAM&poll=MS, for scripted use; the fragment is
// removed from the address bar at once.
function fragmentOptions() {
  const p = new URLSearchParams(location.hash.slice(1));
  if (location.hash) history.replaceState(null, "", location.pathname + location.search);
  const poll = Number(p.get("poll"));
  if (poll >= 250 && poll <= 60000) state.pollMs = poll;
  return { token: p.get("token"), tail: p.get("tail") };
}

function main() {
  const options = fragmentOptions();
  $("#login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const t = $("#token").value;
    $("#token").value = "";
    signIn(t, options).catch(signedOut);
  });
  $("#logout").addEventListener("click", () => {
    fetch("/v1/ui/session", { method: "DELETE", credentials: "same-origin" }).finally(() => signedOut(null));
  });
  $("#tail-stop").addEventListener("click", stopTail);
  if (options.token) signIn(options.token, options).catch(signedOut);
}

main();

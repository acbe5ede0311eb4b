// loopwarden runs board: plain JavaScript, no framework, nothing fetched from elsewhere.
// Reads the board's server-sent events with fetch (so the token travels in the Authorization
// header, never in a URL) and renders with DOM calls (run ids are data, never markup).
"use strict";

const DOCS = document.querySelector('meta[name="lw-docs"]').content;
const AUTH = document.querySelector('meta[name="lw-auth"]').content === "token";
const KEY = "loopwarden-board-token";
const $ = (id) => document.getElementById(id);

let meta = null;          // /api/meta: states, attention states, actions
let clockSkew = 0;        // server now - local now (ms)
let current = null;       // the AbortController of the open stream
let last = null;          // the last snapshot
let retry = 500;

function token() { return sessionStorage.getItem(KEY) || ""; }
function headers() { return AUTH ? { Authorization: "Bearer " + token() } : {}; }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "text") node.textContent = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

function docLink(state) { return DOCS + "#" + state.toLowerCase(); }

function badge(state) {
  if (!state) return el("span", { class: "muted", text: "—" });
  return el("a", { class: "state s-" + state, href: docLink(state), title: "What " + state + " means and what to do",
                   text: state });
}

function duration(s) {
  s = Math.max(0, Math.floor(s));
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
  if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
}

function inState(sinceTs) { return duration((Date.now() + clockSkew - sinceTs) / 1000); }
function isoTime(ts) {
  if (ts === null || ts === undefined) return "—";
  try { return new Date(ts).toISOString().replace(".000Z", "Z"); } catch (e) { return String(ts); }
}

function setStatus(text, cls) { const s = $("status"); s.textContent = text; s.className = cls || ""; }

function show(section) {
  for (const id of ["login", "board", "run"]) $(id).hidden = id !== section;
}

const PAGE = 200;
let boardFilters = { view: "open", state: "", agent: "", reason: "", page: 1 };  // the list's, kept in the URL

// The URL holds what the page shows: #/run/<id>, or #/?view=&state=&agent=&reason=&page= for the list.
function route() {
  const m = location.hash.match(/^#\/run\/(.+)$/);
  if (m) return { run: decodeURIComponent(m[1]), filters: boardFilters };
  const q = new URLSearchParams(location.hash.startsWith("#/?") ? location.hash.slice(3) : "");
  const page = parseInt(q.get("page") || "1", 10);
  boardFilters = { view: q.get("view") === "closed" ? "closed" : "open", state: q.get("state") || "",
                   agent: q.get("agent") || "", reason: q.get("reason") || "", page: page > 0 ? page : 1 };
  return { run: null, filters: boardFilters };
}

function boardHash(f) {
  const q = new URLSearchParams();
  if (f.view && f.view !== "open") q.set("view", f.view);
  for (const k of ["state", "agent", "reason"]) if (f[k]) q.set(k, f[k]);
  if (f.page && f.page > 1) q.set("page", String(f.page));
  const text = q.toString();
  return "#/" + (text ? "?" + text : "");
}

function formFilters() {
  return { view: $("filter-view").value, state: $("filter-state").value, agent: $("filter-agent").value,
           reason: $("filter-reason").value.trim(), page: 1 };
}

function requestId() {  // a fresh id per click: a double click is one request (crypto.randomUUID needs https)
  const b = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

async function post(path, body) {
  const res = await fetch(path, { method: "POST", cache: "no-store",
                                  headers: { ...headers(), "Content-Type": "application/json" },
                                  body: JSON.stringify(body) });
  let data = {};
  try { data = await res.json(); } catch (e) { /* not JSON: the status says it */ }
  if (!res.ok) throw new Error(data.error || ("HTTP " + res.status));
  return data;
}

// -- the stream ------------------------------------------------------------------------
async function connect() {
  if (current) current.abort();
  const ctrl = new AbortController();
  current = ctrl;
  const { run, filters } = route();
  const params = new URLSearchParams();
  for (const k of ["state", "agent", "reason"]) if (filters[k]) params.set(k, filters[k]);
  if (filters.view !== "open") params.set("view", filters.view);
  params.set("offset", String((filters.page - 1) * PAGE));
  params.set("limit", String(PAGE));
  if (run) params.set("run", run);
  $("filter-view").value = filters.view;
  $("filter-state").value = filters.state;
  $("filter-reason").value = filters.reason;
  $("run-back").href = boardHash(filters);
  show(run ? "run" : "board");
  try {
    if (!meta) {
      const r = await fetch("api/meta", { headers: headers(), cache: "no-store", signal: ctrl.signal });
      if (r.status === 401) return needToken();
      meta = await r.json();
      fillStateFilter();
      fillActions();
    }
    const res = await fetch("api/stream?" + params, { headers: headers(), cache: "no-store", signal: ctrl.signal });
    if (res.status === 401) return needToken();
    if (!res.ok) throw new Error("HTTP " + res.status);
    retry = 500;
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
        if (data) onSnapshot(JSON.parse(data));
      }
    }
    throw new Error("stream closed");
  } catch (e) {
    if (ctrl.signal.aborted) return;
    setStatus("Disconnected (" + e.message + "): retrying…", "down");
    setTimeout(() => { if (current === ctrl) connect(); }, retry);
    retry = Math.min(retry * 2, 10000);
  }
}

function needToken() {
  if (current) current.abort();
  current = null;
  show("login");
  setStatus("Sign in to see the board", "down");
  if (token()) $("login-error").textContent = "That token was refused.";
  $("token").focus();
}

// -- rendering ----------------------------------------------------------------------------
function onSnapshot(data) {
  last = data;
  clockSkew = data.now_ts - Date.now();
  setStatus("Live · " + data.runs + " runs · updated " + new Date().toLocaleTimeString(), "live");
  if (route().run) renderRun(data.run, route().run); else renderBoard(data);
}

function fillStateFilter() {
  const select = $("filter-state");
  select.replaceChildren(el("option", { value: "", text: "every state" }),
                         ...meta.attention.map((s) => el("option", { value: s, text: s })));
  select.value = boardFilters.state;
}

function canAct() { return !!(meta && meta.acting && meta.user); }

function fillActions() {
  $("run-act-user").textContent = meta.user || "";
  $("group-action").replaceChildren(...meta.operator_actions.map((a) => el("option", { value: a, text: a })));
  $("act-buttons").replaceChildren(...meta.operator_actions.map((a) =>
    el("button", { type: "button", "data-action": a, id: "act-" + a, text: a[0].toUpperCase() + a.slice(1) })));
  for (const b of $("act-buttons").querySelectorAll("button")) b.addEventListener("click", () => actOnRun(b.dataset.action));
}

async function actOnRun(action) {
  const id = route().run, reason = $("act-reason").value.trim(), out = $("act-result");
  if (!reason) { out.textContent = "Give a reason first (it is kept with the action)."; out.className = "error"; $("act-reason").focus(); return; }
  out.className = ""; out.textContent = "Sending " + action + "…";
  try {
    const d = await post("api/runs/" + encodeURIComponent(id) + "/act",
                         { action, reason, override_bound: action === "retry" && $("act-override").checked, request_id: requestId() });
    out.textContent = "Published " + action + " as " + meta.user + " (request " + d.request_ids[0] + "): the worker applies it.";
    out.dataset.published = action;
  } catch (e) { out.className = "error"; out.textContent = "Nothing was done: " + e.message; }
}

async function actOnGroup(e) {
  e.preventDefault();
  const f = route().filters, out = $("group-act-result"), action = $("group-action").value;
  const reason = $("group-reason").value.trim();
  if (!reason) { out.className = "error"; out.textContent = "Give a reason first."; return; }
  const match = {};
  for (const k of ["state", "agent", "reason"]) if (f[k]) match[k] = f[k];
  out.className = ""; out.textContent = "Sending…";
  try {
    const d = await post("api/act", { match, action, reason });
    out.textContent = "Published " + d.published + " " + action + " actions as " + meta.user + ", one per run.";
  } catch (err) { out.className = "error"; out.textContent = "Nothing was done: " + err.message; }
}

async function findRun(e) {
  e.preventDefault();
  const q = $("find-id").value.trim(), out = $("find-result");
  if (!q) return;
  try {
    const r = await fetch("api/find?q=" + encodeURIComponent(q), { headers: headers(), cache: "no-store" });
    const d = await r.json();
    if (!r.ok) throw new Error(d.error || ("HTTP " + r.status));
    if (d.runs.length === 1 && d.runs[0] === q) { location.hash = "#/run/" + encodeURIComponent(q); return; }
    out.replaceChildren(d.runs.length ? "Runs starting with it: " : "No run with that id on the board (never seen, or aged out).",
      ...d.runs.map((id) => el("a", { href: "#/run/" + encodeURIComponent(id), class: "found" }, el("code", { text: id }))));
  } catch (err) { out.textContent = "Could not search: " + err.message; }
}

function renderBoard(d) {
  const counts = $("counts").tBodies[0];
  counts.replaceChildren(...d.states.map((s) => el("tr", { "data-state": s },
    el("th", { scope: "row" }, badge(s)),
    el("td", { class: "num", text: String(d.by_state[s]) }),
    el("td", { class: "num", text: String(d.hour_by_state[s]) }))));

  const agents = $("filter-agent");
  const chosen = route().filters.agent;
  const names = d.by_agent.map((a) => a.agent);
  if (chosen && !names.includes(chosen)) names.push(chosen);
  const have = Array.from(agents.options).slice(1).map((o) => o.value);
  if (have.join("\u0000") !== names.join("\u0000")) {
    agents.replaceChildren(el("option", { value: "", text: "every agent" }),
                           ...names.map((n) => el("option", { value: n, text: n })));
  }
  agents.value = chosen;

  const f = route().filters;
  $("groups").tBodies[0].replaceChildren(...d.groups.map((g) => el("tr", { "data-agent": g.agent, "data-state": g.state, "data-reason": g.reason },
    el("td", { text: g.agent }), el("td", {}, badge(g.state)), el("td", { text: g.reason }),
    el("td", { class: "num", text: String(g.runs) }),
    el("td", {}, el("a", { href: boardHash({ view: "open", state: g.state, agent: g.agent, reason: g.reason, page: 1 }),
                           class: "group-link", text: "List these" })))));
  $("groups-total").textContent = "(" + d.groups_total + " groups" + (d.groups_total > d.groups.length ? ", the largest " + d.groups.length + " shown" : "") + ")";
  const first = d.matched ? d.offset + 1 : 0, lastRow = d.offset + d.attention.length;
  $("page-info").textContent = "rows " + first + "–" + lastRow + " of " + d.matched;
  $("page-prev").hidden = f.page <= 1;
  $("page-prev").href = boardHash({ ...f, page: f.page - 1 });
  $("page-next").hidden = lastRow >= d.matched;
  $("page-next").href = boardHash({ ...f, page: f.page + 1 });
  const filtered = !!(f.state || f.agent || f.reason);
  $("group-act").hidden = !(canAct() && f.view === "open" && filtered && d.matched > 0);
  $("group-act-count").textContent = "(" + d.matched + " runs)";

  const rows = d.attention.map((r) => el("tr", { "data-run-id": r.run_id, "data-state": r.state },
    el("td", {}, el("a", { href: "#/run/" + encodeURIComponent(r.run_id), class: "run-link" }, el("code", { text: r.run_id }))),
    el("td", {}, badge(r.state)),
    el("td", { class: "age", "data-since": String(r.since_ts), text: inState(r.since_ts) }),
    el("td", { text: r.closed ? r.reason + " · " + r.closed.action + " by " + r.closed.decided_by + ": " + r.closed.reason : r.reason }),
    el("td", { text: r.agent || "—" }),
    el("td", {}, el("time", { datetime: isoTime(r.since_ts), text: isoTime(r.since_ts) }))));
  $("attention").tBodies[0].replaceChildren(...rows);
  $("attention-empty").hidden = rows.length > 0;
  $("attention-empty").textContent = f.view === "closed" ? "No run was abandoned or acknowledged." : "No run needs a person.";
  $("attention-total").textContent = "(" + d.attention_total + " in all; " + d.closed_total + " abandoned or acknowledged)";

  const summary = (counts) => Object.entries(counts).filter(([, n]) => n).map(([s, n]) => s + " " + n).join(", ") || "—";
  $("agents").tBodies[0].replaceChildren(...d.by_agent.map((a) => el("tr", {},
    el("th", { scope: "row", text: a.agent }), el("td", { text: summary(a.now) }), el("td", { text: summary(a.hour) }))));
}

function fact(dl, name, value) {
  dl.append(el("dt", { text: name }), el("dd", {}, value instanceof Node ? value : document.createTextNode(value)));
}

const KNOWN = new Set(["reported_cause", "derived_cause", "fired", "disagreements", "receipt_ids", "approval",
                       "step_count", "segments", "tool_errors", "finish_reason", "untrusted_receipt_ids"]);

function list(v) { return v && v.length ? v.join(", ") : "none"; }

function renderRun(run, id) {
  $("run-id").textContent = id;
  $("run-missing").hidden = !!run;
  $("run-body").hidden = !run;
  if (!run) return;
  $("run-state").replaceChildren(badge(run.state));
  $("run-age").textContent = inState(run.since_ts) + " (since " + isoTime(run.since_ts) + ")";
  $("run-age").dataset.since = String(run.since_ts);
  $("run-reason").textContent = run.reason;
  $("run-agent").textContent = run.agent || "—";
  $("run-action").textContent = run.action;
  $("run-doc").href = docLink(run.state);
  $("run-doc").textContent = "About " + run.state + " (docs/states.md)";
  $("run-act").hidden = !(canAct() && run.needs_person);
  $("run-job").textContent = run.job_id ? "(job " + run.job_id + ")" : "(the run is its job's only attempt)";
  $("run-attempts").tBodies[0].replaceChildren(...run.attempts.map((a) => el("tr", { "data-attempt": String(a.attempt) },
    el("td", { class: "num", text: String(a.attempt) }),
    el("td", {}, a.run_id === id ? el("code", { text: a.run_id }) : el("a", { href: "#/run/" + encodeURIComponent(a.run_id) }, el("code", { text: a.run_id }))),
    el("td", {}, a.state ? badge(a.state) : el("span", { class: "muted", text: "not on the board" })),
    el("td", { text: isoTime(a.since_ts) }))));
  $("run-actions").tBodies[0].replaceChildren(...run.actions.map((a) => el("tr", { "data-action-id": a.action_id },
    el("td", { text: a.action + (a.override_bound ? " (beyond the bound)" : "") }), el("td", { text: a.decided_by }),
    el("td", { text: a.reason }), el("td", { text: isoTime(a.ts) }),
    el("td", { text: String(a.attempt) + (a.next_attempt ? " → " + a.next_attempt : "") }))));
  if (!run.actions.length) $("run-actions").tBodies[0].append(el("tr", {}, el("td", { colspan: "5", class: "muted", text: "None yet." })));
  const items = run.transitions.slice().reverse().map((t) => {
    const ev = t.evidence || {};
    const dl = el("dl");
    fact(dl, "Reason", t.reason);
    fact(dl, "At", isoTime(t.ts) + " (" + t.ts + " ms)");
    fact(dl, "Reported cause", ev.reported_cause || "—");
    fact(dl, "Derived cause", ev.derived_cause || "—");
    fact(dl, "Fired conditions", list(ev.fired));
    fact(dl, "Disagreements", list(ev.disagreements));
    fact(dl, "Receipts", list(ev.receipt_ids));
    if (ev.untrusted_receipt_ids && ev.untrusted_receipt_ids.length) {  // docs/receipts.md: kept, never counted
      fact(dl, "Untrusted receipts (not counted)", list(ev.untrusted_receipt_ids));
    }
    const ap = ev.approval;
    fact(dl, "Approval", ap ? ("tool " + ap.tool_name + ", owner " + (ap.owner || "none (unrouted)") +
                               ", deadline " + (ap.deadline_ts ? isoTime(ap.deadline_ts) : "none")) : "none");
    fact(dl, "Steps · segments · tool errors", ev.step_count + " · " + ev.segments + " · " + ev.tool_errors);
    fact(dl, "Finish reason", ev.finish_reason || "—");
    fact(dl, "Policy", t.policy_version || "—");
    for (const [k, v] of Object.entries(ev)) {  // evidence fields this page does not know yet: as they are
      if (!KNOWN.has(k) && v !== null && !(typeof v === "object" && Object.keys(v).length === 0)) fact(dl, k, JSON.stringify(v));
    }
    const head = el("p", {}, el("strong", { text: "#" + t.seq + " " }), badge(t.from_state),
                    document.createTextNode(" → "), badge(t.to_state));
    return el("li", { "data-seq": String(t.seq) }, head, dl);
  });
  $("run-transitions").replaceChildren(...items);
}

setInterval(() => {
  for (const td of document.querySelectorAll("[data-since]")) {
    const since = Number(td.dataset.since);
    td.textContent = td.id === "run-age" ? inState(since) + " (since " + isoTime(since) + ")" : inState(since);
  }
}, 1000);

// -- wiring -------------------------------------------------------------------------------
document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(KEY, $("token").value);
    $("login-error").textContent = "";
    meta = null;
    connect();
  });
  const refilter = () => { location.hash = boardHash(formFilters()); };
  for (const id of ["filter-view", "filter-state", "filter-agent", "filter-reason"]) $(id).addEventListener("change", refilter);
  $("filters").addEventListener("submit", (e) => { e.preventDefault(); refilter(); });
  $("find").addEventListener("submit", findRun);
  $("group-act").addEventListener("submit", actOnGroup);
  window.addEventListener("hashchange", () => { connect(); $("main").focus(); });
  if (AUTH && !token()) needToken(); else connect();
});

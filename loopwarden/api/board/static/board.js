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

function route() {
  const m = location.hash.match(/^#\/run\/(.+)$/);
  return m ? { run: decodeURIComponent(m[1]) } : { run: null };
}

// -- the stream ------------------------------------------------------------------------
async function connect() {
  if (current) current.abort();
  const ctrl = new AbortController();
  current = ctrl;
  const { run } = route();
  const params = new URLSearchParams();
  const state = $("filter-state").value, agent = $("filter-agent").value;
  if (state) params.set("state", state);
  if (agent) params.set("agent", agent);
  if (run) params.set("run", run);
  show(run ? "run" : "board");
  try {
    if (!meta) {
      const r = await fetch("api/meta", { headers: headers(), cache: "no-store", signal: ctrl.signal });
      if (r.status === 401) return needToken();
      meta = await r.json();
      fillStateFilter();
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
  for (const s of meta.attention) select.append(el("option", { value: s, text: s }));
}

function renderBoard(d) {
  const counts = $("counts").tBodies[0];
  counts.replaceChildren(...d.states.map((s) => el("tr", { "data-state": s },
    el("th", { scope: "row" }, badge(s)),
    el("td", { class: "num", text: String(d.by_state[s]) }),
    el("td", { class: "num", text: String(d.hour_by_state[s]) }))));

  const agents = $("filter-agent");
  const chosen = agents.value;
  const names = d.by_agent.map((a) => a.agent);
  if (chosen && !names.includes(chosen)) names.push(chosen);
  const have = Array.from(agents.options).slice(1).map((o) => o.value);
  if (have.join("\u0000") !== names.join("\u0000")) {
    agents.replaceChildren(el("option", { value: "", text: "every agent" }),
                           ...names.map((n) => el("option", { value: n, text: n })));
    agents.value = chosen;
  }

  const rows = d.attention.map((r) => el("tr", { "data-run-id": r.run_id, "data-state": r.state },
    el("td", {}, el("a", { href: "#/run/" + encodeURIComponent(r.run_id), class: "run-link" }, el("code", { text: r.run_id }))),
    el("td", {}, badge(r.state)),
    el("td", { class: "age", "data-since": String(r.since_ts), text: inState(r.since_ts) }),
    el("td", { text: r.reason }),
    el("td", { text: r.agent || "—" }),
    el("td", {}, el("time", { datetime: isoTime(r.since_ts), text: isoTime(r.since_ts) }))));
  $("attention").tBodies[0].replaceChildren(...rows);
  $("attention-empty").hidden = rows.length > 0;
  $("attention-total").textContent = "(" + d.attention_total + " in all)";

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
  $("filter-state").addEventListener("change", connect);
  $("filter-agent").addEventListener("change", connect);
  window.addEventListener("hashchange", () => { connect(); $("main").focus(); });
  if (AUTH && !token()) needToken(); else connect();
});

// The home around the conversation: the banner that says in words why the
// agent cannot run (and the control that undoes it), the views, and the
// panels — Discord conversations and attention items, the behavior
// release and its diffs, history search and summaries, jobs, and the child
// agents under this session.
"use strict";

// --- views ----------------------------------------------------------------------

let view = new URLSearchParams(location.search).get("view") === "lanes" ? "lanes" : "conversation";

function setView(v) {
  view = v;
  const lanes = v === "lanes";
  if (lanes) buildLanes();
  $("#lanes").hidden = !lanes;
  $("#conv").hidden = lanes;
  $("#view-conv").setAttribute("aria-pressed", String(!lanes));
  $("#view-lanes").setAttribute("aria-pressed", String(lanes));
  document.body.dataset.view = v;
  const q = new URLSearchParams(location.search);
  if (lanes) q.set("view", "lanes"); else q.delete("view");
  const qs = q.toString();
  history.replaceState(null, "", location.pathname + (qs ? "?" + qs : ""));
  if (!lanes) conv.list.scrollToEnd();
  // The lanes want the width; the panels come back with the conversation.
  if (!phone()) togglePanels(!lanes);
}

function phone() { return window.matchMedia("(max-width: 760px)").matches; }

function togglePanels(show) {
  const home = $("#home");
  const open = show === undefined ? home.dataset.panels === "off" : show;
  home.dataset.panels = open ? "on" : "off";
  $("#btn-panels").setAttribute("aria-expanded", String(open));
  if (open) refreshPanels();
  conv.list.schedule();
}

function toggleControls() {
  const c = $("#controls");
  const collapsed = c.dataset.collapsed !== "true";
  c.dataset.collapsed = String(collapsed);
  $("#btn-controls").setAttribute("aria-expanded", String(!collapsed));
  conv.list.schedule();
}

// --- banner ---------------------------------------------------------------------
// One banner, in words, for what stops the agent: no route, the route down
// (retrying at a time), a request the route rejects, storage failing; and
// for a paused or stopped session, with the button that undoes it.

let bannerState = null; // what the last status said

function updateBanner(st, s) {
  bannerState = { st, s };
  drawBanner();
}

function drawBanner() {
  const b = $("#banner");
  if (!bannerState) { b.hidden = true; return; }
  const { st, s } = bannerState;
  const msgs = [];
  if (st.storage) {
    msgs.push({ cls: "bad", kind: "storage", text: `Storage is failing (since ${clock(Date.parse(st.storage.since))}): ${st.storage.reason}. New work waits; klbr goes on by itself once writes succeed.` });
  }
  if (typeof st.agent === "string" && st.agent.startsWith("not running")) {
    const why = st.agent.replace(/^not running:\s*/, "");
    const noRoute = /no \[routes\./.test(why);
    msgs.push({ cls: "bad", kind: noRoute ? "no-route" : "agent", text: noRoute
      ? `No one will answer: the agent has no model route (${why}). Messages you send are kept and answered once a route is configured and klbr-core restarts.`
      : `The agent cannot run: ${why}.` });
  }
  if (s && s.retry) {
    const r = s.retry;
    const at = deadlineMs(r.next_at);
    const left = at - Date.now();
    const when = at ? `${clock(at)} (${left > 0 ? "in " + duration(left) : "now"})` : "soon";
    if (r.state === "spend_cap") {
      msgs.push({ cls: "warn", kind: "spend-cap", text: `No new model request starts: ${r.last_error}. The session resumes by itself at ${when}; inputs are still admitted. Raise the cap in the Spend panel (or klbr-core spend cap) to resume now.` });
    } else if (r.state === "retrying") {
      msgs.push({ cls: "warn", kind: "route-down", text: `The model route ${r.route || ""} is not answering${r.url ? " (" + r.url + ")" : ""}: ${r.last_error}. klbr retries by itself at ${when}; ${plural(r.in_a_row, "attempt")} failed in a row.` });
    } else {
      msgs.push({ cls: "bad", kind: "rejected", text: `The model route ${r.route || ""} rejected the request: ${r.last_error}.${r.fix ? " Fix: " + r.fix + "." : ""} Retrying will not help; the next input after ${when} starts a new attempt.` });
    }
  }
  if (s && (s.state === "paused" || s.state === "stopped")) {
    msgs.push({ cls: s.state === "paused" ? "warn" : "bad", kind: "session-" + s.state,
      text: `Session ${SESSION} is ${s.state}${s.state_reason ? ": " + s.state_reason : ""}. Inputs are kept; the agent does nothing until it is started.`,
      action: { label: "Start the session", send: { type: "session_start" } } });
  } else if (s && s.draining) {
    msgs.push({ cls: "warn", kind: "draining", text: `Session ${SESSION} is draining: accepted work finishes, then it stops.` });
  }
  b.replaceChildren();
  b.hidden = msgs.length === 0;
  for (const m of msgs) {
    const line = el("div", "banner-line " + m.cls);
    line.dataset.kind = m.kind;
    line.appendChild(el("span", "banner-text", m.text));
    if (m.action) {
      const btn = el("button", "banner-action", m.action.label);
      btn.type = "button";
      btn.addEventListener("click", () => sendControl(m.action.send));
      line.appendChild(btn);
    }
    b.appendChild(line);
  }
  // The box says it too, where the message is typed.
  const noOne = msgs.some((m) => m.kind === "no-route" || m.kind === "agent");
  $("#composer").placeholder = noOne ? "The agent is not running: what you send is kept until it is"
    : "Message the agent — Enter sends, Shift+Enter for a new line, ? for keys";
}

// --- Discord ----------------------------------------------------------------------

let discordOpen = null; // the alias whose log is shown
const conversationCounts = new Map(); // alias → {key, messages}: the last list's counts

// The unread count is per browser: the messages a conversation had when
// this browser last opened it are kept in localStorage.
function seenCount(key) {
  try { return parseInt(localStorage.getItem("klbr.seen." + SESSION + "." + key), 10) || 0; } catch (_) { return 0; }
}
function markSeen(alias) {
  const c = conversationCounts.get(alias);
  if (!c) return;
  try { localStorage.setItem("klbr.seen." + SESSION + "." + c.key, String(c.messages)); } catch (_) { /* private mode: no unread counts */ }
}
const discordNames = new Map(); // conversation key (discord:<channel id>) → "d1 · #general"

async function getJSON(url) {
  const res = await fetch(url, { credentials: "same-origin", cache: "no-store" });
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(body.error || `${res.status}`);
  return body;
}

function kindLabel(c) {
  if (c.kind === "dm") return "DM";
  return (c.kind === "thread" ? "thread " : "#") + (c.name || c.channel_id);
}

async function refreshDiscord() {
  let v;
  try { v = await getJSON(`/v2/discord?session=${encodeURIComponent(SESSION)}`); } catch (e) {
    $("#discord-convs").replaceChildren(el("p", "meta", `cannot load: ${e.message}`));
    return;
  }
  const list = $("#discord-convs");
  list.replaceChildren();
  if (!v.conversations.length) list.appendChild(el("p", "meta", "no Discord conversation yet"));
  let waiting = 0;
  let named = false;
  for (const c of v.conversations) {
    const name = `${c.alias} · ${kindLabel(c)}`;
    if (discordNames.get(c.key) !== name) { discordNames.set(c.key, name); named = true; }
    waiting += c.pending;
    const row = el("button", "conv-row");
    row.type = "button";
    row.setAttribute("role", "listitem");
    row.dataset.alias = c.alias;
    const unread = Math.max(0, (c.messages || 0) - seenCount(c.key));
    conversationCounts.set(c.alias, { key: c.key, messages: c.messages || 0 });
    row.setAttribute("aria-label", `${c.alias}, ${kindLabel(c)}${unread ? ", " + unread + " unread" : ""}${c.pending ? ", " + plural(c.pending, "message") + " waiting for attention" : ""}`);
    row.appendChild(el("span", "alias", c.alias));
    row.appendChild(el("span", "cname", kindLabel(c)));
    if (unread) { const u = el("span", "unread", `${unread} unread`); u.title = "admitted since this browser last opened the conversation"; row.appendChild(u); }
    if (c.pending) { const p = el("span", "count", String(c.pending)); p.title = "waiting for attention"; row.appendChild(p); }
    row.addEventListener("click", () => openDiscord(c.alias));
    list.appendChild(row);
  }
  const badgeEl = $("#discord-badge");
  badgeEl.hidden = !waiting;
  badgeEl.textContent = String(waiting);
  badgeEl.title = `${plural(waiting, "message")} waiting for attention`;
  drawItems(v.items);
  refreshHeld();
  if (discordOpen) openDiscord(discordOpen, true);
  if (named) { // the conversation names Discord inputs by alias now
    for (let i = conv.list.start; i < conv.list.end && i < conv.list.entries.length; i++) conv.list.entries[i].node = null;
    conv.list.schedule();
  }
}

const ITEM_TEXT = { pending: "pending", seen: "seen", acted: "acted", ignored: "ignored" };

function drawItems(items) {
  const box = $("#discord-items");
  box.replaceChildren();
  if (!items.length) { box.appendChild(el("p", "meta", "nothing waits for attention")); return; }
  for (const it of items) {
    const row = el("div", `item st-${it.status}`);
    row.dataset.item = it.id;
    row.appendChild(el("span", "alias", it.conversation));
    row.appendChild(el("span", `badge st-${it.status}`, ITEM_TEXT[it.status] || it.status));
    const by = it.decision_origin ? `by ${it.decision_origin}` : "no decision yet";
    row.appendChild(el("span", "meta", `item ${it.id} · message ${it.message_id} · ${by}${it.note ? " — " + it.note : ""}`));
    const acts = el("span", "item-acts");
    const moves = it.status === "acted" || it.status === "ignored" ? [["pending", "Reopen"]]
      : [["acted", "Mark acted"], ["ignored", "Ignore"]].concat(it.status === "pending" ? [["seen", "Mark seen"]] : []);
    for (const [to, label] of moves) {
      const b = el("button", "", label);
      b.type = "button";
      b.dataset.mark = to;
      b.setAttribute("aria-label", `${label}: item ${it.id} in ${it.conversation}`);
      b.addEventListener("click", () => markItem(it.id, to));
      acts.appendChild(b);
    }
    row.appendChild(acts);
    box.appendChild(row);
  }
}

async function markItem(id, status) {
  try {
    const res = await fetch(`/v2/items/${id}/mark`, { method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json" }, body: JSON.stringify({ status, note: "marked from the browser" }) });
    const body = await res.json().catch(() => ({}));
    if (!res.ok) ctlStatus(`mark: ${body.error || res.status}`, true);
    else ctlStatus(`item ${id}: ${body.status} (by the operator)`);
  } catch (e) { ctlStatus(`mark: ${e}`, true); }
  refreshDiscord();
}

// Held sends: what delivery.review held waits for the operator; Release
// sends it (once, with a receipt naming the release), Drop refuses it for
// good — the operator API's klbr-core release / drop.
async function refreshHeld() {
  const box = $("#discord-held");
  let v;
  try { v = await getJSON("/v2/held"); } catch (e) {
    box.replaceChildren(el("p", "meta", `cannot load: ${e.message}`));
    return;
  }
  box.replaceChildren();
  const hb = $("#held-badge");
  hb.hidden = !v.effects.length;
  hb.textContent = String(v.effects.length);
  hb.title = `${plural(v.effects.length, "held send")} waiting for you`;
  if (!v.effects.length) { box.appendChild(el("p", "meta", "nothing is held")); return; }
  for (const e of v.effects) {
    const row = el("div", "item held st-held");
    row.dataset.effect = e.id;
    row.appendChild(el("span", "alias", e.conversation));
    row.appendChild(el("span", "badge st-held", e.kind === "react" ? "held reaction" : "held send"));
    const what = e.kind === "react" ? `${e.emoji} on message ${e.target_message_id}` : e.text;
    row.appendChild(el("span", "held-what", what));
    row.appendChild(el("span", "meta", `effect ${e.id} · since ${new Date(e.created_at).toLocaleString()} · ${e.held_reason || "held"} · waits for you: Release or Drop (klbr-core release ${e.id})`));
    const acts = el("span", "item-acts");
    for (const [verb, label, question] of [["release", "Release", `Send effect ${e.id} to ${e.conversation} now? It goes out once, with a receipt naming you.`],
      ["drop", "Drop", `Drop effect ${e.id}? It never goes out.`]]) {
      const b = el("button", "", label);
      b.type = "button";
      b.dataset.decide = verb;
      b.setAttribute("aria-label", `${label}: held ${e.kind} ${e.id} in ${e.conversation}`);
      b.addEventListener("click", () => decideHeld(e.id, verb, question));
      acts.appendChild(b);
    }
    row.appendChild(acts);
    box.appendChild(row);
  }
}

async function decideHeld(id, verb, question) {
  if (question && !confirm(question)) return;
  try {
    const res = await fetch(`/v2/held/${id}/${verb}`, { method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json" }, body: JSON.stringify({ note: "from the browser" }) });
    const body = await res.json().catch(() => ({}));
    if (!res.ok) ctlStatus(`${verb}: ${body.error || res.status}`, true);
    else ctlStatus(verb === "release" ? `effect ${id} released: it is ${body.state}` : `effect ${id} dropped`);
  } catch (e) { ctlStatus(`${verb}: ${e}`, true); }
  refreshHeld();
}

async function openDiscord(alias, quiet) {
  discordOpen = alias;
  let v;
  try { v = await getJSON(`/v2/discord/${encodeURIComponent(alias)}`); } catch (e) {
    if (!quiet) ctlStatus(`Discord ${alias}: ${e.message}`, true);
    return;
  }
  $("#discord-convs").hidden = true;
  $("#discord-conv").hidden = false;
  markSeen(alias);
  $("#discord-title").textContent = `${v.conversation.alias} · ${kindLabel(v.conversation)}`;
  const log = $("#discord-log");
  log.replaceChildren();
  if (!v.messages.length) log.appendChild(el("p", "meta", "nothing admitted here yet"));
  for (const m of v.messages) {
    if (m.effect_id) {
      const state = { confirmed: "sent", failed: "failed", unknown: "unknown", pending: "pending", attempting: "pending" }[m.state] || m.state;
      const row = el("div", `dmsg out st-${state}`);
      row.appendChild(el("div", "who", `agent · ${clock(Date.parse(m.at))}`));
      if (m.kind === "react") row.appendChild(el("div", "text", `reaction ${m.emoji}`));
      else row.appendChild(renderMarkdown(m.text));
      const receipt = state === "sent" ? `delivered · message ${m.message_id}${m.reply_reference ? " · as a reply" : ""}`
        : state === "failed" ? `not delivered: ${[m.error_code, m.error].filter(Boolean).join(" ")}`
          : state === "unknown" ? `delivery unknown — it may or may not have arrived${m.evidence ? ": " + m.evidence : ""}` : "sending…";
      row.appendChild(el("div", "receipt", receipt));
      log.appendChild(row);
    } else {
      const directed = m.mode === "dm" || m.mode === "mention";
      const row = el("div", `dmsg in ${directed ? "directed" : "ambient"}`);
      let text = "";
      if (m.collected) text = collectedText(m);
      else try { text = JSON.parse(JSON.stringify(m.content)).text || ""; } catch (_) { /* shown empty */ }
      const who = el("div", "who", `${m.author} · ${clock(Date.parse(m.at))} · `);
      who.appendChild(badge(directed ? (m.mode === "dm" ? "directed · DM" : "directed · mention") : "ambient", directed ? "warn" : ""));
      if (m.item_id) who.appendChild(el("span", "meta", ` item ${m.item_id}`));
      row.appendChild(who);
      row.appendChild(el("div", "text", text));
      log.appendChild(row);
    }
  }
  log.scrollTop = log.scrollHeight;
}

// --- releases --------------------------------------------------------------------

async function refreshReleases() {
  const box = $("#releases");
  let v;
  try { v = await getJSON(`/v2/releases?session=${encodeURIComponent(SESSION)}`); } catch (e) {
    box.replaceChildren(el("p", "meta", `cannot load: ${e.message}`));
    return;
  }
  box.replaceChildren();
  const dl = el("dl", "kv");
  const row = (k, val, title) => { dl.appendChild(el("dt", "", k)); const d = el("dd", "mono", val); if (title) d.title = title; dl.appendChild(d); };
  row("active", v.active ? `${v.active.slice(0, 12)} · epoch ${v.epoch}` : "none", v.active);
  row("last good", v.last_good ? `${v.last_good.release.slice(0, 12)} · epoch ${v.last_good.epoch}` : "none earlier", v.last_good ? v.last_good.release : "");
  row("pending", v.pending ? "a candidate waits" : "no activation pending");
  box.appendChild(dl);
  if (v.last_good) {
    const b = el("button", "", "Roll back to last good");
    b.type = "button";
    b.addEventListener("click", () => sendControl({ type: "rollback" }, `Roll ${SESSION} back to ${v.last_good.release.slice(0, 12)} (epoch ${v.last_good.epoch})?`));
    box.appendChild(b);
  }
  if (v.activations.length) {
    const ol = el("ol", "acts");
    for (const a of v.activations.slice(0, 8)) {
      const li = el("li", "", `epoch ${a.epoch} · ${a.kind} ${a.release.slice(0, 12)} · ${a.reason}`);
      li.title = a.release;
      ol.appendChild(li);
    }
    box.appendChild(ol);
  }
  // Before an activation: the diff of a published release against the
  // active one (or against the last good one, after an activation).
  const form = el("form", "diff-form");
  form.setAttribute("role", "search");
  const input = el("input", "mono");
  input.id = "diff-release";
  input.placeholder = "release id to compare with the active one";
  input.setAttribute("aria-label", "release id to compare with the active release");
  input.autocomplete = "off";
  const go = el("button", "", "Diff");
  go.type = "submit";
  form.append(input, go);
  form.addEventListener("submit", (e) => { e.preventDefault(); const id = input.value.trim(); if (id && v.active) showDiff(v.active, id); });
  box.appendChild(form);
  if (v.last_good && v.active) {
    const b = el("button", "", "Diff: last good → active");
    b.type = "button";
    b.addEventListener("click", () => showDiff(v.last_good.release, v.active));
    box.appendChild(b);
  }
  const out = el("div", "");
  out.id = "release-diff";
  box.appendChild(out);
}

async function showDiff(from, to) {
  const box = $("#release-diff");
  box.replaceChildren(el("p", "meta", "loading the diff…"));
  let v;
  try { v = await getJSON(`/v2/releases/diff?from=${encodeURIComponent(from)}&to=${encodeURIComponent(to)}`); } catch (e) {
    box.replaceChildren(el("p", "meta", `no diff: ${e.message}`));
    return;
  }
  box.replaceChildren(el("p", "meta", `${from.slice(0, 12)} → ${to.slice(0, 12)}`));
  if (!v.diff) { box.appendChild(el("p", "meta", "the trees are the same")); return; }
  const pre = el("pre", "diff");
  for (const line of v.diff.split("\n")) {
    const cls = line.startsWith("+++") || line.startsWith("---") ? "d-file" : line.startsWith("+") ? "d-add" :
      line.startsWith("-") ? "d-del" : line.startsWith("@@") ? "d-hunk" : "";
    pre.appendChild(el("span", cls, line + "\n"));
  }
  box.appendChild(pre);
  if (v.truncated) box.appendChild(el("p", "meta", "the diff is cut here: klbr-core releases diff prints all of it"));
}

// --- jobs -------------------------------------------------------------------------

const JOB_CLASS = { succeeded: "ok", failed: "warn", unknown: "warn", cancelled: "", pending: "live", running: "live" };

// jobWhere is where a job runs: the worker host its attempt went to, the
// host (or label:L) a job not placed yet asks for, or "here".
function jobWhere(j) {
  const spec = j.spec || {};
  return j.host || spec.host || (spec.workspace && spec.workspace.host) || "here";
}

function jobTitle(j) {
  const spec = j.spec || {};
  if (Array.isArray(spec.argv)) return spec.argv.join(" ");
  return spec.entry || j.kind;
}

async function refreshJobs() {
  const box = $("#jobs");
  let v;
  try { v = await getJSON(`/v2/jobs?session=${encodeURIComponent(SESSION)}`); } catch (e) {
    box.replaceChildren(el("p", "meta", `cannot load: ${e.message}`));
    return;
  }
  box.replaceChildren();
  if (!v.jobs.length) { box.appendChild(el("p", "meta", "no job yet: the agent starts them with jobs.run and jobs.schedule")); return; }
  for (const j of v.jobs) {
    const d = el("details", "job");
    d.dataset.state = j.state;
    const s = el("summary", "");
    s.appendChild(el("span", "mono", `job ${j.id}`));
    s.appendChild(badge(j.state, JOB_CLASS[j.state] || ""));
    s.appendChild(el("span", "job-title", `${j.kind} · ${jobTitle(j)}`));
    const where = jobWhere(j);
    s.appendChild(el("span", "meta job-where", where === "here" ? "here" : `on ${where}`));
    d.dataset.where = where;
    d.appendChild(s);
    const dl = el("dl", "kv");
    const row = (k, val) => { if (val !== undefined && val !== null && val !== "") { dl.appendChild(el("dt", "", k)); dl.appendChild(el("dd", "mono", String(val))); } };
    row("runs", j.runs);
    row("recovery", j.recovery);
    if (j.next_due) row("next", new Date(j.next_due).toLocaleString());
    if (j.finished_at) row("ended", new Date(j.finished_at).toLocaleString());
    row("error", j.error);
    if (j.result !== undefined && j.result !== null) row("result", JSON.stringify(j.result));
    d.appendChild(dl);
    if (j.output_preview) d.appendChild(el("pre", "job-output", j.output_preview));
    const sha = (j.output_artifact || "").replace(/^a/, ""); // a history ref: a<sha256>
    if (/^[0-9a-f]{64}$/.test(sha)) {
      const a = el("a", "", `full output (${j.output_bytes} bytes)`);
      a.href = `/v2/artifacts/${sha}`;
      a.target = "_blank";
      a.rel = "noopener";
      d.appendChild(a);
    }
    box.appendChild(d);
  }
}

// --- spend ----------------------------------------------------------------------------
// Today's and this month's spend against the caps (in the caps' time zone),
// the sessions waiting at a cap with the state status names, and what each
// route and purpose spent. "Set cap" is klbr-core spend cap: it applies at
// once, and a session held at the cap resumes.

const usd = (v) => `$${Number(v || 0).toFixed(Math.abs(v) < 1 ? 4 : 2)}`;

function capLine(label, used, cap, resets, unit) {
  const row = el("div", "spend-period");
  row.appendChild(el("span", "spend-label", label));
  const fmt = unit === "tokens" ? (v) => `${Math.round(v).toLocaleString()} tokens` : usd;
  if (cap === undefined || cap === null || cap === 0) {
    row.appendChild(el("span", "mono", `${fmt(used)} · no cap`));
    return row;
  }
  const share = cap > 0 ? used / cap : 0;
  const meter = el("meter", "");
  meter.min = 0; meter.max = cap; meter.value = Math.min(used, cap); meter.high = cap * 0.8; meter.optimum = 0;
  row.appendChild(meter);
  const t = el("span", "mono", `${fmt(used)} of ${fmt(cap)} (${Math.round(share * 100)} %)`);
  if (share >= 1) t.classList.add("spend-reached");
  row.appendChild(t);
  if (resets) row.appendChild(el("span", "meta", `resets ${new Date(resets).toLocaleString()}`));
  return row;
}

function spendTable(title, groups) {
  const d = el("div", "spend-groups");
  d.appendChild(el("h3", "", title));
  if (!groups.length) { d.appendChild(el("p", "meta", "nothing yet")); return d; }
  const tb = el("table", "spend-table");
  const hr = el("tr", "");
  for (const h of ["", "requests", "tokens", "USD", "cached"]) hr.appendChild(el("th", "", h));
  tb.appendChild(hr);
  for (const g of groups) {
    const tr = el("tr", "");
    tr.dataset.key = g.key;
    tr.appendChild(el("td", "mono", g.key));
    tr.appendChild(el("td", "num", String(g.requests)));
    tr.appendChild(el("td", "num", Number(g.tokens).toLocaleString()));
    tr.appendChild(el("td", "num", usd(g.usd) + (g.unpriced_requests ? ` (+${g.unpriced_requests} unpriced)` : "")));
    tr.appendChild(el("td", "num", g.prompt_tokens ? `${Math.round(100 * g.cache_read_tokens / g.prompt_tokens)} %` : "—"));
    tb.appendChild(tr);
  }
  d.appendChild(tb);
  return d;
}

async function refreshSpend() {
  const box = $("#spend");
  let v;
  try { v = await getJSON("/v2/spend"); } catch (e) {
    box.replaceChildren(el("p", "meta", `cannot load: ${e.message}`));
    return;
  }
  box.replaceChildren();
  const s = v.state;
  const held = v.held || [];
  const badgeEl = $("#spend-badge");
  badgeEl.hidden = !held.length;
  badgeEl.textContent = held.length ? "cap reached" : "";
  for (const h of held) {
    const p = el("p", "spend-held warn", `${h.session}: ${h.text}`);
    p.dataset.session = h.session;
    p.dataset.cap = h.cap;
    p.title = "no new model request starts until then; inputs are still admitted. Raise the cap below to resume now.";
    box.appendChild(p);
  }
  if (!s) box.appendChild(el("p", "meta", "the agent does not run: no caps are enforced"));
  else {
    box.appendChild(capLine("today", s.day_usd, s.daily_usd_cap, s.day_resets));
    box.appendChild(capLine("this month", s.month_usd, s.monthly_usd_cap, s.month_resets));
    if (s.daily_tokens_cap) box.appendChild(capLine("today's tokens", s.day_tokens, s.daily_tokens_cap, s.day_resets, "tokens"));
    const meta = [`time zone ${s.time_zone}`, `warn at ${Math.round(100 * s.warn_at)} %`];
    if (s.in_flight) meta.push(`${s.in_flight} in flight, ${usd(s.reserved_usd)} reserved`);
    if (s.warned && s.warned.length) meta.push(`past warn_at: ${s.warned.join(", ")}`);
    box.appendChild(el("p", "meta", meta.join(" · ")));
  }
  for (const [name, p] of [["Today", v.today], ["This month", v.month]]) {
    const sec = el("section", "spend-breakdown");
    sec.dataset.period = name === "Today" ? "today" : "month";
    sec.appendChild(spendTable(`${name} by route`, p.routes || []));
    sec.appendChild(spendTable(`${name} by purpose`, p.purposes || []));
    box.appendChild(sec);
  }
  if (held.length && !$("#p-spend").open) $("#p-spend").open = true; // a reached cap opens the panel
  // The header shows this session's hold from the status: read it again
  // when the panel sees the hold begin or end.
  const mine = held.some((h) => h.session === SESSION);
  if (mine !== (!!head.retry && head.retry.state === "spend_cap")) refreshSoon();
}

function setCap(e) {
  e.preventDefault();
  const name = $("#spend-cap-name").value;
  const v = Number($("#spend-cap-usd").value);
  if (!(v > 0)) { ctlStatus("spend_cap: the cap is a positive amount in USD", true); return; }
  sendControl({ type: "spend_cap", cap: name, usd: v }, `Set the ${name} spend cap to $${v.toFixed(2)}? It applies at once and is kept across restarts.`);
}

// --- child agents -----------------------------------------------------------------
// The children of this session as a tree: each with its session's state, its
// job's state, its budget as recorded, what its model requests used, its
// wall time and its result (a preview; the whole record: klbr-core jobs show
// N). Its name opens its own page, where its lanes read like any session's.

let childrenOpened = false; // the panel opens by itself the first time it has children
let childrenTimer = null;

function drawChild(n) {
  const d = el("div", "child");
  d.dataset.session = n.session;
  d.dataset.state = n.state;
  d.dataset.jobState = n.job_state || "";
  d.dataset.where = n.host || "here";
  const head = el("div", "child-head");
  const a = el("a", "mono child-link", n.session);
  a.href = `/?session=${encodeURIComponent(n.session)}`;
  a.title = `open ${n.session}: its conversation and lanes`;
  head.appendChild(a);
  if (n.job) head.appendChild(badge(n.job_state, JOB_CLASS[n.job_state] || ""));
  head.appendChild(el("span", "meta", `session ${n.state}${n.state_reason ? " (" + n.state_reason + ")" : ""}`));
  if (n.job && n.job_state === "running") {
    const b = el("button", "child-cancel", "Cancel");
    b.type = "button";
    b.title = `cancel child ${n.job} and its own children (klbr-core jobs cancel ${n.job})`;
    b.addEventListener("click", () => sendControl({ type: "job_cancel", job: n.job },
      `Cancel child ${n.job} (${n.session})? It ends cancelled with its own children; its parent is told.`));
    head.appendChild(b);
  }
  d.appendChild(head);
  if (n.task) d.appendChild(el("div", "child-task", n.task));
  const dl = el("dl", "kv");
  const row = (k, val) => { dl.appendChild(el("dt", "", k)); dl.appendChild(el("dd", "mono", String(val))); };
  if (n.job) row("job", n.job);
  row("where", n.host ? `host ${n.host}` : "here");
  const budget = n.budget && typeof n.budget === "object" && Object.keys(n.budget).length ? JSON.stringify(n.budget) : "none asked";
  row("budget", budget);
  row("used", `${n.usage.tokens} tokens · ${plural(n.usage.model_requests, "model request")}`);
  if (n.started_at) row("wall", `${duration(n.wall_seconds * 1000)}${n.finished_at ? "" : " so far"}`);
  if (n.error) row("error", n.error);
  d.appendChild(dl);
  if (n.result) {
    const pre = el("pre", "child-result", n.result + (n.result_truncated ? " …" : ""));
    if (n.result_truncated) pre.title = `cut here: klbr-core jobs show ${n.job} has all of it`;
    d.appendChild(pre);
  }
  if (n.children && n.children.length) {
    const kids = el("div", "child-kids");
    for (const k of n.children) kids.appendChild(drawChild(k));
    d.appendChild(kids);
  }
  return d;
}

// showParent names a child's parent in the header and, once the child has
// finished, stops its message box from inviting messages nobody reads.
function showParent(v) {
  if (!v.parent) return;
  $("#f-parent").hidden = false;
  const a = $("#h-parent");
  a.textContent = v.parent;
  a.href = `/?session=${encodeURIComponent(v.parent)}`;
  const box = $("#composer");
  if (["succeeded", "failed", "cancelled", "unknown"].includes(v.job_state)) {
    box.disabled = true;
    box.placeholder = `This child agent has finished (${v.job_state}); it reads no more messages. Write to its parent, ${v.parent}.`;
  }
}

// refreshParent reads whether this page's session is a child, whatever the
// panels show.
async function refreshParent() {
  try { showParent(await getJSON(`/v2/children?session=${encodeURIComponent(SESSION)}`)); } catch (e) { /* the children panel says why */ }
}

async function refreshChildren() {
  const box = $("#children");
  let v;
  try { v = await getJSON(`/v2/children?session=${encodeURIComponent(SESSION)}`); } catch (e) {
    box.replaceChildren(el("p", "meta", `cannot load: ${e.message}`));
    return;
  }
  box.replaceChildren();
  showParent(v);
  if (v.parent) {
    const p = el("p", "meta child-parent", `${SESSION} is a child agent of `);
    const a = el("a", "mono", v.parent);
    a.href = `/?session=${encodeURIComponent(v.parent)}`;
    p.appendChild(a);
    box.appendChild(p);
  }
  if (!v.children.length) { box.appendChild(el("p", "meta", "no child agent: the agent starts them with agents.spawn")); return; }
  for (const n of v.children) box.appendChild(drawChild(n));
  if (v.truncated) box.appendChild(el("p", "meta", "more children than shown: klbr-core sessions lists them all"));
  if (!childrenOpened) { childrenOpened = true; $("#p-children").open = true; }
  // While a child runs, its state and usage move without a record on this
  // session's stream: look again soon.
  const running = (ns) => ns.some((n) => n.job_state === "running" || running(n.children || []));
  clearTimeout(childrenTimer);
  if (running(v.children)) childrenTimer = setTimeout(() => { if (conn.caughtUp && $("#home").dataset.panels !== "off") refreshChildren(); }, 3000);
}

// --- history ----------------------------------------------------------------------

async function searchHistory(q) {
  const box = $("#history-results");
  box.replaceChildren(el("p", "meta", "searching…"));
  let v;
  try { v = await getJSON(`/v2/history?session=${encodeURIComponent(SESSION)}&q=${encodeURIComponent(q)}`); } catch (e) {
    box.replaceChildren(el("p", "meta", `cannot search: ${e.message}`));
    return;
  }
  box.replaceChildren();
  if (!v.results.length) box.appendChild(el("p", "meta", "nothing found"));
  for (const h of v.results) {
    const b = el("button", "hit");
    b.type = "button";
    b.appendChild(el("span", "meta", `${h.ref} · ${h.kind} · ${clock(Date.parse(h.at))}`));
    b.appendChild(el("span", "hit-text", h.preview));
    b.addEventListener("click", () => readHistory(h.ref, b));
    box.appendChild(b);
  }
  if (v.truncated) box.appendChild(el("p", "meta", "more results: narrow the search, or klbr-core history search"));
}

async function readHistory(ref, after) {
  let v;
  try { v = await getJSON(`/v2/history/${encodeURIComponent(ref)}`); } catch (e) { ctlStatus(`history ${ref}: ${e.message}`, true); return; }
  const pre = el("pre", "history-read", (v.text || JSON.stringify(v, null, 2)) + (v.truncated ? "\n…" : ""));
  after.after(pre);
}

const summaries = [];

// panelsNote hears every record: compactions feed the summaries, Discord
// records refresh the Discord panel.
function panelsNote(r, c) {
  if (r.kind === "context.compacted") {
    summaries.push({ r, c });
    if (summaries.length > 50) summaries.shift();
    drawSummaries();
  }
  // A cell may have started a job; a job's end arrives as its input.
  if (conn.caughtUp && (r.kind.startsWith("discord.") || r.kind === "revision.activated" || r.kind === "cell.finished" || r.kind === "spend.warning" ||
    (c && (c.source_kind === "job" || c.source_kind === "source")))) refreshPanelsSoon();
}

function drawSummaries() {
  const box = $("#history-summaries");
  box.replaceChildren();
  for (const { r, c } of summaries.slice().reverse()) {
    const d = el("details", "sum");
    d.appendChild(el("summary", "", `${c.summary} · ${c.items} records · ${clock(r.at)}`));
    d.appendChild(renderMarkdown(c.text || ""));
    box.appendChild(d);
  }
}

let panelsTimer = null;
function refreshPanelsSoon() { clearTimeout(panelsTimer); panelsTimer = setTimeout(refreshPanels, 400); }

function refreshPanels() {
  if ($("#home").dataset.panels === "off") return;
  refreshDiscord();
  refreshReleases();
  refreshJobs();
  refreshSpend();
  refreshChildren();
}

function setupPanels() {
  $("#view-conv").addEventListener("click", () => setView("conversation"));
  $("#view-lanes").addEventListener("click", () => setView("lanes"));
  $("#btn-panels").addEventListener("click", () => togglePanels());
  $("#btn-controls").addEventListener("click", toggleControls);
  $("#discord-back").addEventListener("click", () => { discordOpen = null; $("#discord-conv").hidden = true; $("#discord-convs").hidden = false; refreshDiscord(); });
  $("#spend-cap-form").addEventListener("submit", setCap);
  $("#history-form").addEventListener("submit", (e) => { e.preventDefault(); const q = $("#history-q").value.trim(); if (q) searchHistory(q); });
  // A phone starts with the panels and the controls folded away.
  if (phone()) {
    $("#home").dataset.panels = "off";
    $("#btn-panels").setAttribute("aria-expanded", "false");
    $("#controls").dataset.collapsed = "true";
    $("#btn-controls").setAttribute("aria-expanded", "false");
  } else $("#home").dataset.panels = "on";
  setView(view);
  setInterval(() => { if (conn.caughtUp) refreshPanels(); }, 15000);
  refreshPanels();
  refreshParent();
}

// klbr browser client: one WebSocket (/v2/ws), lanes that never merge.
// Protocol: docs/browser.md. No build step, no dependencies.
"use strict";

const SESSION = new URLSearchParams(location.search).get("session") || "default";
const PREVIEW_LINES = 12; // longer outputs start collapsed
const seen = new Set();   // record ids already rendered: replay + live never duplicate
let cursor = 0;           // the last seq received
let ws = null;
let backoff = 500;
const openCells = [];     // cell.started elements waiting for their cell.finished

const $ = (sel) => document.querySelector(sel);
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// --- rendering ------------------------------------------------------------

const KW = new Set(("False None True and as assert async await break class continue def del elif else except finally for " +
  "from global if import in is lambda nonlocal not or pass raise return try while with yield match case").split(" "));

function esc(s) {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

// highlight is a small Python tokenizer: comments, strings, numbers, keywords.
function highlight(code) {
  const re = /(#[^\n]*)|("""[\s\S]*?(?:"""|$)|'''[\s\S]*?(?:'''|$)|"(?:\\.|[^"\\\n])*"?|'(?:\\.|[^'\\\n])*'?)|(\b\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?\b)|([A-Za-z_][A-Za-z0-9_]*)/g;
  let out = "", last = 0, m;
  while ((m = re.exec(code)) !== null) {
    out += esc(code.slice(last, m.index));
    const t = esc(m[0]);
    if (m[1]) out += `<span class="com">${t}</span>`;
    else if (m[2]) out += `<span class="str">${t}</span>`;
    else if (m[3]) out += `<span class="num">${t}</span>`;
    else if (KW.has(m[4])) out += `<span class="kw">${t}</span>`;
    else out += t;
    last = re.lastIndex;
  }
  return out + esc(code.slice(last));
}

function codeBlock(code) {
  const pre = el("pre", "code");
  pre.innerHTML = highlight(code); // tokens are escaped in highlight
  return pre;
}

// collapsible shows text, collapsed behind a summary when it is long.
function collapsible(text, cls, label) {
  const lines = text.split("\n");
  const pre = el("pre", cls, text);
  if (lines.length <= PREVIEW_LINES && text.length <= 2000) return pre;
  const d = el("details");
  d.appendChild(el("summary", "", `${label} — ${lines.length} lines, ${text.length} chars`));
  d.appendChild(pre);
  return d;
}

function meta(r, extra) {
  const t = new Date(r.at);
  const hh = isNaN(t) ? "" : t.toLocaleTimeString();
  return el("div", "meta", `#${r.seq} · ${r.kind} · ${hh}${extra ? " · " + extra : ""}`);
}

function renderInput(r, c) {
  const e = el("div", "record");
  e.appendChild(meta(r, c.author && c.author !== "operator" ? c.author : ""));
  e.appendChild(el("div", "text", c.text ?? JSON.stringify(c)));
  return e;
}

function renderCellStarted(r, c) {
  const e = el("div", "record cell");
  e.appendChild(meta(r, `gen ${c.generation ?? "?"}`));
  e.appendChild(codeBlock(c.code ?? ""));
  const out = el("div", "cell-outcome");
  out.appendChild(el("span", "outcome pending", "running…"));
  e.appendChild(out);
  openCells.push({ gen: c.generation, node: e, out });
  return e;
}

function fillOutcome(box, r, c) {
  box.textContent = "";
  const status = c.status || "unknown";
  box.appendChild(el("span", `outcome ${status}`, status));
  if (c.reset) box.appendChild(el("span", "meta", " · kernel reset"));
  const o = c.output || {};
  const preview = Array.isArray(o.preview) ? o.preview : [];
  let stdout = "", stderr = "";
  for (const ch of preview) { if (ch.stream === "stderr") stderr += ch.data || ""; else stdout += ch.data || ""; }
  if (stdout) box.appendChild(collapsible(stdout, "stdout", "output"));
  if (stderr) box.appendChild(collapsible(stderr, "stderr", "stderr"));
  if (c.value != null) box.appendChild(collapsible(String(c.value), "value", "value"));
  if (c.error) box.appendChild(collapsible((c.error.traceback || c.error.message || "").trimEnd(), "stderr", "traceback"));
  if (o.omitted_bytes) box.appendChild(el("div", "meta", `${o.omitted_bytes} bytes not in the preview`));
  if (o.artifact && /^[0-9a-f]{64}$/.test(o.artifact.sha256 || "")) {
    const d = el("div", "artifact");
    const a = el("a", "", `full output (${o.artifact.size} bytes)`);
    a.href = `/v2/artifacts/${o.artifact.sha256}`;
    a.target = "_blank";
    a.rel = "noopener";
    a.title = `artifact sha256 ${o.artifact.sha256}`;
    d.appendChild(a);
    box.appendChild(d);
  }
  if (o.spool_error) box.appendChild(el("div", "meta", `artifact not written: ${o.spool_error}`));
}

function renderCellFinished(r, c) {
  // Cells run one at a time per session: the finished record closes the
  // oldest open cell of its generation.
  const i = openCells.findIndex((x) => x.gen === c.generation);
  if (i >= 0) {
    const { node, out } = openCells.splice(i, 1)[0];
    fillOutcome(out, r, c);
    node.querySelector(".meta").textContent += ` · #${r.seq} ${r.kind}`;
    return null;
  }
  const e = el("div", "record cell");
  e.appendChild(meta(r));
  const out = el("div", "cell-outcome");
  fillOutcome(out, r, c);
  e.appendChild(out);
  return e;
}

function noticeText(r, c) {
  switch (r.kind) {
    case "kernel.started": return `kernel generation ${c.generation} started`;
    case "kernel.reset": return `kernel reset (generation ${c.generation}): ${c.reason || "no reason"} — Python state not restored`;
    case "revision.activated": return `revision activated: epoch ${c.epoch}, ${c.kind} ${String(c.release || "").slice(0, 12)}${c.reason ? " — " + c.reason : ""}`;
  }
  if (r.kind.startsWith("session.")) return `session ${r.kind.slice(8)}${c.reason ? ": " + c.reason : ""}`;
  return null;
}

// Speech is explicit: a sent card, or a held card that says why it was not
// delivered (and whether the host held it because the review failed).
function renderSpeech(r, c) {
  const held = r.kind === "local.held";
  const e = el("div", held ? "record speech held" : "record speech");
  e.appendChild(meta(r, `epoch ${c.behavior_epoch ?? "?"}`));
  e.appendChild(el("div", "text", c.text ?? ""));
  if (held) {
    const why = (c.fallback ? "held by the host (the review did not decide): " : "held by review: ") + (c.reason || "no reason given");
    e.appendChild(el("div", "held-reason", why));
  } else {
    e.appendChild(el("div", "meta", "delivered to this lane" + (c.reason ? " · " + c.reason : "")));
  }
  return e;
}

function renderGeneric(r, c) {
  const e = el("div", "record");
  e.appendChild(meta(r));
  if (c && typeof c.text === "string") e.appendChild(el("div", "text", c.text));
  else e.appendChild(collapsible(JSON.stringify(c, null, 2), "json", "content"));
  return e;
}

function render(r) {
  if (seen.has(r.id)) return; // dedupe by event id
  seen.add(r.id);
  if (r.seq > cursor) cursor = r.seq;
  const c = r.content || {};
  let node = null;
  if (r.lane === "input") node = renderInput(r, c);
  else if (r.kind === "cell.started") node = renderCellStarted(r, c);
  else if (r.kind === "cell.finished") node = renderCellFinished(r, c);
  else if (r.kind === "local.sent" || r.kind === "local.held") node = renderSpeech(r, c);
  else if (r.lane === "notice") {
    const t = noticeText(r, c);
    if (t !== null) { node = el("div", "record"); node.appendChild(meta(r)); node.appendChild(el("div", "text", t)); }
    else node = renderGeneric(r, c);
    headerFromNotice(r, c);
  } else node = renderGeneric(r, c);
  if (!node) return;
  node.dataset.id = r.id;
  node.dataset.seq = r.seq;
  node.dataset.kind = r.kind;
  const lane = document.getElementById("lane-" + r.lane) || document.getElementById("lane-notice");
  const items = lane.querySelector(".items");
  const stick = items.scrollHeight - items.scrollTop - items.clientHeight < 40;
  items.appendChild(node);
  if (stick) items.scrollTop = items.scrollHeight;
}

// --- header ---------------------------------------------------------------

function headerFromNotice(r, c) {
  if (r.kind.startsWith("session.")) $("#h-state").textContent = r.kind.slice(8);
  if (r.kind === "kernel.started" || r.kind === "kernel.reset") $("#h-kernel").textContent = `gen ${c.generation}`;
  if (r.kind === "revision.activated") {
    $("#h-revision").textContent = `epoch ${c.epoch} · ${String(c.release || "").slice(0, 12)}`;
    if (typeof c.epoch === "number") epoch = c.epoch;
  }
}

async function refreshStatus() {
  try {
    const res = await fetch("/v2/status", { credentials: "same-origin", cache: "no-store" });
    if (!res.ok) return;
    const st = await res.json();
    $("#h-placement").textContent = st.placement || "none";
    const s = (st.sessions || []).find((x) => x.id === SESSION);
    if (!s) return;
    $("#h-state").textContent = s.state + (s.draining ? " (draining)" : "");
    $("#h-revision").textContent = `epoch ${s.behavior_epoch} · ${String(s.policy_revision || "—").slice(0, 12)}`;
    epoch = s.behavior_epoch;
    $("#h-kernel").textContent = `gen ${s.kernel_generation}`;
  } catch (_) { /* the socket reports the connection state */ }
}

// --- socket ---------------------------------------------------------------

function setConn(state, text) {
  const c = $("#h-conn");
  c.dataset.state = state;
  c.textContent = text || state;
}

function status(text, err) {
  const s = $("#composer-status");
  s.textContent = text;
  s.classList.toggle("err", !!err);
}

function connect() {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  ws = new WebSocket(`${proto}//${location.host}/v2/ws`);
  setConn("connecting");
  ws.onopen = () => {
    ws.send(JSON.stringify({ type: "hello", session: SESSION, cursor }));
  };
  ws.onmessage = (ev) => {
    let m;
    try { m = JSON.parse(ev.data); } catch (_) { return; }
    switch (m.type) {
      case "records":
        for (const r of m.records || []) render(r);
        if (!m.more) { setConn("live"); backoff = 500; refreshStatus(); }
        else setConn("connecting", "replaying…");
        break;
      case "receipt":
        if (pending && pending.key === m.key) { pending = null; $("#composer").value = ""; }
        status(m.duplicate ? "already sent (duplicate key)" : `sent · input ${m.id}`);
        break;
      case "error":
        if (m.action) { ctlStatus(`${m.action}: ${m.code}: ${m.message}`, true); break; }
        if (pending && pending.key === m.key) pending = null;
        status(`${m.code}: ${m.message}`, true);
        break;
      case "ack":
        ctlStatus(`${m.action}: ${m.message}`);
        if (m.state) $("#h-state").textContent = m.state.state;
        break;
      case "activated": {
        const res = m.result || {};
        epoch = res.epoch;
        $("#h-revision").textContent = `epoch ${res.epoch} · ${String(res.release || "").slice(0, 12)}`;
        ctlStatus(`${m.action}: epoch ${res.epoch}, ${res.kind} ${String(res.release || "").slice(0, 12)}` +
          (res.replaced && res.replaced.length ? ` (replaced ${res.replaced.join(", ")})` : ""));
        if (m.action === "edit_soul" || $("#soul").open) loadSoul();
        break;
      }
      case "accepted":
        status(m.message);
        break;
      case "delta":
        break; // reserved: token deltas are best-effort and carry no cursor
    }
  };
  ws.onclose = (ev) => {
    setConn("closed", `disconnected${ev.reason ? ": " + ev.reason : ""} — retrying`);
    setTimeout(connect, backoff);
    backoff = Math.min(backoff * 2, 10000);
  };
}

// --- input ----------------------------------------------------------------

let pending = null; // the send awaiting its receipt

function newKey() {
  const b = new Uint8Array(12);
  crypto.getRandomValues(b);
  return "web-" + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

function submit() {
  const box = $("#composer");
  const text = box.value;
  if (!text.trim()) return;
  if (!ws || ws.readyState !== WebSocket.OPEN) { status("not connected; the text stays here", true); return; }
  // A resend of the same text (e.g. after a reconnect) reuses its key, so it
  // is admitted once.
  if (!pending || pending.text !== text) pending = { text, key: newKey() };
  ws.send(JSON.stringify({ type: "send", text, key: pending.key }));
  status("sending…");
}

function control(type, question) {
  if (!confirm(question)) return;
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type }));
}

// --- operator controls ----------------------------------------------------
// They reach the daemon's own operations (docs/browser.md), not the model or
// the hooks, so they work when those are broken. Answers: ack, activated, or
// an error carrying the action.

let epoch = null;     // the session's behavior epoch, as last seen
let soulEpoch = null; // the epoch the soul in the editor was loaded at

function ctlStatus(text, err) {
  const s = $("#controls-status");
  s.textContent = text;
  s.classList.toggle("err", !!err);
}

function sendControl(msg, question) {
  if (question && !confirm(question)) return;
  if (!ws || ws.readyState !== WebSocket.OPEN) { ctlStatus("not connected", true); return; }
  ws.send(JSON.stringify(msg));
  ctlStatus(`${msg.type}…`);
}

async function loadSoul() {
  try {
    const res = await fetch(`/v2/soul?session=${encodeURIComponent(SESSION)}`, { credentials: "same-origin", cache: "no-store" });
    const body = await res.json().catch(() => ({}));
    if (!res.ok) { $("#soul-meta").textContent = `cannot load the soul: ${body.error || res.status}`; return; }
    $("#soul-text").value = body.text;
    soulEpoch = body.epoch;
    $("#soul-meta").textContent = `loaded at epoch ${body.epoch} · ${String(body.release || "—").slice(0, 12)}` +
      (body.exists ? "" : " · this release has no soul.md");
  } catch (e) {
    $("#soul-meta").textContent = `cannot load the soul: ${e}`;
  }
}

function setupControls() {
  $("#btn-reset").addEventListener("click", () => sendControl({ type: "reset", session: SESSION },
    `Reset the workbench of ${SESSION}? Python state is lost; the next cell starts a new kernel generation.`));
  $("#btn-session-drain").addEventListener("click", () => sendControl({ type: "session_drain" },
    `Drain session ${SESSION}? It finishes accepted work, then stops.`));
  $("#btn-session-stop").addEventListener("click", () => sendControl({ type: "session_stop" },
    `Stop session ${SESSION} now?`));
  $("#btn-session-start").addEventListener("click", () => sendControl({ type: "session_start" }));
  $("#btn-rollback").addEventListener("click", () => sendControl({ type: "rollback" },
    `Roll ${SESSION} back to the release of its previous epoch?`));
  $("#btn-activate").addEventListener("click", () => {
    const release = $("#release-ref").value.trim();
    if (!release) { ctlStatus("activate: give a release id (or a prefix of 8+ hex digits)", true); return; }
    if (epoch === null) { ctlStatus("activate: the current epoch is not known yet", true); return; }
    sendControl({ type: "activate", release, expected_epoch: epoch },
      `Activate release ${release} on ${SESSION} (from epoch ${epoch})?`);
  });
  $("#soul").addEventListener("toggle", () => { if ($("#soul").open) loadSoul(); });
  $("#btn-soul-reload").addEventListener("click", loadSoul);
  $("#btn-soul-save").addEventListener("click", () => {
    const text = $("#soul-text").value;
    if (!text.trim()) { ctlStatus("edit_soul: the soul is empty", true); return; }
    if (soulEpoch === null) { ctlStatus("edit_soul: load the soul first", true); return; }
    sendControl({ type: "edit_soul", text, expected_epoch: soulEpoch },
      `Publish this soul as a new release and activate it on ${SESSION} (from epoch ${soulEpoch})?`);
  });
}

document.addEventListener("DOMContentLoaded", () => {
  $("#h-session").textContent = SESSION;
  $("#composer").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); submit(); }
  });
  $("#btn-drain").addEventListener("click", () => control("drain", "Drain klbr-core? Admission closes, accepted work finishes, then it exits."));
  $("#btn-stop").addEventListener("click", () => control("stop", "Stop klbr-core? Running work is interrupted and it exits."));
  setupControls();
  connect();
});

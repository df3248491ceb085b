// klbr browser client: one WebSocket (/v2/ws). Two views of the same
// records: the conversation (conv.js, the default) and five lanes that never
// merge (v switches). Protocol: docs/browser.md. No build step, no
// dependencies.
"use strict";

const SESSION = new URLSearchParams(location.search).get("session") || "default";
// A fresh page shows the session's last TAIL records (a bounded snapshot);
// "show earlier" reloads with four times as many.
const TAIL = Math.min(Math.max(parseInt(new URLSearchParams(location.search).get("tail"), 10) || 2000, 1), 1 << 20);
const PREVIEW_LINES = 12;   // longer outputs start collapsed
const TEXT_LINES = 40;      // longer scratchpad text starts collapsed
const LANE_CAP = 10000;     // the lanes keep the newest records of each lane in the DOM
const seen = new Set();     // record ids already rendered: replay + live never duplicate
const allRecs = [];         // every record received, in seq order (the lanes are built from it)
let lanesBuilt = false;     // the lanes are built the first time they are shown
let cursor = 0;             // the last seq received
let ws = null;
let backoff = 500;
const openCells = [];       // cell.started elements waiting for their cell.finished
const previews = new Map(); // "attempt:step" → the live preview of a streaming step
const recorded = new Set(); // "attempt:step" of scratchpad records shown: their deltas are stale

const $ = (sel) => document.querySelector(sel);
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = text;
  return e;
}
// TRACE_URL is [telemetry] trace_url ({trace_id} stands for the id), "" when
// unset: then a trace id is shown as text.
const TRACE_URL = (document.querySelector('meta[name="klbr-trace-url"]') || {}).content || "";

// traceRef shows an attempt's trace id: a link to the operator's trace
// viewer when trace_url is set, else the id as text.
function traceRef(id) {
  const box = el("div", "meta trace", "trace ");
  const url = TRACE_URL.replace("{trace_id}", id);
  if (TRACE_URL && /^https?:\/\//.test(url)) {
    const a = el("a", "trace-link", id);
    a.href = url;
    a.target = "_blank";
    a.rel = "noopener noreferrer";
    box.appendChild(a);
  } else box.appendChild(el("code", "trace-id", id));
  return box;
}
function badge(text, cls) { return el("span", "badge " + (cls || ""), text); }
function plural(n, one, many) { return `${n} ${n === 1 ? one : (many || one + "s")}`; }
const timeFormat = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit" });
function clock(ms) {
  const t = new Date(ms);
  return isNaN(t) ? "?" : timeFormat.format(t);
}
function duration(ms) {
  if (typeof ms !== "number" || !isFinite(ms)) return "?";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 90) return `${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
  const m = Math.floor(s / 60);
  return m < 90 ? `${m} min ${Math.round(s % 60)} s` : `${Math.floor(m / 60)} h ${m % 60} min`;
}

// --- code -----------------------------------------------------------------

const KW = new Set(("False None True and as assert async await break class continue def del elif else except finally for " +
  "from global if import in is lambda nonlocal not or pass raise return try while with yield match case").split(" "));
const BUILTIN = new Set(("print len range open str int float list dict set tuple bool isinstance enumerate zip map filter " +
  "sorted sum min max abs any all repr type super object Exception ValueError KeyError TypeError RuntimeError").split(" "));

function esc(s) {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

// highlight is a small Python tokenizer: comments, strings (f-strings too),
// numbers, keywords, builtins, decorators and the names after def/class.
function highlight(code) {
  const re = /(#[^\n]*)|([rbfuRBFU]{0,2}(?:"""[\s\S]*?(?:"""|$)|'''[\s\S]*?(?:'''|$)|"(?:\\.|[^"\\\n])*"?|'(?:\\.|[^'\\\n])*'?))|(\b\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?j?\b)|(@[A-Za-z_][\w.]*)|([A-Za-z_][A-Za-z0-9_]*)/g;
  let out = "", last = 0, m, prev = "";
  while ((m = re.exec(code)) !== null) {
    out += esc(code.slice(last, m.index));
    const t = esc(m[0]);
    if (m[1]) out += `<span class="com">${t}</span>`;
    else if (m[2]) out += `<span class="str">${t}</span>`;
    else if (m[3]) out += `<span class="num">${t}</span>`;
    else if (m[4]) out += `<span class="dec">${t}</span>`;
    else if (KW.has(m[5])) out += `<span class="kw">${t}</span>`;
    else if (prev === "def" || prev === "class") out += `<span class="fn">${t}</span>`;
    else if (BUILTIN.has(m[5])) out += `<span class="bi">${t}</span>`;
    else out += t;
    prev = m[5] || "";
    last = re.lastIndex;
  }
  return out + esc(code.slice(last));
}

function codeBlock(code, cls) {
  const pre = el("pre", "code" + (cls ? " " + cls : ""));
  pre.innerHTML = highlight(code); // tokens are escaped in highlight
  return pre;
}

// collapsible shows text, collapsed behind a summary when it is long.
function collapsible(text, cls, label, maxLines) {
  const lines = text.split("\n");
  const max = maxLines || PREVIEW_LINES;
  const pre = el("pre", cls, text);
  if (lines.length <= max && text.length <= 2000) return pre;
  const d = el("details", "long");
  d.appendChild(el("summary", "", `${label} — ${plural(lines.length, "line")}, ${text.length} chars`));
  d.appendChild(pre);
  return d;
}

// collapsibleText is collapsible for prose: a short head stays visible.
function collapsibleText(text, cls) {
  const lines = text.split("\n");
  if (lines.length <= TEXT_LINES && text.length <= 4000) return el("div", cls, text);
  const d = el("details", "long text-long");
  d.appendChild(el("summary", "", `${plural(lines.length, "line")}, ${text.length} chars — show all`));
  d.appendChild(el("div", cls, text));
  const head = el("div", cls + " head", lines.slice(0, 8).join("\n").slice(0, 800) + " …");
  const box = el("div");
  box.appendChild(head);
  box.appendChild(d);
  d.addEventListener("toggle", () => { head.hidden = d.open; });
  return box;
}

// collapsibleMd is collapsibleText for Markdown (speech, scratchpad).
function collapsibleMd(text) {
  const lines = text.split("\n");
  if (lines.length <= TEXT_LINES && text.length <= 4000) return renderMarkdown(text, "text-md");
  const d = el("details", "long text-long");
  d.appendChild(el("summary", "", `${plural(lines.length, "line")}, ${text.length} chars — show all`));
  d.appendChild(renderMarkdown(text, "text-md"));
  const head = renderMarkdown(lines.slice(0, 8).join("\n").slice(0, 800) + " …", "text-md head");
  const box = el("div");
  box.appendChild(head);
  box.appendChild(d);
  d.addEventListener("toggle", () => { head.hidden = d.open; });
  return box;
}

// toolCode returns a python call's code from its JSON arguments, or null.
function toolCode(args) {
  if (typeof args === "object" && args !== null) return typeof args.code === "string" ? args.code : null;
  if (typeof args !== "string") return null;
  try {
    const v = JSON.parse(args);
    return v && typeof v.code === "string" ? v.code : null;
  } catch (_) { return null; }
}

// partialCode decodes the code of arguments still streaming:
// {"code": "import os\nprint( → import os⏎print(. null when it is not that shape.
function partialCode(args) {
  const whole = toolCode(args);
  if (whole !== null) return whole;
  const m = /^\s*\{\s*"code"\s*:\s*"/.exec(args);
  if (!m) return null;
  let s = args.slice(m[0].length);
  for (let i = 0; i < s.length; i++) { // up to the closing quote, if it came
    if (s[i] === "\\") i++;
    else if (s[i] === '"') { s = s.slice(0, i); break; }
  }
  for (let cut = 0; cut <= 6 && cut <= s.length; cut++) { // an escape cut in half
    try { return JSON.parse('"' + s.slice(0, s.length - cut) + '"'); } catch (_) { /* shorter */ }
  }
  return null;
}

// --- records --------------------------------------------------------------

// collectedText says that retention collected a record's original: its
// place stays, its content is gone (the summary that covers it stands for
// it). Never shown as empty text.
function collectedText(r) {
  const k = r.collected || {};
  const d = new Date(k.at);
  const day = isNaN(d) ? String(k.at || "?") : d.toISOString().slice(0, 10);
  return `collected by retention on ${day}${k.reason ? ": " + k.reason : ""}`;
}

function renderCollected(r) {
  const e = el("div", "record collected");
  e.appendChild(meta(r));
  e.appendChild(el("div", "text collected-note", collectedText(r)));
  return e;
}

function meta(r, extra) {
  return el("div", "meta", `#${r.seq} · ${r.kind} · ${clock(r.at)}${extra ? " · " + extra : ""}`);
}

function renderInput(r, c) {
  const e = el("div", "record");
  const who = [];
  if (c.source_kind && c.source_kind !== "operator") who.push(c.source_kind);
  if (c.author && c.author !== "operator") who.push(c.author);
  if (c.conversation && c.conversation !== "operator") who.push(c.conversation);
  e.appendChild(meta(r, who.join(" · ")));
  e.appendChild(el("div", "text", typeof c.text === "string" ? c.text : JSON.stringify(c)));
  return e;
}

function usageText(u) {
  if (!u || typeof u !== "object") return "";
  const parts = [];
  if (u.prompt != null) parts.push(`${u.prompt} in`);
  if (u.completion != null) parts.push(`${u.completion} out`);
  if (u.cache_read != null) parts.push(`${u.cache_read} cached`);
  if (u.cache_write != null) parts.push(`${u.cache_write} cache write`);
  return parts.length ? parts.join(" · ") + " tokens" : "";
}

// toolCalls renders a step's tool calls: a python call shows its code.
function toolCalls(calls) {
  const box = el("div", "tool-calls");
  for (const tc of calls) {
    const d = el("div", "tool-call");
    d.appendChild(el("div", "meta", `calls ${tc.name || "?"} · ${tc.id || ""}`));
    const code = toolCode(tc.arguments);
    if (code !== null) d.appendChild(codeBlock(code));
    else d.appendChild(collapsible(typeof tc.arguments === "string" ? tc.arguments : JSON.stringify(tc.arguments), "json", "arguments"));
    box.appendChild(d);
  }
  return box;
}

// A scratchpad record is the agent's draft, never a sent message. A partial
// one was cut off mid-stream and says so.
function renderScratchpad(r, c) {
  const e = el("div", "record scratch" + (c.partial ? " partial" : ""));
  const bits = [];
  if (c.attempt != null) bits.push(`attempt ${c.attempt} · step ${c.step}`);
  if (c.route) bits.push(c.route);
  e.appendChild(meta(r, bits.join(" · ")));
  if (typeof c.trace_id === "string" && /^[0-9a-f]{32}$/.test(c.trace_id)) e.appendChild(traceRef(c.trace_id));
  const flags = el("div", "flags");
  if (c.partial) flags.appendChild(badge("interrupted — partial, not sent: the step was cut off before it finished", "warn"));
  if (c.finish_reason && c.finish_reason !== "stop" && c.finish_reason !== "tool_calls") flags.appendChild(badge(`finish: ${c.finish_reason}`, "warn"));
  if (flags.childNodes.length) e.appendChild(flags);
  if (typeof c.reasoning === "string" && c.reasoning) {
    const d = el("details", "reasoning");
    d.appendChild(el("summary", "", `reasoning${c.reasoning_field ? " (" + c.reasoning_field + ")" : ""} — ${c.reasoning.length} chars`));
    d.appendChild(el("div", "text", c.reasoning));
    e.appendChild(d);
  }
  if (typeof c.text === "string" && c.text) e.appendChild(collapsibleMd(c.text));
  else if (!Array.isArray(c.tool_calls) || !c.tool_calls.length) e.appendChild(el("div", "meta", "(no text)"));
  if (Array.isArray(c.tool_calls) && c.tool_calls.length) e.appendChild(toolCalls(c.tool_calls));
  const u = usageText(c.usage);
  const tail = [c.finish_reason ? `finish ${c.finish_reason}` : "", u].filter(Boolean).join(" · ");
  if (tail) e.appendChild(el("div", "meta foot", tail));
  return e;
}

// renderCellStarted renders a cell's code; with track (the lanes) it waits
// in openCells for its cell.finished.
function renderCellStarted(r, c, track = true) {
  const e = el("div", "record cell");
  const bits = [`gen ${c.generation ?? "?"}`];
  if (c.behavior_epoch != null) bits.push(`epoch ${c.behavior_epoch}`);
  if (c.step != null) bits.push(`step ${c.step}`);
  if (c.tool_call_id) bits.push(c.tool_call_id);
  e.appendChild(meta(r, bits.join(" · ")));
  e.appendChild(codeBlock(c.code ?? ""));
  const out = el("div", "cell-outcome");
  const run = el("span", "outcome pending running", "running…");
  run.dataset.since = Date.parse(r.at) || Date.now();
  out.appendChild(run);
  e.appendChild(out);
  if (track) openCells.push({ gen: c.generation, call: c.tool_call_id || "", node: e, out });
  return e;
}

const STATUS_TEXT = { ok: "ok", error: "error", cancelled: "cancelled", yielded: "yielded", lost: "lost — the daemon restarted while it ran" };

function fillOutcome(box, r, c) {
  box.textContent = "";
  if (r.collected) { box.appendChild(el("div", "collected-note", collectedText(r))); return; }
  const status = c.status || "unknown";
  box.appendChild(el("span", `outcome ${status}`, STATUS_TEXT[status] || status));
  if (c.reset) box.appendChild(el("span", "meta", " · kernel reset"));
  if (c.yield) {
    const y = c.yield;
    let t = "";
    if (typeof y === "object") {
      const secs = y.seconds === null || y.seconds === undefined ? "until input" : `${y.seconds} s`;
      t = `${y.kind || "wait"} ${secs}${y.reason ? " — " + y.reason : ""}`;
    } else t = String(y);
    box.appendChild(el("div", "yield", t));
  }
  let o = c.output || {};
  if (typeof o === "string") o = { preview: [{ stream: "stdout", data: o }] };
  const preview = Array.isArray(o.preview) ? o.preview : [];
  let stdout = "", stderr = "";
  for (const ch of preview) { if (ch.stream === "stderr") stderr += ch.data || ""; else stdout += ch.data || ""; }
  if (stdout) box.appendChild(collapsible(stdout, "stdout", "output"));
  if (stderr) box.appendChild(collapsible(stderr, "stderr", "stderr"));
  if (c.value != null) box.appendChild(collapsible(String(c.value), "value", "value"));
  if (c.error) {
    const head = [c.error.type, c.error.message].filter(Boolean).join(": ");
    const tb = (c.error.traceback || "").trimEnd();
    box.appendChild(collapsible(tb || head, "stderr", "traceback"));
  }
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
  // A cell that answers a tool call closes the started cell of that call;
  // otherwise cells run one at a time per session, and the finished record
  // closes the oldest open cell of its generation.
  // A collected outcome has lost its keys: it closes the oldest open cell.
  let i = c.tool_call_id ? openCells.findIndex((x) => x.call === c.tool_call_id) : -1;
  if (i < 0) i = r.collected ? (openCells.length ? 0 : -1) : openCells.findIndex((x) => x.gen === c.generation && (!c.tool_call_id || !x.call));
  if (i >= 0) {
    const { node, out } = openCells.splice(i, 1)[0];
    fillOutcome(out, r, c); // renderAll keeps a lane at its bottom
    node.classList.add("finished", `st-${c.status || (r.collected ? "collected" : "unknown")}`);
    node.querySelector(".meta").textContent += ` · #${r.seq} ${r.kind}`;
    return null;
  }
  const e = el("div", "record cell finished");
  e.appendChild(meta(r, c.execution_id ? `execution ${c.execution_id}` : ""));
  const out = el("div", "cell-outcome");
  fillOutcome(out, r, c);
  e.appendChild(out);
  return e;
}

// A tool call that never ran as a cell says why.
function renderToolUnrun(r, c) {
  const e = el("div", "record cell unrun");
  e.appendChild(meta(r, [c.step != null ? `step ${c.step}` : "", c.tool_call_id || ""].filter(Boolean).join(" · ")));
  const why = { invalid: "not run: invalid arguments", interrupted: "not run: interrupted", skipped: "not run: skipped" }[c.state] || `not run: ${c.state || "?"}`;
  e.appendChild(el("span", `outcome ${c.state || "unrun"}`, why));
  if (c.message) e.appendChild(el("div", "text small", c.message));
  return e;
}

// Speech is explicit: a sent card, or a held card that says why it was not
// delivered (and whether the host held it because the review failed).
function renderSpeech(r, c) {
  const held = r.kind === "local.held";
  const e = el("div", held ? "record speech held" : "record speech");
  e.appendChild(meta(r, `epoch ${c.behavior_epoch ?? "?"}`));
  e.appendChild(renderMarkdown(c.text ?? "", "text-md"));
  if (held) {
    const why = (c.fallback ? "held by the host (the review did not decide): " : "held by review: ") + (c.reason || "no reason given");
    e.appendChild(el("div", "held-reason", why));
  } else {
    e.appendChild(el("div", "meta", "delivered to this lane" + (c.reason ? " · " + c.reason : "")));
  }
  return e;
}

// noticeText is one line for each notice kind the page knows; null for
// others (shown as JSON). Its second value is a style.
function noticeText(r, c) {
  const k = r.kind;
  const why = (x) => (x ? ": " + x : "");
  switch (k) {
    case "kernel.started": return [`kernel generation ${c.generation} started`];
    case "kernel.reset": return [`kernel reset (generation ${c.generation})${why(c.reason || "no reason")} — Python state not restored`, "warn"];
    case "revision.activated": return [`revision activated: epoch ${c.epoch}, ${c.kind} ${String(c.release || "").slice(0, 12)}${c.reason ? " — " + c.reason : ""}`];
    case "wait.started": {
      const until = c.seconds == null ? "until input" : `${c.seconds} s${c.deadline ? ", until " + clock(c.deadline) : ""}`;
      return [`waiting ${until}${why(c.reason)}`, "wait"];
    }
    case "wait.woken": {
      const by = { input: "input", deadline: "its deadline", restart: "a restart", operator: "the operator" }[c.by] || c.by || "?";
      return [`woken by ${by}${c.waited_ms != null ? " after " + duration(c.waited_ms) : ""}${why(c.reason)}`];
    }
    case "model.error": return [`model error${c.kind ? " (" + c.kind + ")" : ""}${c.step != null ? " at step " + c.step : ""}${c.url ? " from " + c.url : ""}${why(c.message)}` +
      (c.transient === false ? ` — not retried: ${c.fix || "the next input starts a new attempt"}`
        : c.retry_in_ms != null ? ` — retrying in ${duration(c.retry_in_ms)}` : ""), "warn"];
    case "storage": return [`storage recovered after ${duration(c.lasted_ms || 0)}${why(c.reason)} — ${c.message || ""}`, "warn"];
    case "turn.ended": return [`attempt ended${why(c.reason)} — the next input starts a new attempt`, "warn"];
    case "delivery.reminder": return [`delivery reminder${c.frame != null ? " (frame " + c.frame + ")" : ""}${why(c.text)}`];
    case "turn.idle": return [`idle${why(c.reason)}`];
    case "turn.paused": return [`paused${why(c.reason)}`, "pause"];
    case "turn.resumed": return [`resumed${why(c.reason)}`];
    case "context.reset": return [`context reset: epoch ${c.epoch} starts empty${why(c.reason)}`, "warn"];
    case "context.budget": return [`context over budget${c.needed != null ? ": needs " + c.needed + " tokens of " + c.budget : why(c.message)}`, "warn"];
  }
  if (k.startsWith("session.")) {
    const to = k.slice(8);
    const style = to === "paused" || to === "stopped" ? "pause" : to === "waiting" ? "wait" : "";
    return [`session ${c.from ? c.from + " → " : ""}${to}${why(c.reason)}`, style];
  }
  return null;
}

// compactionMeasure is a compaction's one measure, worded as klbr-core
// compact and tail word it (history.Measure).
function compactionMeasure(c) {
  return `context about ${c.tokens_before} → ${c.tokens_after} tokens (estimated)`;
}

// A compaction: a collapsible summary block with what it covers and how to
// read the originals (they are never changed).
function renderCompacted(r, c) {
  const e = el("div", "record notice n-compacted" + (c.kind === "degraded" ? " n-warn" : ""));
  e.appendChild(meta(r));
  const d = el("details", "summary-block");
  const head = `context compacted: ${c.summary} (${c.kind}) replaces ${c.items} records (items ${c.first_item}–${c.last_item})` +
    `; ${compactionMeasure(c)}` + (c.attempts ? `, ${c.attempts} summarizer request${c.attempts === 1 ? "" : "s"}` : "");
  d.appendChild(el("summary", "", head));
  d.appendChild(el("div", "text", c.text ?? ""));
  if (c.problems) d.appendChild(el("div", "held-reason", c.problems.join("; ")));
  d.appendChild(el("div", "meta", `originals: klbr-core history children ${c.summary} · klbr-core history read REF · in a cell: await history.children("${c.summary}")`));
  e.appendChild(d);
  return e;
}

function renderNotice(r, c) {
  if (r.kind === "context.compacted") return renderCompacted(r, c);
  const t = noticeText(r, c);
  if (t === null) return renderGeneric(r, c);
  const e = el("div", "record notice" + (t[1] ? " n-" + t[1] : ""));
  e.appendChild(meta(r));
  e.appendChild(el("div", "text", t[0]));
  return e;
}

// Discord effects settle into the speech lane: what was delivered, what
// failed and what is unknown, each with its conversation.
function renderDiscordSpeech(r, c) {
  const react = r.kind.startsWith("discord.react.");
  const outcome = react ? r.kind.slice("discord.react.".length) : r.kind.slice("discord.".length);
  const state = { sent: "sent", confirmed: "sent", failed: "failed", unknown: "unknown" }[outcome] || outcome;
  const e = el("div", `record speech discord ${state}`);
  const where = [c.conversation ? `to ${c.conversation}` : "", c.reply_reference ? "as a reply" : ""].filter(Boolean).join(" · ");
  e.appendChild(meta(r, where));
  if (react) e.appendChild(el("div", "text", `reaction ${c.emoji || "?"}${c.target_message_id ? " on message " + c.target_message_id : ""}`));
  else e.appendChild(renderMarkdown(c.text ?? "", "text-md"));
  if (state === "sent") e.appendChild(el("div", "meta", `delivered to Discord${c.message_id ? " · message " + c.message_id : ""}`));
  else if (state === "failed") e.appendChild(el("div", "held-reason", `not delivered: ${[c.error_code, c.error].filter(Boolean).join(" ") || "failed"}`));
  else if (state === "unknown") e.appendChild(el("div", "held-reason", `delivery unknown${c.evidence ? ": " + c.evidence : c.error ? ": " + c.error : ""} — it may or may not have arrived`));
  return e;
}

function renderGeneric(r, c) {
  const e = el("div", "record generic");
  e.appendChild(meta(r));
  if (c && typeof c.text === "string") e.appendChild(collapsibleText(c.text, "text"));
  else e.appendChild(collapsible(JSON.stringify(c, null, 2), "json", "content"));
  return e;
}

function contentOf(r) { return r.content && typeof r.content === "object" ? r.content : { value: r.content }; }

// ingest takes each record once (by event id): the header, the
// conversation and, once they are built, the lanes.
function ingest(r) {
  if (seen.has(r.id)) return; // dedupe by event id
  seen.add(r.id);
  if (r.seq > cursor) cursor = r.seq;
  const c = contentOf(r);
  allRecs.push(r);
  let preview = null;
  if (r.kind === "scratchpad") {
    const key = `${c.attempt}:${c.step}`;
    recorded.add(key);
    preview = previews.get(key) || null;
    previews.delete(key);
  }
  if (r.lane === "notice") headerFromNotice(r, c);
  if (c.attempt != null && (r.lane === "scratchpad" || r.kind.startsWith("turn.") || r.kind.startsWith("wait."))) noteAttempt(c.attempt);
  convAdd(r, c);
  if (typeof panelsNote === "function") panelsNote(r, c);
  if (lanesBuilt) render(r, c, preview);
  else if (preview && preview.node) preview.node.remove();
}

// render places one record in its lane.
function render(r, c, preview) {
  let node = null, replace = null;
  if (r.collected && r.kind !== "cell.finished") node = renderCollected(r);
  else if (r.lane === "input") node = renderInput(r, c);
  else if (r.lane === "scratchpad" && r.kind === "scratchpad") {
    node = renderScratchpad(r, c);
    if (preview && preview.node.isConnected) replace = preview.node;
  } else if (r.lane === "cell" && r.kind === "cell.started") node = renderCellStarted(r, c);
  else if (r.lane === "cell" && r.kind === "cell.finished") node = renderCellFinished(r, c);
  else if (r.lane === "cell" && r.kind === "tool.unrun") node = renderToolUnrun(r, c);
  else if (r.lane === "speech" && (r.kind === "local.sent" || r.kind === "local.held")) node = renderSpeech(r, c);
  else if (r.lane === "speech" && r.kind.startsWith("discord.")) node = renderDiscordSpeech(r, c);
  else if (r.lane === "notice") node = renderNotice(r, c);
  else node = renderGeneric(r, c);
  if (!node) return;
  node.dataset.id = r.id;
  node.dataset.seq = r.seq;
  node.dataset.kind = r.kind;
  if (replace) { replace.replaceWith(node); return; }
  place(r.lane, node);
}

// Records of one message are placed in a batch: one fragment per lane,
// appended once, so a replay of thousands of records costs one layout per
// lane, not one per record.
let batch = null; // lane → DocumentFragment, while a message is rendered

function laneItems(lane) {
  const l = document.getElementById("lane-" + lane) || document.getElementById("lane-notice");
  return l.querySelector(".items");
}

function atBottom(items) { return items.scrollHeight - items.scrollTop - items.clientHeight < 60; }

function place(lane, node) {
  if (!document.getElementById("lane-" + lane)) lane = "notice";
  if (batch) {
    let f = batch.get(lane);
    if (!f) batch.set(lane, (f = document.createDocumentFragment()));
    f.appendChild(node);
    return;
  }
  const items = laneItems(lane);
  const stick = atBottom(items);
  items.appendChild(node);
  trimLane(items);
  if (stick) items.scrollTop = items.scrollHeight;
}

// trimLane keeps a lane's DOM bounded: the oldest records beyond LANE_CAP
// leave it (the conversation view and klbr-core tail still have them).
function trimLane(items) {
  let over = items.childElementCount - LANE_CAP;
  if (over <= 0) return;
  while (over-- > 0) items.firstElementChild.remove();
  const lane = items.closest(".lane");
  let note = lane.querySelector(".trimmed");
  if (!note) { note = el("div", "trimmed meta"); lane.insertBefore(note, items); }
  note.textContent = `older records of this lane are not shown here (the newest ${LANE_CAP} are); the conversation view and klbr-core tail have them all`;
}

// buildLanes renders every record received so far into the lanes, once:
// only the newest LANE_CAP of each lane.
function buildLanes() {
  if (lanesBuilt) return;
  lanesBuilt = true;
  const per = new Map();
  const skip = new Set();
  for (let i = allRecs.length - 1; i >= 0; i--) {
    const lane = document.getElementById("lane-" + allRecs[i].lane) ? allRecs[i].lane : "notice";
    const n = (per.get(lane) || 0) + 1;
    per.set(lane, n);
    if (n > LANE_CAP) skip.add(i);
  }
  batch = new Map();
  try {
    allRecs.forEach((r, i) => { if (!skip.has(i)) render(r, contentOf(r), null); });
  } finally {
    const b = batch;
    batch = null;
    for (const [lane, f] of b) { const items = laneItems(lane); items.appendChild(f); trimLane(items); }
    for (const p of previews.values()) if (p.node) laneItems("scratchpad").appendChild(p.node);
    for (const l of document.querySelectorAll(".lane .items")) l.scrollTop = l.scrollHeight;
  }
}

function renderAll(records) {
  batch = new Map();
  // Scroll positions are read before anything changes: one layout.
  const stick = new Map([...document.querySelectorAll(".lane")].map((l) => [l.dataset.lane, atBottom(l.querySelector(".items"))]));
  try {
    for (const r of records) ingest(r);
  } finally {
    const b = batch;
    batch = null;
    for (const [lane, f] of b) { const items = laneItems(lane); items.appendChild(f); trimLane(items); }
    for (const [lane, st] of stick) if (st) { const items = laneItems(lane); items.scrollTop = items.scrollHeight; }
  }
}

// --- live previews from token deltas ---------------------------------------
// Deltas are best-effort: a preview is provisional, marked so, and replaced
// by the step's durable scratchpad record when it arrives.

function preview(a, s, first) {
  const key = `${a}:${s}`;
  let p = previews.get(key);
  if (p) return p;
  const node = el("div", "record scratch preview");
  node.dataset.preview = key;
  node.appendChild(el("div", "meta", `attempt ${a} · step ${s} · streaming`));
  node.appendChild(badge("live · provisional — not yet recorded", "live"));
  const reasoning = el("div", "text reasoning-live");
  const text = el("div", "text");
  const calls = el("div", "tool-calls");
  node.append(reasoning, text, calls);
  p = { key, node, reasoning, text, calls, callBoxes: new Map(), cut: false };
  // Each delta carries its place in the step's stream: a first one past 0
  // means this page joined while the step was already streaming.
  if (first > 0) {
    node.classList.add("joined");
    node.insertBefore(badge("joined mid-stream: the start is missing", "warn"), reasoning);
  }
  previews.set(key, p);
  if (lanesBuilt) place("scratchpad", node);
  return p;
}

// appendText grows an element's one text node (not textContent +=, which
// copies the whole text for every delta).
function appendText(e, t) {
  if (!t) return;
  if (e.lastChild && e.lastChild.nodeType === Node.TEXT_NODE) e.lastChild.appendData(t);
  else e.appendChild(document.createTextNode(t));
}

function markGap(p) {
  if (p.cut) return;
  p.cut = true;
  convLiveGap(p);
  p.node.classList.add("gap");
  p.node.appendChild(badge("incomplete: this page missed part of the stream; the record will replace it", "warn"));
}

const ORPHAN_MS = 15000; // an ended preview with no record after this says so

function applyDelta(d) {
  const key = `${d.attempt}:${d.step}`;
  if (recorded.has(key)) return; // the record is here: deltas are stale
  // An end or a gap with nothing shown (a failed request, an empty
  // completion) makes no preview.
  if ((d.kind === "end" || d.kind === "gap") && !previews.has(key)) return;
  const p = preview(d.attempt, d.step, d.index || 0);
  switch (d.kind) {
    case "content": if (!p.cut) { appendText(p.text, d.text); convLiveDelta(p, "content", d.text); } break;
    case "reasoning": if (!p.cut) { appendText(p.reasoning, d.text); convLiveDelta(p, "reasoning", d.text); } break;
    case "tool": {
      if (p.cut) break;
      // Only a call's first delta names it; the rest continue the last one.
      const id = d.call || p.lastCall || "";
      if (d.call) p.lastCall = d.call;
      let b = p.callBoxes.get(id);
      if (!b) {
        b = { args: "", box: el("div", "tool-call") };
        b.box.appendChild(el("div", "meta", `calls python · ${id}`));
        b.pre = el("pre", "code");
        b.box.appendChild(b.pre);
        p.calls.appendChild(b.box);
        p.callBoxes.set(id, b);
      }
      b.args += d.text || "";
      const code = partialCode(b.args);
      if (code !== null) b.pre.innerHTML = highlight(code);
      else b.pre.textContent = b.args;
      convLiveDelta(p, "tool", null, code !== null ? code : b.args);
      break;
    }
    case "gap": markGap(p); break;
    case "end":
      p.node.classList.add("ended");
      p.node.querySelector(".meta").textContent = `attempt ${d.attempt} · step ${d.step} · stream ended, waiting for its record`;
      setTimeout(() => {
        if (previews.get(key) !== p) return;
        p.node.classList.add("orphan");
        p.node.appendChild(badge("no record followed: the step failed or was not kept — see the notices", "warn"));
      }, ORPHAN_MS);
      break;
  }
}

// --- header ---------------------------------------------------------------

const head = { state: null, reason: "", attempt: null, wait: null, retry: null }; // wait: {deadline(ms)|null, reason}; retry: the status's retry

function noteAttempt(a) {
  if (typeof a === "number" && (head.attempt === null || a >= head.attempt)) { head.attempt = a; drawHeader(); }
}

function headerFromNotice(r, c) {
  if (r.kind.startsWith("session.")) {
    head.state = r.kind.slice(8);
    head.reason = c.reason || "";
    if (head.state !== "waiting") head.wait = null;
    drawHeader();
  }
  if (r.kind === "wait.started") { head.wait = { deadline: c.deadline ?? null, reason: c.reason || "" }; drawHeader(); }
  if (r.kind === "wait.woken") { head.wait = null; drawHeader(); }
  if (r.kind === "turn.paused" && c.reason) { head.reason = c.reason; drawHeader(); }
  if (r.kind === "model.error" || r.kind === "turn.ended") refreshSoon(); // the retry or backoff it started
  if (r.kind === "kernel.started" || r.kind === "kernel.reset") $("#h-kernel").textContent = `gen ${c.generation}`;
  if (r.kind === "revision.activated") {
    $("#h-revision").textContent = `epoch ${c.epoch} · ${String(c.release || "").slice(0, 12)}`;
    if (typeof c.epoch === "number") epoch = c.epoch;
  }
}

function drawHeader() {
  const st = $("#h-state");
  st.textContent = head.state || "…";
  st.dataset.state = head.state || "";
  const why = $("#h-reason");
  why.textContent = head.reason && head.state !== "ready" && head.state !== "running" ? head.reason : "";
  why.title = head.reason;
  const r = head.retry;
  if (r) {
    // A retry or backoff: when next, and the last error with its URL.
    const left = deadlineMs(r.next_at) - Date.now();
    const when = left > 0 ? "in " + duration(left) : "now";
    why.textContent = r.state === "spend_cap" ? `${r.last_error} — resumes by itself ${when}, or raise the cap (Spend panel)`
      : r.state === "retrying" ? `retrying by itself ${when} (${r.in_a_row} failed): ${r.last_error}`
      : `backing off: the next input starts an attempt ${when}: ${r.last_error}`;
    why.title = [r.last_error, r.url ? `${r.route} ${r.url}` : "", r.fix || ""].filter(Boolean).join("\n");
  }
  $("#h-attempt").textContent = head.attempt === null ? "—" : `#${head.attempt}`;
  const w = $("#f-wait");
  w.hidden = !head.wait;
  if (head.wait) {
    const dl = head.wait.deadline;
    let t = "until input";
    if (dl != null) {
      const left = dl - Date.now();
      t = `until ${clock(dl)} (${left > 0 ? "in " + duration(left) : "due"})`;
    }
    $("#h-wait").textContent = t;
    $("#h-wait").title = head.wait.reason;
  }
}

function deadlineMs(d) {
  if (d === null || d === undefined) return null;
  if (typeof d === "number") return d;
  const t = Date.parse(d);
  return isNaN(t) ? null : t;
}

async function refreshStatus() {
  try {
    const res = await fetch("/v2/status", { credentials: "same-origin", cache: "no-store" });
    if (!res.ok) return;
    const st = await res.json();
    $("#h-placement").textContent = st.placement || "none";
    $("#h-placement").title = (st.placement_notes || []).join("\n");
    // Whether the turn loop runs, and if not why (no route, no cells).
    if (typeof st.agent === "string" && st.agent) {
      $("#f-agent").hidden = false;
      $("#h-agent").textContent = st.agent.startsWith("not running") ? "not running" : st.agent;
      $("#h-agent").title = st.agent;
      $("#h-agent").classList.toggle("warn", st.agent.startsWith("not running"));
    }
    if (st.storage) {
      // Writes fail: new work waits; klbr-core goes on by itself once they succeed.
      $("#f-agent").hidden = false;
      $("#h-agent").textContent = "storage failing";
      $("#h-agent").title = `since ${st.storage.since}: ${st.storage.reason}; new work waits and goes on by itself once writes succeed`;
      $("#h-agent").classList.add("warn");
    }
    const s = (st.sessions || []).find((x) => x.id === SESSION);
    updateBanner(st, s || null);
    if (!s) return;
    head.state = s.state + (s.draining ? " (draining)" : "");
    head.reason = s.state_reason || "";
    // The turn loop adds the current or last attempt and the armed wait.
    // Both are left out when there is none; a daemon without the turn loop
    // has neither, and then the notices are all the page knows.
    const turnAware = "attempt" in s || "wait" in s || "agent" in st;
    if (s.attempt != null) head.attempt = typeof s.attempt === "object" ? s.attempt.id : s.attempt;
    if (s.attempt && typeof s.attempt === "object" && s.attempt.state) $("#h-attempt").title = `${s.attempt.state}${s.attempt.outcome ? ": " + s.attempt.outcome : ""}`;
    if (turnAware) head.wait = s.wait ? { deadline: deadlineMs(s.wait.deadline), reason: s.wait.reason || "" } : null;
    head.retry = s.retry || null;
    drawHeader();
    $("#h-revision").textContent = `epoch ${s.behavior_epoch} · ${String(s.policy_revision || "—").slice(0, 12)}`;
    epoch = s.behavior_epoch;
    $("#h-kernel").textContent = `gen ${s.kernel_generation}`;
  } catch (_) { /* the socket reports the connection state */ }
}

let statusTimer = null;
function refreshSoon() {
  clearTimeout(statusTimer);
  statusTimer = setTimeout(refreshStatus, 250);
}

// tick redraws what depends on the clock: running cells and the wait.
function tick() {
  const now = Date.now();
  for (const e of document.querySelectorAll(".outcome.running")) {
    const since = Number(e.dataset.since);
    if (since) e.textContent = `running… ${duration(Math.max(0, now - since))}`;
  }
  if (head.wait && head.wait.deadline != null) drawHeader();
  if (bannerState && bannerState.s && bannerState.s.retry) drawBanner();
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

// showEarlier says that the snapshot leaves earlier records out, with a
// way to see more of them.
function showEarlier(n) {
  const bar = $("#earlier");
  bar.textContent = `${plural(n, "earlier record")} not shown (this page starts at the last ${TAIL}). `;
  const more = el("a", "", `Show ${Math.min(TAIL * 4, 1 << 20)}`);
  const q = new URLSearchParams(location.search);
  q.set("tail", String(Math.min(TAIL * 4, 1 << 20)));
  more.href = `${location.pathname}?${q}`;
  bar.append(more, document.createTextNode(" · all of them: klbr-core tail " + SESSION));
  bar.hidden = false;
}

// conn is what the page knows of the current connection.
let conn = { caughtUp: false };

function connect() {
  conn = { caughtUp: false };
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  ws = new WebSocket(`${proto}//${location.host}/v2/ws`);
  setConn("connecting");
  ws.onopen = () => {
    const hello = { type: "hello", session: SESSION, cursor };
    if (cursor === 0) hello.tail = TAIL;
    ws.send(JSON.stringify(hello));
  };
  ws.onmessage = (ev) => {
    let m;
    try { m = JSON.parse(ev.data); } catch (_) { return; }
    switch (m.type) {
      case "records": {
        if (!m.more) conn.caughtUp = true;
        const recs = m.records || [];
        renderAll(recs);
        const sessionMoved = recs.some((r) => r.kind.startsWith("session."));
        if (!m.more) {
          // Caught up: the frame after this one shows it (a mark for measuring).
          if (!performance.getEntriesByName("klbr-first-render").length) requestAnimationFrame(() => performance.mark("klbr-first-render"));
          if ($("#h-conn").dataset.state !== "live") { setConn("live"); backoff = 500; refreshStatus(); }
          else if (sessionMoved) refreshSoon();
        } else setConn("connecting", "replaying…");
        break;
      }
      case "window": showEarlier(m.earlier); break;
      case "delta": {
        // Only the lanes, when shown, read the layout here (once per message
        // would force a layout per message); the conversation lays out once a frame.
        if (view !== "lanes") { for (const d of m.deltas || []) applyDelta(d); break; }
        const items = laneItems("scratchpad");
        const stick = atBottom(items);
        for (const d of m.deltas || []) applyDelta(d);
        if (stick) items.scrollTop = items.scrollHeight;
        break;
      }
      case "receipt":
        if (pending && pending.key === m.key) { lastSent = pending.text; pending = null; $("#composer").value = ""; }
        if (m.unanswered) status(`sent · input ${m.id} — ${m.unanswered}`, true);
        else status(m.duplicate ? "already sent (duplicate key)" : `sent · input ${m.id}`);
        break;
      case "error":
        if (m.action) { ctlStatus(`${m.action}: ${m.code}: ${m.message}`, true); break; }
        if (pending && pending.key === m.key) pending = null;
        status(`${m.code}: ${m.message}`, true);
        break;
      case "ack":
        ctlStatus(`${m.action}: ${m.message}`);
        if (m.action === "spend_cap") { refreshSpend(); $("#spend-cap-usd").value = ""; }
        if (m.state) { head.state = m.state.state; head.reason = m.state.state_reason || ""; drawHeader(); }
        refreshSoon();
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
    }
  };
  ws.onclose = (ev) => {
    setConn("closed", `disconnected${ev.reason ? ": " + ev.reason : ""} — retrying`);
    // Previews are provisional: a reconnect replays records, not deltas.
    for (const p of previews.values()) markGap(p);
    setTimeout(connect, backoff);
    backoff = Math.min(backoff * 2, 10000);
  };
}

// --- input ----------------------------------------------------------------

let pending = null; // the send awaiting its receipt
let lastSent = "";  // recalled by ArrowUp in an empty box

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
  s.title = text;
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

function pause() {
  sendControl({ type: "session_pause" }); // no question: stopping the agent must be quick
}

function setupControls() {
  $("#btn-reset-context").addEventListener("click", () => sendControl({ type: "reset", session: SESSION },
    `Reset the context of ${SESSION}? The model starts from an empty context; the archive and durable work are kept.`));
  $("#btn-compact").addEventListener("click", () => sendControl({ type: "compact" }));
  $("#btn-reset").addEventListener("click", () => sendControl({ type: "reset", session: SESSION, kernel: true },
    `Reset the context and the workbench of ${SESSION}? Python state is lost; the next cell starts a new kernel generation.`));
  $("#btn-session-pause").addEventListener("click", pause);
  $("#btn-session-drain").addEventListener("click", () => sendControl({ type: "session_drain" },
    `Drain session ${SESSION}? It finishes accepted work, then stops.`));
  $("#btn-session-stop").addEventListener("click", () => sendControl({ type: "session_stop" },
    `Stop session ${SESSION} now?`));
  $("#btn-session-start").addEventListener("click", () => sendControl({ type: "session_start" }));
  $("#btn-rollback").addEventListener("click", () => sendControl({ type: "rollback" },
    `Roll ${SESSION} back to the release of its previous epoch?`));
  $("#btn-activate").addEventListener("click", () => {
    const release = $("#release-ref").value.trim();
    if (!release) { ctlStatus("activate: give a release id (or a prefix of 6+ hex digits)", true); return; }
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

// --- keyboard -------------------------------------------------------------
// Enter sends, Shift+Enter is a new line, ArrowUp in an empty box recalls the
// last message, Esc leaves the box; outside it, / focuses it, Ctrl+. (or
// Ctrl+Shift+P) pauses the session, e expands or collapses every long block,
// ? shows the keys.

function typing(e) {
  const t = e.target;
  return t && (t.tagName === "TEXTAREA" || t.tagName === "INPUT" || t.isContentEditable);
}

function setupKeys() {
  const box = $("#composer");
  box.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); submit(); }
    else if (e.key === "ArrowUp" && box.value === "" && lastSent) { e.preventDefault(); box.value = lastSent; }
    else if (e.key === "Escape") box.blur();
  });
  document.addEventListener("keydown", (e) => {
    if ((e.ctrlKey && e.key === ".") || (e.ctrlKey && e.shiftKey && (e.key === "P" || e.key === "p"))) {
      e.preventDefault(); pause(); return;
    }
    if (typing(e) || e.ctrlKey || e.metaKey || e.altKey) return;
    if (e.key === "/") { e.preventDefault(); box.focus(); }
    else if (e.key === "v") setView(view === "lanes" ? "conversation" : "lanes");
    else if (e.key === "p") togglePanels();
    else if (e.key === "c") toggleControls();
    else if (view !== "lanes" && (e.key === "j" || e.key === "k")) { e.preventDefault(); convFocus(e.key === "j" ? 1 : -1); }
    else if (view !== "lanes" && e.key === "G") { conv.list.scrollToEnd(); }
    else if (view !== "lanes" && e.key === "e") convToggleAll();
    else if (e.key === "?") { const k = $("#keys"); k.hidden = !k.hidden; }
    else if (e.key === "Escape") $("#keys").hidden = true;
    else if (e.key === "e") {
      const all = [...document.querySelectorAll("#lanes details.long")];
      const open = !all.some((d) => d.open);
      for (const d of all) d.open = open;
    }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  $("#h-session").textContent = SESSION;
  $("#btn-drain").addEventListener("click", () => control("drain", "Drain klbr-core? Admission closes, accepted work finishes, then it exits."));
  $("#btn-stop").addEventListener("click", () => control("stop", "Stop klbr-core? Running work is interrupted and it exits."));
  setupControls();
  setupKeys();
  setupConversation();
  setupPanels();
  setInterval(tick, 1000);
  connect();
});

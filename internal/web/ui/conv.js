// The conversation view: one column that reads as a chat. Operator input
// and the agent's delivered speech in order; between them, the agent's
// work (scratchpad, reasoning, cells with their output, tool calls that
// never ran, notices) as one block per stretch, collapsed by default and
// unmistakable from speech. Rendering is virtual: only the entries near the
// viewport are in the DOM, so 100,000 records keep a bounded page.
"use strict";

// --- virtual list -----------------------------------------------------------
// Entries have variable heights: estimated until rendered, then measured.
// The rendered window sits between two spacers; the entry at the top of
// the viewport stays put while heights above it change.

class VList {
  constructor(scroller, render) {
    this.sc = scroller;
    this.renderEntry = render;
    this.entries = [];
    this.tops = [0];          // tops[i]: the offset of entry i; tops[n]: the total height
    this.dirty = 0;           // tops are valid up to index dirty
    this.start = 0; this.end = 0;
    this.stick = true;        // follow the bottom as entries arrive
    this.pending = false;
    this.selfTop = -1;        // where the list last scrolled itself: that scroll event is not the reader's
    this.before = document.createElement("div");
    this.body = document.createElement("div");
    this.after = document.createElement("div");
    this.before.className = "vspacer"; this.after.className = "vspacer";
    this.body.className = "vbody";
    scroller.append(this.before, this.body, this.after);
    scroller.addEventListener("scroll", () => {
      // A scroll the list made itself keeps its mode; the reader's decides it.
      if (this.selfTop >= 0 && Math.abs(scroller.scrollTop - this.selfTop) < 2) this.selfTop = -1;
      else this.stick = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 80;
      this.schedule();
    }, { passive: true });
    if (window.ResizeObserver) new ResizeObserver(() => this.schedule()).observe(scroller);
  }
  push(e) { this.entries.push(e); this.tops.push(0); this.schedule(); }
  // changed marks entry e (re-render and re-measure it).
  changed(e) {
    e.node = null;
    const i = this.indexOf(e);
    if (i >= 0) this.dirty = Math.min(this.dirty, i);
    this.schedule();
  }
  remove(e) {
    const i = this.indexOf(e);
    if (i < 0) return;
    if (e.node) e.node.remove();
    this.entries.splice(i, 1);
    this.tops.pop();
    this.dirty = Math.min(this.dirty, i);
    this.schedule();
  }
  indexOf(e) {
    // Changes are nearly always near the end: search from there.
    for (let i = this.entries.length - 1; i >= 0; i--) if (this.entries[i] === e) return i;
    return -1;
  }
  schedule() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.render(); });
  }
  fix() {
    const n = this.entries.length;
    for (let i = this.dirty; i < n; i++) this.tops[i + 1] = this.tops[i] + this.entries[i].h;
    this.dirty = n;
  }
  find(y) { // the first entry whose bottom is below y
    let lo = 0, hi = this.entries.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.tops[mid + 1] <= y) lo = mid + 1; else hi = mid;
    }
    return lo;
  }
  render() {
    const sc = this.sc;
    if (!sc.clientHeight) return; // hidden: nothing to lay out
    this.fix();
    const n = this.entries.length;
    const view = sc.clientHeight;
    // Where the viewport will be: the bottom when following it.
    let top = this.stick ? Math.max(0, this.tops[n] - view) : sc.scrollTop;
    const over = 800;
    const start = this.find(Math.max(0, top - over));
    let end = Math.min(n, this.find(top + view + over) + 1);
    if (end - start > 300) end = start + 300;
    const anchor = this.find(top);
    const anchorOff = anchor < n ? this.tops[anchor] - top : 0;
    const nodes = [];
    for (let i = start; i < end; i++) {
      const e = this.entries[i];
      if (!e.node) e.node = this.renderEntry(e);
      nodes.push(e.node);
    }
    // Entries that left the window drop their nodes: the DOM stays bounded.
    for (let i = Math.min(this.start, n); i < Math.min(this.end, n); i++) {
      if (i < start || i >= end) this.entries[i].node = null;
    }
    const kids = this.body.children;
    let same = kids.length === nodes.length;
    for (let i = 0; same && i < nodes.length; i++) same = kids[i] === nodes[i];
    if (!same) this.body.replaceChildren(...nodes);
    this.start = start; this.end = end;
    // Measure what is rendered; heights that changed move what follows.
    for (let i = start; i < end; i++) {
      const e = this.entries[i];
      const h = e.node.offsetHeight;
      if (h && h !== e.h) { e.h = h; this.dirty = Math.min(this.dirty, i); }
    }
    this.fix();
    this.before.style.height = this.tops[start] + "px";
    this.after.style.height = (this.tops[n] - this.tops[end]) + "px";
    if (this.stick) top = Math.max(0, this.tops[n] - view);
    else if (anchor < n) top = Math.max(0, this.tops[anchor] - anchorOff);
    if (Math.abs(sc.scrollTop - top) > 1) { sc.scrollTop = top; this.selfTop = sc.scrollTop; }
  }
  // reveal scrolls entry i into view (estimated, then exact once rendered).
  reveal(i) {
    this.fix();
    this.stick = false;
    this.sc.scrollTop = Math.max(0, this.tops[i] - 40);
    this.render();
  }
  scrollToEnd() { this.stick = true; this.schedule(); }
}

// --- the model ----------------------------------------------------------------

const conv = {
  list: null,
  work: null,          // the open work block: later work records join it
  openCells: [],       // {item, entry, call, gen}: cell.started waiting for cell.finished
  live: new Map(),     // preview key → its live entry
  counts: { input: 0, speech: 0, work: 0 },
};

function estimate(text) {
  const n = typeof text === "string" ? text.length : 0;
  return 64 + 22 * Math.min(40, Math.ceil(n / 90));
}

function convPush(e) {
  e.h = e.h || 48;
  conv.list.push(e);
  return e;
}

const SPEECH_KIND = /^(local\.(sent|held)|discord\.)/;

// convAdd places one record (in seq order) in the conversation.
function convAdd(r, c) {
  if (!conv.list) return;
  if (r.lane === "input") {
    conv.work = null;
    conv.counts.input++;
    convPush({ type: "input", r, c, h: estimate(c.text) });
    return;
  }
  if (r.lane === "speech" && SPEECH_KIND.test(r.kind)) {
    conv.work = null;
    conv.counts.speech++;
    convPush({ type: "speech", r, c, h: estimate(c.text) });
    return;
  }
  if (r.kind === "context.compacted" || r.kind === "context.reset") {
    conv.work = null;
    convPush({ type: "divider", r, c, h: 40 });
    return;
  }
  // Work: joins the open block, or opens one.
  let w = conv.work;
  if (!w) {
    w = conv.work = convPush({ type: "work", items: [], open: false, h: 40, stats: { steps: 0, cells: 0, errors: 0, unrun: 0, notices: 0, partial: 0, warn: [] } });
    conv.counts.work++;
  }
  if (r.kind === "scratchpad") {
    const key = `${c.attempt}:${c.step}`;
    const l = conv.live.get(key);
    if (l) { conv.live.delete(key); conv.list.remove(l); }
  }
  if (r.kind === "cell.finished") {
    let i = c.tool_call_id ? conv.openCells.findIndex((x) => x.call === c.tool_call_id) : -1;
    // A collected outcome has lost its keys: it closes the oldest open cell.
    if (i < 0) i = r.collected ? (conv.openCells.length ? 0 : -1) : conv.openCells.findIndex((x) => x.gen === c.generation && (!c.tool_call_id || !x.call));
    if (i >= 0) {
      const o = conv.openCells.splice(i, 1)[0];
      o.item.fin = { r, c };
      if (c.status === "error" || c.status === "lost") o.entry.stats.errors++;
      conv.list.changed(o.entry);
      return;
    }
  }
  const item = { r, c };
  w.items.push(item);
  const s = w.stats;
  switch (r.kind) {
    case "scratchpad": s.steps++; if (c.partial) s.partial++; break;
    case "cell.started": s.cells++; conv.openCells.push({ item, entry: w, call: c.tool_call_id || "", gen: c.generation }); break;
    case "cell.finished": s.cells++; if (c.status === "error") s.errors++; break;
    case "tool.unrun": s.unrun++; break;
    default: {
      s.notices++;
      const t = r.lane === "notice" ? noticeText(r, c) : null;
      if (t && (t[1] === "warn" || t[1] === "pause")) s.warn.push(t[0]);
    }
  }
  conv.list.changed(w);
}

// --- rendering ----------------------------------------------------------------

function convRender(e) {
  switch (e.type) {
    case "input": return convInput(e);
    case "speech": return convSpeech(e);
    case "divider": return convDivider(e);
    case "live": return convLive(e);
    default: return convWork(e);
  }
}

function entryBox(cls, label) {
  const box = el("article", "entry " + cls);
  box.tabIndex = 0;
  box.setAttribute("aria-label", label);
  return box;
}

function convInput(e) {
  const { r, c } = e;
  const discord = c.source_kind === "discord" || r.kind === "discord.input";
  const where = c.conversation ? (typeof discordNames !== "undefined" && discordNames.get(c.conversation)) || c.conversation : "";
  // A job's end and a source's events are the host's, not the operator's.
  const host = c.source_kind === "job" || c.source_kind === "source";
  const who = discord ? `${c.author || "someone"} on Discord${where ? " · " + where : ""}` :
    host ? (c.source_kind === "job" ? "klbr · job" : `klbr · source ${c.author || ""}`.trim()) : "you";
  const label = discord ? "Discord message from " + (c.author || "someone") : host ? (c.source_kind === "job" ? "a job's end" : "a source's event") : "your message";
  const box = entryBox("msg in" + (discord ? " discord" : "") + (host ? " host" : ""), `${label}, ${clock(r.at)}`);
  const b = el("div", "bubble");
  b.appendChild(el("div", "who", `${who} · ${clock(r.at)}`));
  if (r.collected) b.appendChild(el("div", "text collected-note", collectedText(r)));
  else b.appendChild(el("div", "text", typeof c.text === "string" ? c.text : JSON.stringify(c)));
  box.appendChild(b);
  box.dataset.id = r.id; box.dataset.kind = r.kind;
  return box;
}

// A delivered message reads as speech; a held, failed, unknown or pending
// send is a card that says so, each in its own style.
function speechState(r) {
  if (r.kind === "local.held") return "held";
  if (r.kind === "local.sent") return "sent";
  const react = r.kind.startsWith("discord.react.");
  const outcome = react ? r.kind.slice("discord.react.".length) : r.kind.slice("discord.".length);
  return { sent: "sent", confirmed: "sent", failed: "failed", unknown: "unknown", pending: "pending", attempting: "pending" }[outcome] || outcome;
}

function convSpeech(e) {
  const { r, c } = e;
  const state = speechState(r);
  const discord = r.kind.startsWith("discord.");
  const label = { sent: "delivered", held: "held — not delivered", failed: "failed — not delivered", unknown: "delivery unknown", pending: "sending…" }[state] || state;
  const box = entryBox(`msg out st-${state}`, `agent ${discord ? "to Discord " + (c.conversation || "") : "message"}, ${label}, ${clock(r.at)}`);
  const b = el("div", "bubble");
  b.appendChild(el("div", "who", `agent${discord ? " → Discord " + (c.conversation || "") : ""} · ${clock(r.at)}`));
  if (r.collected) b.appendChild(el("div", "text collected-note", collectedText(r)));
  else if (r.kind.startsWith("discord.react.")) b.appendChild(el("div", "text", `reaction ${c.emoji || "?"}${c.target_message_id ? " on message " + c.target_message_id : ""}`));
  else b.appendChild(renderMarkdown(c.text ?? ""));
  const foot = el("div", "receipt");
  foot.appendChild(badge(label, state === "sent" ? "ok" : "warn"));
  // A Discord effect carries held_reason (already "held by delivery.review: …"); a local send, reason.
  if (state === "held") foot.appendChild(document.createTextNode(c.held_reason ? c.held_reason + " — it waits for you (Held sends)"
    : (c.fallback ? "held by the host (the review did not decide): " : "held by review: ") + (c.reason || "no reason given")));
  else if (state === "failed") foot.appendChild(document.createTextNode(`not delivered: ${[c.error_code, c.error].filter(Boolean).join(" ") || "failed"}`));
  else if (state === "unknown") foot.appendChild(document.createTextNode(`it may or may not have arrived${c.evidence ? ": " + c.evidence : c.error ? ": " + c.error : ""}`));
  else if (state === "sent" && discord) foot.appendChild(document.createTextNode(`delivered to Discord${c.message_id ? " · message " + c.message_id : ""}${c.reply_reference ? " · as a reply" : ""}`));
  else if (state === "sent" && c.reason) foot.appendChild(document.createTextNode(c.reason));
  b.appendChild(foot);
  box.appendChild(b);
  box.dataset.id = r.id; box.dataset.kind = r.kind;
  return box;
}

function convDivider(e) {
  const { r, c } = e;
  const box = entryBox("divider", r.kind === "context.reset" ? "context reset" : "context compacted");
  if (r.kind === "context.reset") {
    box.appendChild(el("div", "rule", `context reset — epoch ${c.epoch} starts empty${c.reason ? ": " + c.reason : ""}`));
  } else {
    const d = el("details", "summary-block");
    d.open = !!e.open;
    d.addEventListener("toggle", () => { e.open = d.open; conv.list.changed(e); });
    d.appendChild(el("summary", "rule", `context compacted — ${c.items} earlier records summarized; ${compactionMeasure(c)}`));
    d.appendChild(renderMarkdown(c.text ?? ""));
    d.appendChild(el("div", "meta", `originals: klbr-core history children ${c.summary}`));
    box.appendChild(d);
  }
  return box;
}

function workSummary(e) {
  const s = e.stats;
  const parts = [];
  if (s.steps) parts.push(plural(s.steps, "step"));
  if (s.cells) parts.push(plural(s.cells, "cell") + (s.errors ? ` (${s.errors} failed)` : ""));
  if (s.unrun) parts.push(plural(s.unrun, "tool call") + " not run");
  if (s.notices) parts.push(plural(s.notices, "notice"));
  return parts.join(" · ") || "work";
}

function convWork(e) {
  const only = !e.stats.steps && !e.stats.cells && !e.stats.unrun;
  const box = entryBox("work" + (e.open ? " open" : "") + (only ? " notices-only" : ""), `${only ? "notices" : "agent work"}: ${workSummary(e)}${e.open ? ", expanded" : ", collapsed"}`);
  const head = el("button", "work-head");
  head.type = "button";
  head.setAttribute("aria-expanded", e.open ? "true" : "false");
  head.appendChild(el("span", "chev", e.open ? "▾" : "▸"));
  head.appendChild(el("span", "work-label", only ? "notices" : "agent's work"));
  head.appendChild(el("span", "work-sum", workSummary(e)));
  if (e.stats.partial) head.appendChild(badge("interrupted — partial scratchpad", "warn"));
  const running = e.items.some((it) => it.r.kind === "cell.started" && !it.fin);
  if (running) head.appendChild(badge("running", "live"));
  const warn = e.stats.warn;
  if (warn.length) head.appendChild(el("span", "work-warn", warn[warn.length - 1]));
  // Opening a block keeps it where it is (the list stops following the bottom).
  head.addEventListener("click", () => { e.open = !e.open; conv.list.stick = false; conv.list.changed(e); });
  box.appendChild(head);
  // Each attempt of the block links its trace, opened or not.
  const traces = new Map();
  for (const it of e.items) {
    const id = it.c && it.c.trace_id;
    if (it.r.kind === "scratchpad" && typeof id === "string" && /^[0-9a-f]{32}$/.test(id) && !traces.has(id)) traces.set(id, it.c.attempt);
  }
  if (traces.size) {
    const tb = el("div", "work-traces");
    for (const [id, attempt] of traces) {
      const t = traceRef(id);
      t.firstChild.textContent = `attempt ${attempt ?? "?"} · trace `;
      tb.appendChild(t);
    }
    box.appendChild(tb);
  }
  if (!e.open) {
    // The gist without opening it: the last scratchpad text, one line.
    const last = [...e.items].reverse().find((it) => it.r.kind === "scratchpad" && typeof it.c.text === "string" && it.c.text.trim());
    if (last) box.appendChild(el("div", "work-gist", last.c.text.trim().split("\n")[0].slice(0, 200)));
    return box;
  }
  const body = el("div", "work-body");
  for (const it of e.items) body.appendChild(workItem(it));
  box.appendChild(body);
  return box;
}

// workItem renders one record of a work block with the lanes' renderers
// (their look stays: scratchpad, cell, notice are told apart by style).
function workItem(it) {
  const { r, c } = it;
  let n;
  if (r.collected) n = renderCollected(r);
  else if (r.kind === "scratchpad") n = renderScratchpad(r, c, true);
  else if (r.kind === "cell.started") {
    n = renderCellStarted(r, c, false);
    if (it.fin) {
      const out = n.querySelector(".cell-outcome");
      fillOutcome(out, it.fin.r, it.fin.c);
      n.classList.add("finished", `st-${it.fin.c.status || (it.fin.r.collected ? "collected" : "unknown")}`);
    }
  } else if (r.kind === "cell.finished") n = renderCellFinished(r, c);
  else if (r.kind === "tool.unrun") n = renderToolUnrun(r, c);
  else if (r.lane === "notice") n = renderNotice(r, c);
  else n = renderGeneric(r, c);
  n.classList.add("w-" + (r.lane || "other"));
  n.dataset.id = r.id; n.dataset.kind = r.kind;
  return n;
}

// --- live previews ------------------------------------------------------------

function convLiveFor(p) {
  if (!conv.list) return null;
  let e = conv.live.get(p.key);
  if (!e) {
    e = { type: "live", p, h: 80 };
    conv.live.set(p.key, e);
    convPush(e);
  }
  return e;
}

function convLive(e) {
  const p = e.p;
  const box = entryBox("work live", "the agent is writing (provisional)");
  box.appendChild(el("div", "who", `agent is writing… · attempt ${p.key.replace(":", " · step ")}`));
  box.appendChild(badge("live · provisional — not yet recorded", "live"));
  if (p.cut) box.appendChild(badge("incomplete: this page missed part of the stream", "warn"));
  const reasoning = el("div", "text reasoning-live");
  const text = el("div", "text live-text");
  const code = el("pre", "code");
  reasoning.textContent = p.convReasoning || "";
  text.textContent = p.convText || "";
  if (p.convCode) code.innerHTML = highlight(p.convCode); else code.hidden = true;
  box.append(reasoning, text, code);
  e.parts = { reasoning, text, code };
  return box;
}

// convLiveDelta grows the live entry of preview p.
function convLiveDelta(p, kind, t, code) {
  const e = convLiveFor(p);
  if (!e) return;
  if (kind === "content") p.convText = (p.convText || "") + (t || "");
  else if (kind === "reasoning") p.convReasoning = (p.convReasoning || "") + (t || "");
  else if (kind === "tool") p.convCode = code;
  if (e.node && e.parts) {
    // Appending a text node is cheap; the entry is re-measured on the next frame.
    if (kind === "content" && t) appendText(e.parts.text, t);
    else if (kind === "reasoning" && t) appendText(e.parts.reasoning, t);
    else if (kind === "tool" && code != null) { e.parts.code.hidden = false; e.parts.code.innerHTML = highlight(code); }
    conv.list.schedule();
  } else conv.list.changed(e);
}

function convLiveGap(p) {
  const e = conv.live.get(p.key);
  if (e) conv.list.changed(e);
}

// --- keyboard -----------------------------------------------------------------
// j / k move between entries, Enter or Space opens a work block, G goes to
// the newest.

function convFocus(delta) {
  const list = conv.list;
  if (!list || !list.entries.length) return;
  const cur = document.activeElement && document.activeElement.closest ? document.activeElement.closest("#conv .entry") : null;
  let i = cur ? list.entries.findIndex((x) => x.node === cur) : -1;
  if (i < 0) i = delta > 0 ? list.start - 1 : list.end;
  i = Math.max(0, Math.min(list.entries.length - 1, i + delta));
  const e = list.entries[i];
  if (!e.node) list.reveal(i);
  else list.stick = false;
  const n = e.node;
  if (n) { n.focus({ preventScroll: false }); n.scrollIntoView({ block: "nearest" }); }
}

function convToggleAll() {
  const list = conv.list;
  const works = list.entries.filter((x) => x.type === "work");
  const open = !works.some((x) => x.open);
  for (const w of works) { w.open = open; w.node = null; }
  list.dirty = 0;
  list.schedule();
}

function setupConversation() {
  const sc = document.getElementById("conv");
  conv.list = new VList(sc, convRender);
  sc.addEventListener("keydown", (ev) => {
    if (ev.target.classList && ev.target.classList.contains("entry") && (ev.key === "Enter" || ev.key === " ")) {
      const e = conv.list.entries.find((x) => x.node === ev.target);
      if (e && e.type === "work") {
        ev.preventDefault();
        e.open = !e.open;
        conv.list.stick = false;
        conv.list.changed(e);
        requestAnimationFrame(() => requestAnimationFrame(() => e.node && e.node.focus()));
      }
    }
  });
}

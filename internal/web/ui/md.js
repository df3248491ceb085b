// A small Markdown renderer for the agent's speech and scratchpad. It builds
// DOM nodes (createElement, text nodes), never HTML strings, so no markup in
// the text can reach the page: raw HTML shows as the text it is. It renders
// a safe subset: paragraphs, headings (as strong lines), *emphasis*,
// **strong**, `inline code`, fenced code blocks (Python highlighted), bullet
// and numbered lists, block quotes, and [links](url) whose URL is http,
// https or mailto (anything else stays text). Hand-written rather than a
// library: the subset is small, and the page stays build-free.
"use strict";

const MD_MAX = 200000; // longer text is shown plain (it is folded anyway)

function mdSafeURL(u) {
  const s = u.trim();
  if (!/^(https?:\/\/|mailto:)/i.test(s)) return null;
  try {
    const url = new URL(s);
    return ["http:", "https:", "mailto:"].includes(url.protocol) ? url.href : null;
  } catch (_) { return null; }
}

// mdInline appends the inline content of text to parent.
function mdInline(parent, text) {
  // code first (its content is literal), then links, strong, emphasis.
  const re = /(`+)([\s\S]*?[^`])\1(?!`)|\[([^\]\n]{1,500})\]\(([^()\s]{1,2000})\)|\*\*(?=\S)([\s\S]*?\S)\*\*|__(?=\S)([\s\S]*?\S)__|\*(?=[^\s*])([^*\n]*?[^\s*])\*|(?<![\w])_(?=[^\s_])([^_\n]*?[^\s_])_(?![\w])|(https?:\/\/[^\s<>()"']{1,2000}[^\s<>()"'.,;:!?])/g;
  let last = 0, m;
  while ((m = re.exec(text)) !== null) {
    if (m.index > last) parent.appendChild(document.createTextNode(text.slice(last, m.index)));
    if (m[1]) {
      const c = document.createElement("code");
      c.textContent = m[2].replace(/^ (.*) $/, "$1");
      parent.appendChild(c);
    } else if (m[3] !== undefined) {
      const href = mdSafeURL(m[4]);
      if (href) {
        const a = document.createElement("a");
        a.href = href;
        a.rel = "noopener noreferrer nofollow";
        a.target = "_blank";
        mdInline(a, m[3]);
        parent.appendChild(a);
      } else parent.appendChild(document.createTextNode(m[0]));
    } else if (m[5] !== undefined || m[6] !== undefined) {
      const s = document.createElement("strong");
      mdInline(s, m[5] !== undefined ? m[5] : m[6]);
      parent.appendChild(s);
    } else if (m[7] !== undefined || m[8] !== undefined) {
      const e = document.createElement("em");
      mdInline(e, m[7] !== undefined ? m[7] : m[8]);
      parent.appendChild(e);
    } else if (m[9]) {
      const href = mdSafeURL(m[9]);
      if (href) {
        const a = document.createElement("a");
        a.href = href;
        a.rel = "noopener noreferrer nofollow";
        a.target = "_blank";
        a.textContent = m[9];
        parent.appendChild(a);
      } else parent.appendChild(document.createTextNode(m[9]));
    }
    last = re.lastIndex;
  }
  if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
}

const MD_LIST = /^(\s{0,3})([-*+]|\d{1,9}[.)])\s+(.*)$/;

// renderMarkdown returns a div.md with text rendered.
function renderMarkdown(text, cls) {
  const root = document.createElement("div");
  root.className = "md" + (cls ? " " + cls : "");
  if (typeof text !== "string") return root;
  if (text.length > MD_MAX) { root.classList.add("plain"); root.textContent = text; return root; }
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  let para = [];
  const flush = () => {
    if (!para.length) return;
    const p = document.createElement("p");
    para.forEach((l, j) => {
      if (j) p.appendChild(document.createElement("br"));
      mdInline(p, l);
    });
    root.appendChild(p);
    para = [];
  };
  while (i < lines.length) {
    const line = lines[i];
    const fence = /^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/.exec(line);
    if (fence) {
      flush();
      const close = fence[1];
      const lang = fence[2].toLowerCase();
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trimStart().startsWith(close)) body.push(lines[i++]);
      i++; // the closing fence (or the end)
      const code = body.join("\n");
      const pre = document.createElement("pre");
      pre.className = "code md-code";
      if (lang) pre.dataset.lang = lang;
      if (lang === "" || lang === "python" || lang === "py") pre.innerHTML = highlight(code); // tokens are escaped in highlight
      else pre.textContent = code;
      root.appendChild(pre);
      continue;
    }
    if (/^\s*$/.test(line)) { flush(); i++; continue; }
    const h = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/.exec(line);
    if (h) {
      flush();
      const e = document.createElement("p");
      e.className = "md-h md-h" + h[1].length;
      const s = document.createElement("strong");
      mdInline(s, h[2]);
      e.appendChild(s);
      root.appendChild(e);
      i++;
      continue;
    }
    if (/^\s{0,3}>/.test(line)) {
      flush();
      const q = [];
      while (i < lines.length && /^\s{0,3}>/.test(lines[i])) q.push(lines[i++].replace(/^\s{0,3}>\s?/, ""));
      const bq = document.createElement("blockquote");
      bq.appendChild(renderMarkdown(q.join("\n")));
      root.appendChild(bq);
      continue;
    }
    const li = MD_LIST.exec(line);
    if (li) {
      flush();
      const ordered = /\d/.test(li[2]);
      const list = document.createElement(ordered ? "ol" : "ul");
      if (ordered) { const n = parseInt(li[2], 10); if (n !== 1) list.start = n; }
      while (i < lines.length) {
        const m = MD_LIST.exec(lines[i]);
        if (!m || /\d/.test(m[2]) !== ordered) break;
        const item = document.createElement("li");
        const parts = [m[3]];
        i++;
        // continuation lines: indented, not a new item
        while (i < lines.length && /^\s{2,}\S/.test(lines[i]) && !MD_LIST.exec(lines[i])) parts.push(lines[i++].trim());
        parts.forEach((p, j) => { if (j) item.appendChild(document.createElement("br")); mdInline(item, p); });
        list.appendChild(item);
      }
      root.appendChild(list);
      continue;
    }
    para.push(line);
    i++;
  }
  flush();
  return root;
}

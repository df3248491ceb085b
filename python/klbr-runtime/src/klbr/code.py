"""``klbr.code``: source snapshots, structural symbols, checked patches.

Explore fuzzily, mutate exactly::

    src = await code.open("src/agent.py")       # a snapshot: bytes, language, sha256
    src.errors                                  # parse errors of partially invalid source
    sym = src.symbols.exact("run_turn").one()   # or .match("turn"), .kind("method")
    print(sym.text)
    patch = sym.replace_declaration(new_text)   # or sym.replace_body(new_body)
    print(patch.diff)
    await patch.apply()                         # refuses if the file changed since open

- ``code.open(path, language=None)``: the file's bytes, its language and how
  it was detected, ``sha256``, ``provenance``, ``errors``, ``symbols``.
- ``src.symbols``: definitions found by the release's named query
  ``queries/<language>/symbols.scm`` (kind, name, container, byte and line
  ranges, the query line that found each). ``.exact(name)`` (a name or a
  qualified name such as ``"Greeter.greet"``), ``.match(regex)``
  (case-insensitive, on qualified names), ``.kind(*kinds)``, ``.one()``
  (``AmbiguousSymbol`` lists the candidates; ``SymbolNotFound`` is another
  error).
- ``sym.replace_declaration(new)`` replaces the whole declaration;
  ``sym.replace_body(new)`` only its body. Both return a ``Patch``:
  ``patch.diff``, ``patch + other`` (combine), ``await patch.apply()``.
- ``await src.query("(call) @c")`` runs a raw query, ``await
  src.query("references")`` a named one of the release. A query the
  language lacks raises ``MissingQuery`` or ``QueryError``; it never looks
  like an empty result.
- ``await code.references(name, path=".")``: best-effort textual and
  tree-sitter matches, labeled as such: not compiler-backed resolution.
- ``await code.languages()``: the grammars and each language's queries.
- ``src.replace(old, new, count=1)``: an exact text replace, as a checked
  Patch; it works in every language, with or without a grammar. A language
  klbr-core has no grammar for (Nix: ``text_only`` in ``languages()``) opens
  as text: ``src.symbols`` and ``src.query`` raise ``NoGrammar`` and say so.

Ranges are UTF-8 byte offsets into ``src.bytes`` (``start_byte`` inclusive,
``end_byte`` exclusive); lines are 1-based, columns are 0-based bytes.

Paths follow the workspace rules (``klbr.workspace``): relative to the
workspace, never resolving outside it (``WorkspaceEscape``). See
``SYMLINK_POLICY`` for what a patch does with symlinks. A content hash check
is not an atomic compare-and-swap against other editors: serialize the
changes within one workspace, and give separate agents separate worktrees.
"""

import builtins
import os
import re
import time

from . import _sdk
from ._sdk import HostError, request

__all__ = ["open", "references", "languages", "combine", "Source", "Symbol", "Symbols",
           "Patch", "Applied", "QueryResult", "Capture", "ParseError", "References", "Reference",
           "CodeError", "UnsupportedLanguage", "NoGrammar", "TextNotFound", "MissingQuery", "QueryError", "ParseLimit",
           "SymbolNotFound",
           "AmbiguousSymbol", "StalePatch", "OverlappingEdits", "UnrelatedFile",
           "ConflictingSnapshots", "PartialApply", "SYMLINK_POLICY", "MAX_SOURCE_BYTES"]

MAX_SOURCE_BYTES = 768 * 1024  # one protocol frame carries the source to the host's parser

SYMLINK_POLICY = (
    "code.open resolves a path once, inside the workspace: a symlink whose target stays in the "
    "workspace is followed (src.abspath is the target), any other raises WorkspaceEscape. "
    "patch.apply writes the resolved target through a temporary file and a rename in its "
    "directory, keeping its permission bits: a symlink stays a symlink to the edited file, while "
    "hard links to it keep the old content. apply refuses (UnrelatedFile) when the path no "
    "longer resolves to the file that was opened.")


# -- errors ----------------------------------------------------------------------


class CodeError(Exception):
    """Base of klbr.code's errors."""


class UnsupportedLanguage(CodeError):
    """No grammar for the file (or for the language= given)."""


class NoGrammar(UnsupportedLanguage):
    """The file's language is known but klbr-core has no grammar for it
    (Nix): it is text only. Search it, and change it with ``src.replace``
    (an exact replace, checked like every patch); there are no symbols."""


class TextNotFound(CodeError, LookupError):
    """``src.replace`` found the text a different number of times than
    ``count`` said. ``found`` is how many times, ``lines`` where."""

    def __init__(self, message, found, lines):
        super().__init__(message)
        self.found, self.lines = found, list(lines)


class MissingQuery(CodeError):
    """The release has no such named query for this language
    (``queries/<language>/<name>.scm``). Not an empty result."""


class QueryError(CodeError, ValueError):
    """The language's grammar refuses the query: a node type or field it
    does not have, bad syntax, an impossible pattern."""


class ParseLimit(CodeError):
    """The host stopped the parse at one of its bounds (size, time or
    memory: docs/code.md). The source is too large or pathological, such as
    deeply nested brackets: read it with open_file and search it instead."""


class SymbolNotFound(CodeError, LookupError):
    """No symbol matched. ``suggestions`` holds close names."""

    def __init__(self, message, suggestions=()):
        super().__init__(message)
        self.suggestions = list(suggestions)


class AmbiguousSymbol(CodeError, LookupError):
    """More than one symbol matched where one was needed: ``candidates``."""

    def __init__(self, message, candidates):
        super().__init__(message)
        self.candidates = list(candidates)


class StalePatch(CodeError):
    """The file changed after it was opened: its hash is no longer the
    patch's base. Open it again and redo the edit."""

    def __init__(self, message, path, expected, actual):
        super().__init__(message)
        self.path, self.expected, self.actual = path, expected, actual


class OverlappingEdits(CodeError, ValueError):
    """Two edits of one file touch the same bytes (or insert at one point)."""


class UnrelatedFile(CodeError):
    """The path no longer resolves to the file the patch was made for."""


class ConflictingSnapshots(CodeError, ValueError):
    """Patches of one file made from different snapshots cannot be combined."""


class PartialApply(CodeError):
    """A multi-file apply stopped part way. ``written`` lists the files that
    were written (they stay written), ``failed`` the one that failed,
    ``not_written`` the rest, ``cause`` the error."""

    def __init__(self, message, written, failed, not_written, cause):
        super().__init__(message)
        self.written, self.failed, self.not_written, self.cause = written, failed, not_written, cause


_ERRORS = {"unsupported_language": UnsupportedLanguage, "no_grammar": NoGrammar, "missing_query": MissingQuery,
           "query_error": QueryError, "parse_limit": ParseLimit}


async def _host(op, args):
    try:
        return await request(op, args)
    except HostError as e:
        cls = _ERRORS.get(e.code)
        if cls is not None:
            raise cls(e.message) from None
        raise


def _sha(data):
    import hashlib
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _decode(b):
    return b.decode("utf-8", "surrogateescape")


def _encode(s):
    return s.encode("utf-8", "surrogateescape")


def _parse_args(data, path, language, queries=(), raw=None):
    args = {"path": path}
    try:
        args["text"] = data.decode("utf-8")
    except UnicodeDecodeError:
        import base64
        args["b64"] = base64.b64encode(data).decode("ascii")
    if language:
        args["language"] = language
    if queries:
        args["queries"] = list(queries)
    if raw:
        args["raw"] = raw
    return args


def _expand(qr):
    """A query result from the host's compact form (tables of capture names
    and node kinds; each match [pattern, [[name, node, start_byte, end_byte,
    start_row, start_col, end_row, end_col], ...]]) to dicts."""
    names, nodes = qr.get("capture_names") or [], qr.get("node_kinds") or []
    matches = []
    for pattern, caps in qr.get("matches") or []:
        matches.append({"pattern": pattern, "captures": [
            {"name": names[c[0]], "node": nodes[c[1]], "start_byte": c[2], "end_byte": c[3],
             "start": (c[4], c[5]), "end": (c[6], c[7])} for c in caps]})
    return dict(qr, matches=matches)


# -- results ----------------------------------------------------------------------


class _Span:
    __slots__ = ()

    @property
    def line(self):
        """1-based first line."""
        return self.start[0] + 1

    @property
    def end_line(self):
        """1-based last line (the line holding the last byte)."""
        row, col = self.end
        return row + 1 if col > 0 or row == self.start[0] else row


class ParseError(_Span):
    """One parse error of partially invalid source: ``kind`` is ``error``
    (text the grammar could not place) or ``missing`` (a token the parser
    had to assume, ``node`` names it)."""

    __slots__ = ("source", "kind", "node", "start_byte", "end_byte", "start", "end")

    def __init__(self, source, d):
        self.source, self.kind, self.node = source, d["kind"], d["node"]
        self.start_byte, self.end_byte = d["start_byte"], d["end_byte"]
        self.start, self.end = tuple(d["start"]), tuple(d["end"])

    @property
    def text(self):
        return _decode(self.source.bytes[self.start_byte:self.end_byte])

    def __repr__(self):
        what = f"missing {self.node}" if self.kind == "missing" else "syntax error"
        snippet = self.text if len(self.text) <= 60 else self.text[:57] + "..."
        return (f"<ParseError {what} at {self.source.path}:{self.line}:{self.start[1]} "
                f"(bytes {self.start_byte}-{self.end_byte}) {snippet!r}>")


class Capture(_Span):
    """One captured node: ``name`` (the @capture), ``node`` (its kind),
    byte and line ranges, ``text``."""

    __slots__ = ("source", "name", "node", "start_byte", "end_byte", "start", "end")

    def __init__(self, source, c):
        self.source, self.name, self.node = source, c["name"], c["node"]
        self.start_byte, self.end_byte = c["start_byte"], c["end_byte"]
        self.start, self.end = tuple(c["start"]), tuple(c["end"])

    @property
    def text(self):
        return _decode(self.source.bytes[self.start_byte:self.end_byte])

    def __repr__(self):
        t = self.text
        t = t if len(t) <= 60 else t[:57] + "..."
        return f"<@{self.name} {self.node} {self.source.path}:{self.line} bytes {self.start_byte}-{self.end_byte} {t!r}>"


class QueryResult:
    """What a query found: ``matches`` (each a dict of capture name to a
    list of Capture, plus ``pattern`` and ``line``), ``captures(name)``
    (flat, in match order), ``truncated`` when the host's cap cut it."""

    def __init__(self, source, qr):
        self.source, self.name, self.origin = source, qr["name"], qr["from"]
        self.truncated = bool(qr.get("truncated"))
        lines = qr.get("pattern_lines") or []
        self.matches = []
        for m in qr["matches"]:
            d = {"pattern": m["pattern"], "line": lines[m["pattern"]] if m["pattern"] < len(lines) else None}
            for c in m["captures"]:
                d.setdefault(c["name"], []).append(Capture(source, c))
            self.matches.append(d)

    def captures(self, name=None):
        out = []
        for m in self.matches:
            for k, v in m.items():
                if k not in ("pattern", "line") and (name is None or k == name):
                    out.extend(v)
        return out

    def __len__(self):
        return len(self.matches)

    def __iter__(self):
        return iter(self.matches)

    def __getitem__(self, i):
        return self.matches[i]

    def __repr__(self):
        head = f"<QueryResult {self.name} ({self.origin}) on {self.source.path}: {len(self.matches)} matches"
        head += ", truncated by the host's cap>" if self.truncated else ">"
        lines = [head]
        for c in self.captures()[:20]:
            lines.append("  " + repr(c))
        if len(self.captures()) > 20:
            lines.append(f"  ... ({len(self.captures())} captures)")
        return "\n".join(lines)


# -- symbols ----------------------------------------------------------------------

_CONTAINERS = ("class", "impl", "trait", "interface", "struct", "module")


class Symbol(_Span):
    """A definition in one snapshot: ``kind``, ``name``, ``container``
    (qualified name of what it is in, or None), ``qualname``, byte and
    line ranges of the declaration (``start_byte``..``end_byte``), of its
    name (``name_range``) and body (``body_range``, or None), and ``query``
    (the query file and line that found it). ``text`` and ``body`` read the
    snapshot; ``replace_declaration`` and ``replace_body`` make patches."""

    __slots__ = ("source", "kind", "name", "container", "qualname", "scope", "parent",
                 "start_byte", "end_byte", "start", "end", "name_range", "body_range", "query", "_pattern")

    @property
    def path(self):
        return self.source.path

    @property
    def text(self):
        """The declaration's exact text (its first line starts at the
        declaration, not at the line's start)."""
        return _decode(self.source.bytes[self.start_byte:self.end_byte])

    @property
    def body(self):
        """The body's exact text, or None for a symbol without one."""
        if self.body_range is None:
            return None
        a, b = self.body_range
        return _decode(self.source.bytes[a:b])

    def _indent_at(self, offset):
        data = self.source.bytes
        start = data.rfind(b"\n", 0, offset) + 1
        i = start
        while i < offset and data[i:i + 1] in (b" ", b"\t"):
            i += 1
        return _decode(data[start:i])

    @property
    def indent(self):
        """The leading whitespace of the line the declaration starts on."""
        return self._indent_at(self.start_byte)

    def _new(self, new, at, dedented):
        if not isinstance(new, str):
            raise TypeError(f"the replacement is a str, not {type(new).__name__}")
        if dedented:
            ind = self._indent_at(at)
            lines = new.split("\n")
            new = "\n".join([lines[0]] + [ind + ln if ln.strip() else ln for ln in lines[1:]])
        return _encode(new)

    def replace_declaration(self, new, dedented=False):
        """A Patch replacing the whole declaration (``self.text``) with
        ``new``. The text goes in as given: the first line continues at the
        declaration's column and later lines keep their own indentation (as
        ``self.text`` shows them). With ``dedented=True`` every later line
        gets ``self.indent`` prepended."""
        data = self._new(new, self.start_byte, dedented)
        return Patch._single(self.source, [(self.start_byte, self.end_byte, data)],
                             f"replace declaration of {self.kind} {self.qualname}")

    def replace_body(self, new, dedented=False):
        """A Patch replacing only the body (``self.body``: for brace languages
        the block with its braces, for Python the indented statements) with
        ``new``; the signature stays. ``dedented=True`` prepends the body's
        first line's indentation to every later line."""
        if self.body_range is None:
            raise CodeError(f"{self.kind} {self.qualname} has no body in {self.query}; "
                            "use replace_declaration")
        a, b = self.body_range
        data = self._new(new, a, dedented)
        return Patch._single(self.source, [(a, b, data)], f"replace body of {self.kind} {self.qualname}")

    def __repr__(self):
        return (f"<Symbol {self.kind} {self.qualname} {self.path}:{self.line}-{self.end_line} "
                f"bytes {self.start_byte}-{self.end_byte}>")


class Symbols:
    """A selection of symbols, in file order. Narrow it with ``exact``,
    ``match`` and ``kind``; take the single one with ``one()``."""

    truncated = False  # the host's reply bound cut the symbol list short (a huge file)

    def __init__(self, source, items, desc):
        self.source, self.items, self.desc = source, list(items), desc

    def _sub(self, items, what):
        sub = Symbols(self.source, items, f"{self.desc}.{what}")
        sub.truncated = self.truncated
        return sub

    def exact(self, name):
        """Symbols whose name or qualified name is exactly ``name``."""
        if not isinstance(name, str):
            raise TypeError("exact() takes a str name")
        return self._sub([s for s in self.items if s.name == name or s.qualname == name], f"exact({name!r})")

    def match(self, pattern):
        """Symbols whose qualified name contains a match of ``pattern``
        (a regex, case-insensitive): for looking around, not for editing."""
        rx = re.compile(pattern, re.IGNORECASE)
        return self._sub([s for s in self.items if rx.search(s.qualname)], f"match({pattern!r})")

    def kind(self, *kinds):
        """Symbols of these kinds (``function``, ``method``, ``class``, ...)."""
        return self._sub([s for s in self.items if s.kind in kinds], "kind(" + ", ".join(map(repr, kinds)) + ")")

    def one(self):
        """The single symbol of this selection: SymbolNotFound when there is
        none, AmbiguousSymbol (listing the candidates) when there are more."""
        if len(self.items) == 1:
            return self.items[0]
        if not self.items:
            names = sorted({s.qualname for s in self.source.symbols.items} | {s.name for s in self.source.symbols.items})
            target = re.findall(r"\((?:'|\")(.*?)(?:'|\")\)", self.desc)
            import difflib
            close = difflib.get_close_matches(target[-1], names, n=5) if target else []
            hint = f"; close names: {', '.join(close)}" if close else ""
            if self.truncated:
                hint += " (the symbol list is truncated: the file is too large for one reply)"
            raise SymbolNotFound(f"no symbol in {self.source.path} for {self.desc}{hint}", close)
        lines = "\n".join(f"  {s!r}" for s in self.items[:30])
        raise AmbiguousSymbol(
            f"{len(self.items)} symbols in {self.source.path} for {self.desc}; narrow it with a qualified "
            f"name, .kind(...), or index one:\n{lines}", self.items)

    def names(self):
        return [s.qualname for s in self.items]

    def __len__(self):
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    def __getitem__(self, i):
        return self.items[i]

    def __bool__(self):
        return bool(self.items)

    def __repr__(self):
        head = f"<Symbols {self.desc}: {len(self.items)}" + (", truncated>" if self.truncated else ">")
        body = [f"  {s.kind:<10} {s.qualname}  (lines {s.line}-{s.end_line})" for s in self.items[:60]]
        if len(self.items) > 60:
            body.append(f"  ... {len(self.items) - 60} more; narrow with .match() or .kind()")
        return "\n".join([head] + body)


def _build_symbols(source, qr):
    lines = qr.get("pattern_lines") or []
    found = {}
    for m in qr["matches"]:
        caps = {}
        kind = None
        for c in m["captures"]:
            n = c["name"]
            if n.startswith("definition."):
                kind = n[len("definition."):]
                caps["decl"] = c
            elif n in ("name", "body", "container"):
                caps.setdefault(n, c)
        if kind is None or "name" not in caps:
            continue
        d, nm = caps["decl"], caps["name"]
        key = (nm["start_byte"], nm["end_byte"])
        size = d["end_byte"] - d["start_byte"]
        prev = found.get(key)
        # The larger declaration wins (decorators, export), then the earlier pattern.
        if prev is None or size > prev[0] or (size == prev[0] and m["pattern"] < prev[1]):
            found[key] = (size, m["pattern"], kind, caps)
    syms = []
    for size, pattern, kind, caps in found.values():
        s = Symbol.__new__(Symbol)
        d = caps["decl"]
        s.source, s.kind, s._pattern = source, kind, pattern
        s.start_byte, s.end_byte, s.start, s.end = d["start_byte"], d["end_byte"], tuple(d["start"]), tuple(d["end"])
        nm = caps["name"]
        s.name_range = (nm["start_byte"], nm["end_byte"])
        bare = _decode(source.bytes[nm["start_byte"]:nm["end_byte"]])
        s.scope = bare
        s.name = f"impl {bare}" if kind == "impl" else bare
        b = caps.get("body")
        s.body_range = (b["start_byte"], b["end_byte"]) if b else None
        s.container = None
        if "container" in caps:
            c = caps["container"]
            s.container = _decode(source.bytes[c["start_byte"]:c["end_byte"]])
        line = lines[pattern] if pattern < len(lines) else "?"
        s.query = f"{qr['from']}:{line}"
        s.parent = None
        syms.append(s)
    syms.sort(key=lambda s: (s.start_byte, -s.end_byte, s._pattern))
    stack = []
    for s in syms:
        while stack and not (stack[-1].start_byte <= s.start_byte and s.end_byte <= stack[-1].end_byte):
            stack.pop()
        for p in reversed(stack):
            if (p.start_byte, p.end_byte) != (s.start_byte, s.end_byte):
                s.parent = p
                break
        stack.append(s)
    for s in syms:  # in file order: a parent is done before its children
        p = s.parent
        if s.container is None and p is not None:
            s.container = p.qualname if p.kind != "impl" else p.scope
        if s.kind == "function" and (s.container is not None and (p is None or p.kind in _CONTAINERS)):
            s.kind = "method"
        prefix = s.container + "." if s.container else ""
        s.qualname = prefix + s.name
        if p is not None and p.kind != "impl":
            s.scope = prefix + s.scope
        elif s.container:
            s.scope = s.container + "." + s.scope
    return syms


# -- sources ----------------------------------------------------------------------


class Source:
    """A snapshot of one workspace file: ``bytes`` as read, ``text``,
    ``language`` and ``detected_by``, ``sha256``, ``provenance`` (where and
    when it was read, the grammar, the query files), ``errors`` (parse errors;
    empty for valid source) and ``symbols``."""

    def __init__(self, workspace, path, abspath, data, stat, res, symbols_error=None, requested=None):
        self.text_only = isinstance(symbols_error, NoGrammar)
        self.workspace, self.path, self.abspath, self.bytes = workspace, path, abspath, data
        self.requested = path if requested is None else requested
        self.sha256 = _sha(data)
        self.language, self.detected_by = res["language"], res.get("detected_by", "")
        self.grammar = res["grammar"]
        self._stat = stat
        self.errors = [ParseError(self, d) for d in res.get("errors") or []]
        self.errors_truncated = bool(res.get("errors_truncated"))
        self._symbols_error = symbols_error
        self._symbols = None
        qs = {q["name"]: _expand(q) for q in res.get("queries") or []}
        if "symbols" in qs:
            self._symbols = Symbols(self, _build_symbols(self, qs["symbols"]), "symbols")
            self._symbols.truncated = bool(qs["symbols"].get("truncated"))
            self._symbols_from = qs["symbols"]["from"]
        else:
            self._symbols_from = None
        self.provenance = {
            "path": path, "abspath": abspath, "workspace": workspace.root,
            "requested": self.requested,
            "via_symlink": os.path.normpath(os.path.join(workspace.root, self.requested)) != abspath,
            "size": len(data), "mode": oct(stat.st_mode & 0o7777), "mtime_ns": stat.st_mtime_ns,
            "read_at": time.time(), "sha256": self.sha256, "language": self.language,
            "detected_by": self.detected_by, "grammar": self.grammar, "symbols_query": self._symbols_from,
            "parse_us": res.get("parse_us"), "query_us": res.get("query_us"),
        }

    @property
    def text(self):
        return _decode(self.bytes)

    @property
    def symbols(self):
        """Every definition the release's symbols query finds (a Symbols)."""
        if self.text_only:
            raise NoGrammar(str(self._symbols_error))
        if self._symbols is None:
            raise MissingQuery(self._symbols_error or f"{self.language} has no symbols query")
        return self._symbols

    def replace(self, old, new, count=1):
        """A Patch replacing the exact text ``old`` with ``new``, bound to this
        snapshot like every patch (``apply`` refuses a file that changed).
        ``old`` must occur exactly ``count`` times (``count=None``: at least
        once, all replaced); otherwise ``TextNotFound`` says how often and on
        which lines, so a replace never lands somewhere unmeant."""
        if not isinstance(old, str) or not isinstance(new, str):
            raise TypeError("replace(old, new) takes two str")
        if not old:
            raise ValueError("replace: old is empty; give the exact text to replace")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            raise ValueError(f"replace: count must be an int >= 1 or None, got {count!r}")
        needle, data, offs, at = _encode(old), self.bytes, [], 0
        while (i := data.find(needle, at)) >= 0:
            offs.append(i)
            at = i + len(needle)
        if not offs or (count is not None and len(offs) != count):
            lines = [self.line_of(o) for o in offs]
            want = "at least once" if count is None else f"{count} time{'s' if count != 1 else ''}"
            where = f" (lines {', '.join(map(str, lines[:20]))})" if lines else ""
            raise TextNotFound(f"{self.path}: the text occurs {len(offs)} time{'s' if len(offs) != 1 else ''}"
                               f"{where}, expected {want}; quote more context to make it unique, or pass count=",
                               len(offs), lines)
        rep = _encode(new)
        return Patch._single(self, [(o, o + len(needle), rep) for o in offs],
                             f"replace {len(offs)} occurrence{'s' if len(offs) != 1 else ''} in {self.path}")

    async def query(self, q, language=None):
        """Run a raw query (an S-expression with @captures) or, given a bare
        name such as ``"references"``, the release's
        ``queries/<language>/<name>.scm``. Returns a QueryResult; a query the
        language lacks raises MissingQuery or QueryError."""
        if not isinstance(q, str) or not q.strip():
            raise TypeError("query() takes a query string or a query name")
        if self.text_only and language is None:
            raise NoGrammar(str(self._symbols_error))
        named = re.fullmatch(r"[a-z][a-z0-9_]{0,31}", q) is not None
        args = _parse_args(self.bytes, self.path, language or self.language,
                           queries=[q] if named else (), raw=None if named else q)
        res = await _host("code.parse", args)
        return QueryResult(self, _expand(res["queries"][0]))

    def line_of(self, byte_offset):
        """The 1-based line holding ``byte_offset``."""
        return self.bytes.count(b"\n", 0, byte_offset) + 1

    def __repr__(self):
        if self.text_only:
            return (f"<Source {self.path} {self.language} ({self.detected_by}) {len(self.bytes)} bytes "
                    f"{self.sha256[:19]}…: text only (no grammar: no symbols; src.replace for edits)>")
        n = len(self._symbols) if self._symbols is not None else "no symbols query"
        err = f", {len(self.errors)} parse errors" if self.errors else ", parses cleanly"
        return (f"<Source {self.path} {self.language} ({self.detected_by}) {len(self.bytes)} bytes "
                f"{self.sha256[:19]}…: {n} symbols{err}>")


async def open(path, language=None, workspace=None):
    """Read a workspace file and parse it: a Source snapshot. ``language``
    overrides detection (by extension, else a #! line). Partially invalid
    source still opens: ``src.errors`` lists what did not parse."""
    ws = workspace or _sdk.default_workspace()
    real = ws.resolve(path)
    if os.path.isdir(real):
        raise IsADirectoryError(f"{ws.relpath(real)!r} is a directory")
    with builtins.open(real, "rb") as f:
        st = os.fstat(f.fileno())
        data = f.read(MAX_SOURCE_BYTES + 1)
    if len(data) > MAX_SOURCE_BYTES:
        raise ValueError(f"{ws.relpath(real)} is over {MAX_SOURCE_BYTES} bytes: too large to parse in "
                         "one request; use workspace.search and open_file on it")
    rel = ws.relpath(real)
    if language is not None and not isinstance(language, str):
        raise TypeError("language is a name such as 'python'")
    symbols_error = None
    try:
        res = await _host("code.parse", _parse_args(data, rel, language, queries=["symbols"]))
    except MissingQuery as e:
        symbols_error = str(e)
        res = await _host("code.parse", _parse_args(data, rel, language))
    except NoGrammar as e:
        symbols_error = e  # a text-only language: the Source says so
        res = await _host("code.parse", _parse_args(data, rel, language))
    # Thousands of small objects at once: the cyclic GC would walk the whole
    # heap several times over while they are made, for nothing (no cycles).
    import gc
    paused = gc.isenabled()
    gc.disable()
    try:
        return Source(ws, rel, real, data, st, res, symbols_error, requested=_sdk._fspath(path))
    finally:
        if paused:
            gc.enable()


async def languages():
    """The grammars klbr-core is built with, and each language's queries in
    the release this cell runs under."""
    return await _host("code.languages", {})


# -- patches ----------------------------------------------------------------------


class _FilePatch:
    __slots__ = ("path", "abspath", "base", "base_bytes", "edits", "requested", "workspace")

    def __init__(self, source, edits):
        self.path, self.abspath, self.base = source.path, source.abspath, source.sha256
        self.base_bytes, self.edits = source.bytes, list(edits)
        self.requested, self.workspace = source.requested, source.workspace
        _check_overlaps(self.path, self.edits)

    def result(self):
        out, at = [], 0
        for a, b, new in sorted(self.edits, key=lambda e: (e[0], e[1])):
            out.append(self.base_bytes[at:a])
            out.append(new)
            at = b
        out.append(self.base_bytes[at:])
        return b"".join(out)

    def diff(self):
        import difflib
        old = _decode(self.base_bytes).splitlines(keepends=True)
        new = _decode(self.result()).splitlines(keepends=True)
        lines = list(difflib.unified_diff(old, new, f"a/{self.path}", f"b/{self.path}", n=3))
        return "".join(ln if ln.endswith("\n") else ln + "\n\\ No newline at end of file\n" for ln in lines)


def _check_overlaps(path, edits):
    es = sorted(edits, key=lambda e: (e[0], e[1]))
    for (a1, b1, _), (a2, b2, _) in zip(es, es[1:]):
        if a2 < b1 or (a1 == a2 and (a1 == b1 or a2 == b2)):
            raise OverlappingEdits(f"{path}: edits of bytes {a1}-{b1} and {a2}-{b2} overlap; "
                                   "make one edit of the larger range instead")


class Applied:
    """What an apply wrote: ``files``, each (path, old sha256, new sha256)."""

    def __init__(self, files):
        self.files = files

    @property
    def written(self):
        return [f[0] for f in self.files]

    def __repr__(self):
        return "<Applied " + ", ".join(f"{p} {o[:15]}… → {n[:15]}…" for p, o, n in self.files) + ">"


class Patch:
    """Explicit byte edits of one or more files, each bound to the sha256 of
    the snapshot it was made from. ``diff`` shows it, ``patch + other``
    combines patches (edits of one file must come from the same snapshot and
    must not overlap), ``await apply()`` writes it."""

    SYMLINK_POLICY = SYMLINK_POLICY

    def __init__(self, files, desc):
        self._files, self.desc = files, desc  # abspath -> _FilePatch
        self.applied = None

    @classmethod
    def _single(cls, source, edits, desc):
        fp = _FilePatch(source, edits)
        return cls({fp.abspath: fp}, desc)

    @property
    def files(self):
        return [fp.path for fp in self._files.values()]

    @property
    def diff(self):
        return "".join(fp.diff() for fp in self._files.values())

    @property
    def base(self):
        """{path: the sha256 each file must still have}."""
        return {fp.path: fp.base for fp in self._files.values()}

    def __add__(self, other):
        return combine(self, other)

    async def apply(self):
        """Write the patch. Every file is checked first: it must still
        resolve to the file that was opened (UnrelatedFile) and still hash to
        the snapshot the patch was made from (StalePatch); then each file is
        written atomically (a temporary file and a rename, permission bits
        kept). The files of a multi-file patch are written one after another:
        if one fails, PartialApply says which were written, which failed and
        which were not. There is no rollback across files."""
        fps = list(self._files.values())
        for fp in fps:
            self._check(fp)
        done = []
        for i, fp in enumerate(fps):
            try:
                self._check(fp)
                new = fp.result()
                _sdk._atomic_write(fp.abspath, new)
            except Exception as e:
                if not done:
                    raise
                raise PartialApply(
                    f"stopped part way: wrote {', '.join(p for p, _, _ in done)}; {fp.path} failed ({e}); "
                    f"not written: {', '.join(f.path for f in fps[i + 1:]) or 'none'}",
                    [p for p, _, _ in done], fp.path, [f.path for f in fps[i + 1:]], e) from e
            done.append((fp.path, fp.base, _sha(new)))
        self.applied = Applied(done)
        return self.applied

    @staticmethod
    def _check(fp):
        ws = fp.workspace
        try:
            real = ws.resolve(fp.requested)
        except (_sdk.WorkspaceEscape, OSError) as e:
            raise UnrelatedFile(f"{fp.path} no longer resolves to the file that was opened: {e}") from None
        if real != fp.abspath:
            raise UnrelatedFile(f"{fp.path} now resolves to {real}, not {fp.abspath} (opened); open it again")
        try:
            with builtins.open(real, "rb") as f:
                now = _sha(f.read())
        except FileNotFoundError:
            raise StalePatch(f"{fp.path} was deleted after it was opened", fp.path, fp.base, None) from None
        if now != fp.base:
            raise StalePatch(f"{fp.path} changed after it was opened (expected {fp.base[:19]}…, found "
                             f"{now[:19]}…): open it again and redo the edit", fp.path, fp.base, now)

    def __repr__(self):
        n_edits = sum(len(fp.edits) for fp in self._files.values())
        state = f"applied: {self.applied!r}" if self.applied else "await patch.apply()"
        head = f"<Patch {self.desc}: {len(self._files)} file(s), {n_edits} edit(s); {state}>"
        d = self.diff
        return head + ("\n" + d if len(d) <= 4000 else "\n" + d[:4000] + "\n... (print(patch.diff) for all)")


def combine(*patches):
    """One Patch of several: files are merged; two patches of one file must
    come from the same snapshot (ConflictingSnapshots) and must not overlap
    (OverlappingEdits)."""
    files, descs = {}, []
    for p in patches:
        if not isinstance(p, Patch):
            raise TypeError(f"combine() takes Patch objects, not {type(p).__name__}")
        descs.append(p.desc)
        for key, fp in p._files.items():
            cur = files.get(key)
            if cur is None:
                new = _FilePatch.__new__(_FilePatch)
                for a in _FilePatch.__slots__:
                    setattr(new, a, getattr(fp, a, None))
                new.edits = list(fp.edits)
                files[key] = new
                continue
            if cur.base != fp.base:
                raise ConflictingSnapshots(
                    f"{fp.path}: patches from different snapshots ({cur.base[:19]}… and {fp.base[:19]}…); "
                    "make both from one code.open")
            _check_overlaps(fp.path, cur.edits + fp.edits)
            cur.edits.extend(fp.edits)
    return Patch(files, " + ".join(descs))


# -- references -------------------------------------------------------------------


class Reference(tuple):
    """One occurrence: (path, line, column, kind, text, start_byte); the
    column and start_byte count UTF-8 bytes. ``kind`` is
    ``definition:<kind>`` (the symbols query), ``call``, ``type``, ... (the
    language's references query), or ``text`` (a whole-word textual match
    the queries did not classify: a comment, a string, or a language
    without a references query)."""

    __slots__ = ()

    def __new__(cls, path, line, column, kind, text, start_byte):
        return tuple.__new__(cls, (path, line, column, kind, text, start_byte))

    path = property(lambda self: self[0])
    line = property(lambda self: self[1])
    column = property(lambda self: self[2])
    kind = property(lambda self: self[3])
    text = property(lambda self: self[4])
    start_byte = property(lambda self: self[5])

    def __repr__(self):
        return f"{self[0]}:{self[1]}:{self[2]} [{self[3]}] {self[4]}"


class References:
    """Best-effort references: textual whole-word matches, classified by
    tree-sitter queries where the language has them. Not compiler-backed:
    shadowing, imports, overloads and dynamic dispatch are not resolved."""

    LABEL = ("best-effort: whole-word text matches classified by tree-sitter queries; "
             "not compiler-backed name resolution")

    def __init__(self, name, items, truncated, textual_only):
        self.name, self.items, self.truncated, self.textual_only = name, items, truncated, textual_only
        self.label = self.LABEL

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]

    def by_kind(self, *kinds):
        return [r for r in self.items if r.kind in kinds or r.kind.split(":")[0] in kinds]

    def __repr__(self):
        lines = [f"<References {self.name!r}: {len(self.items)} ({self.label})"
                 + (", truncated" if self.truncated else "") + ">"]
        lines += ["  " + repr(r) for r in self.items[:80]]
        if len(self.items) > 80:
            lines.append(f"  ... {len(self.items) - 80} more")
        for path, why in sorted(self.textual_only.items())[:10]:
            lines.append(f"  (textual only: {path}: {why})")
        return "\n".join(lines)


async def references(name, path=".", max_results=200, workspace=None):
    """Best-effort references to ``name`` under ``path``: every whole-word
    occurrence in text files, labeled by the symbols and references queries
    where the file's language has them (``textual_only`` says where not).
    ``truncated`` when ``max_results`` cut it short."""
    if not isinstance(name, str) or not re.fullmatch(r"[\w$]+", name):
        raise ValueError("references() takes one identifier, such as 'run_turn'")
    if isinstance(max_results, bool) or not isinstance(max_results, int) or max_results < 1:
        raise ValueError(f"max_results must be an int >= 1, got {max_results!r}")
    ws = workspace or _sdk.default_workspace()
    base = ws.resolve(path)
    word = re.compile(rb"(?<![\w$])" + re.escape(name.encode()) + rb"(?![\w$])")
    items, textual_only, truncated = [], {}, False
    for abspath in ws._text_files(base):
        try:
            with builtins.open(abspath, "rb") as f:
                data = f.read()
        except OSError:
            continue
        if b"\0" in data[:8192]:
            continue
        hits = [m.start() for m in word.finditer(data)]
        if not hits:
            continue
        rel = ws.relpath(abspath)
        kinds = await _classify(data, rel, name, textual_only)
        for off in hits:
            if len(items) == max_results:
                truncated = True
                break
            line_start = data.rfind(b"\n", 0, off) + 1
            line_end = data.find(b"\n", off)
            line_text = _decode(data[line_start:line_end if line_end >= 0 else len(data)]).strip()
            items.append(Reference(rel, data.count(b"\n", 0, off) + 1, off - line_start,
                                   kinds.get(off, "text"), line_text[:200], off))
        if truncated:
            break
    return References(name, items, truncated, textual_only)


async def _classify(data, rel, name, textual_only):
    """{byte offset: kind} for the name's occurrences the queries tag."""
    if len(data) > MAX_SOURCE_BYTES:
        textual_only[rel] = "too large to parse"
        return {}
    try:
        res = await _host("code.parse", _parse_args(data, rel, None, queries=["symbols", "references"]))
    except UnsupportedLanguage:  # NoGrammar too: a text-only language
        textual_only[rel] = "no grammar"
        return {}
    except MissingQuery:
        try:
            res = await _host("code.parse", _parse_args(data, rel, None, queries=["symbols"]))
        except (MissingQuery, QueryError) as e:
            textual_only[rel] = str(e)
            return {}
        textual_only[rel] = f"{res['language']} has no references query (definitions only)"
    kinds = {}
    target = name.encode()
    for qr in map(_expand, res["queries"]):
        for m in qr["matches"]:
            label = None
            for c in m["captures"]:
                if c["name"].startswith("definition."):
                    label = "definition:" + c["name"][len("definition."):]
                elif c["name"].startswith("reference."):
                    label = c["name"][len("reference."):]
            if label is None:
                continue
            for c in m["captures"]:
                if c["name"] == "name" and data[c["start_byte"]:c["end_byte"]] == target:
                    off = c["start_byte"]
                    # Definitions first, then a specific reference kind, then a bare name.
                    if off not in kinds or _rank(label) < _rank(kinds[off]):
                        kinds[off] = label
    return kinds


def _rank(label):
    return 0 if label.startswith("definition:") else 2 if label == "name" else 1

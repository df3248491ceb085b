"""``klbr.history``: your lossless history, searched and read exactly.

Nothing is lost when your context is compacted: older records are replaced in
your context by summaries (``s12``), and the originals stay here.

- ``r = await history.search(query, scope=None, limit=20)``: full-text search
  over inputs, scratchpad, cells, speech and summaries, newest first. Each hit
  has ``.ref``, ``.kind``, ``.lane``, ``.at`` and ``.preview``. ``r.truncated``
  says there is more; ``await history.search(query, scope, before=r.next)``
  continues. ``scope`` narrows it: a dict with ``lane`` (input, scratchpad,
  cell, speech, summary), ``conversation`` (``"d1"``), ``since`` / ``until``
  (RFC 3339 or ``YYYY-MM-DD``).
- ``await history.describe(ref)``: what a ref is (a dict): its kind, time,
  size, and which summary covers it.
- ``rec = await history.read(ref, max_bytes=24000)``: the exact original.
  ``rec.text`` is its text (what was said, thought, run or shown),
  ``rec.content`` the whole record, ``rec.truncated`` whether ``max_bytes``
  cut it. Artifacts (``a<sha256>``, large cell output) read the same way;
  continue one with ``offset=rec.offset``.
- ``await history.children(ref)``: what a summary covers, in order (refs of
  records and earlier summaries).

In a child agent, search also covers the evidence your spawn granted, and
nothing else; a summary covering a scope you were not granted is refused, and
``history.children(ref)`` lists instead the originals of it you may read.

A summary is an account, not evidence: what was delivered is in the speech
records and their receipts.
"""

from ._sdk import request

__all__ = ["search", "describe", "read", "children", "Hit", "SearchResult", "Record"]


class Hit:
    """One search result."""

    __slots__ = ("ref", "kind", "lane", "at", "preview")

    def __init__(self, r):
        self.ref, self.kind, self.lane = r.get("ref"), r.get("kind"), r.get("lane")
        self.at, self.preview = r.get("at"), r.get("preview", "")

    def __repr__(self):
        return f"<{self.ref} {self.lane}/{self.kind} {self.at}: {self.preview!r}>"


class SearchResult:
    """A page of hits, newest first: iterate it, ``len()`` it, index it."""

    def __init__(self, r):
        self.hits = [Hit(h) for h in r.get("results") or []]
        self.truncated = bool(r.get("truncated"))
        self.next = r.get("next")

    def __iter__(self):
        return iter(self.hits)

    def __len__(self):
        return len(self.hits)

    def __getitem__(self, i):
        return self.hits[i]

    def __repr__(self):
        more = f", more: before={self.next}" if self.truncated else ""
        lines = "\n".join(repr(h) for h in self.hits)
        return f"<{len(self.hits)} hits{more}>" + ("\n" + lines if lines else "")


class Record:
    """An exact original: ``text``, ``content``, ``truncated``, and what
    ``describe`` says of it (``ref``, ``type``, ``kind``, ``lane``, ``at``...).
    ``collected`` is set ({"at", "reason", "bytes"}) when retention collected
    the original: ``text`` then says so and ``covered_by`` is the summary
    that stands for it."""

    def __init__(self, r):
        self.raw = r
        self.ref, self.type, self.kind = r.get("ref"), r.get("type"), r.get("kind")
        self.lane, self.at, self.size = r.get("lane"), r.get("at"), r.get("size")
        self.text, self.content = r.get("text", ""), r.get("content")
        self.truncated, self.offset = bool(r.get("truncated")), r.get("offset", 0)
        self.covered_by = r.get("covered_by")
        self.collected = r.get("collected")

    def __str__(self):
        return self.text

    def __repr__(self):
        cut = " (truncated)" if self.truncated else ""
        if self.collected:
            cut += " (collected)"
        return f"<{self.ref} {self.type} {self.kind} {self.at}{cut}>\n{self.text}"


async def search(query, scope=None, limit=20, before=None):
    if not isinstance(query, str) or not query.strip():
        raise ValueError("history.search: query must be a non-empty string")
    if scope is not None and not isinstance(scope, dict):
        raise TypeError("history.search: scope is a dict such as {'lane': 'speech'} or None")
    sc = dict(scope or {})
    if before is not None:
        sc["before"] = int(before)
    args = {"query": query, "limit": int(limit)}
    if sc:
        args["scope"] = sc
    return SearchResult(await request("history.search", args))


async def describe(ref):
    return await request("history.describe", {"ref": str(ref)})


async def read(ref, max_bytes=24000, offset=0):
    args = {"ref": str(ref), "max_bytes": int(max_bytes)}
    if offset:
        args["offset"] = int(offset)
    return Record(await request("history.read", args))


async def children(ref):
    return await request("history.children", {"ref": str(ref)})

"""Ordered transforms: ``context.prepare``, ``delivery.prepare`` and
``result.present``. settings.toml's ``[hooks.transforms]`` names the handlers
of each (keys of SLOTS) in the order the host calls them; each is given the
previous one's output. A handler that fails is skipped.

``context.prepare``: ``{"session", "attempt", "step", "additions": [str]}`` ->
``{"additions": [str]}``: at most 8 notes of at most 4000 bytes, added to the
next request after the history. Earlier additions must stay as they are.

``delivery.prepare``: ``{"channel", "destination", "session", "limit",
"parts": [str]}`` -> ``{"parts": [str]}``: 1 to 16 parts of 1..limit characters
(Unicode code points, as Discord counts them: Python's ``len``),
each reviewed, sent and receipted on its own, to the same destination. The
default splits a text over the limit at paragraph, line, then word
boundaries (Discord takes 2,000 characters a message, however many bytes).

``result.present``: ``{"session", "status", "text"}`` -> ``{"text"}``: how a
cell's result is shown to the model (the complete outcome is stored anyway).
The default keeps the host's rendering.
"""

from . import _shape


def context(data):
    """``context.prepare``: no additions of its own."""
    _shape.mapping(data, "input")
    adds = _shape.required(data, "additions", "input")
    if not isinstance(adds, list):
        raise ValueError("input.additions must be a list")
    return {"additions": list(adds)}


def split(text, limit):
    """Split text into parts of at most limit characters (code points), at
    the last paragraph break, else line break, else space before the limit;
    a word longer than the limit is cut."""
    parts = []
    while len(text) > limit:
        head = text[:limit]
        cut = -1
        for sep in ("\n\n", "\n", " "):
            cut = head.rfind(sep)
            if cut > 0:
                break
        if cut <= 0:
            cut = len(head)
        parts.append(head[:cut].rstrip())
        text = text[cut:].lstrip()
    if text:
        parts.append(text)
    return [p for p in parts if p] or [text]


def delivery(data):
    """``delivery.prepare``: parts over the limit are split."""
    _shape.mapping(data, "input")
    limit = _shape.integer(_shape.required(data, "limit", "input"), "input.limit")
    if limit < 1:
        raise ValueError("input.limit must be positive")
    parts = _shape.required(data, "parts", "input")
    if not isinstance(parts, list) or not parts:
        raise ValueError("input.parts must be a non-empty list")
    out = []
    for i, p in enumerate(parts):
        out.extend(split(_shape.string(p, f"input.parts[{i}]"), limit))
    return {"parts": out}


def present(data):
    """``result.present``: the host's rendering as it is."""
    _shape.mapping(data, "input")
    return {"text": _shape.string(_shape.required(data, "text", "input"), "input.text")}

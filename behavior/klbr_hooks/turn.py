"""Turn policy: ``turn.prepare`` (before an attempt starts) and ``turn.next``
(after each step that ran cells).

``turn.prepare`` input::

    {"session": str, "wake": str,            # why the attempt would start
     "inputs": [{"id": int, "source_kind": "operator" | "discord",
                 "directed": bool, "conversation": str}, ...],
     "deferred": int}                        # times in a row it was deferred

Output::

    {"decision": "start" | "defer",
     "seconds": float,                       # defer only: 0 < s <= 300
     "guidance": str (optional),             # <= 4000 bytes; the model sees it first
     "reason": str}

The host never defers operator input, defers at most three times in a row,
and starts now (without guidance) when this hook fails.

``turn.next`` input::

    {"session": str, "attempt": int, "steps": int, "tokens": int,
     "elapsed_seconds": float, "calls": int, "pending": int,
     "budgets": {"max_steps": int, "max_tokens": int, "max_turn_seconds": float}}

Output::

    {"decision": "continue" | "wait" | "end",
     "seconds": float (optional; wait: 0 < s <= 600, none: until input),
     "reason": str}

The host enforces its budgets whatever this says, and continues when it
fails. The default policy starts at once and lets the model decide.
"""

from . import _shape

SOURCE_KINDS = ("operator", "discord")


def prepare(data):
    """The ``turn.prepare`` slot: start now."""
    _shape.mapping(data, "input")
    _shape.string(_shape.required(data, "wake", "input"), "input.wake")
    raw = _shape.required(data, "inputs", "input")
    if not isinstance(raw, list):
        raise ValueError(f"input.inputs must be a list, got {type(raw).__name__}")
    for i, it in enumerate(raw):
        _shape.mapping(it, f"input.inputs[{i}]")
        _shape.integer(_shape.required(it, "id", f"input.inputs[{i}]"), f"input.inputs[{i}].id")
        _shape.one_of(_shape.required(it, "source_kind", f"input.inputs[{i}]"), SOURCE_KINDS,
                      f"input.inputs[{i}].source_kind")
    return {"decision": "start", "reason": "default: start at once"}


def next_step(data):
    """The ``turn.next`` slot: continue (the model waits or ends by itself)."""
    _shape.mapping(data, "input")
    for key in ("steps", "tokens", "calls", "pending"):
        _shape.integer(_shape.required(data, key, "input"), f"input.{key}")
    _shape.mapping(_shape.required(data, "budgets", "input"), "input.budgets")
    return {"decision": "continue", "reason": "default: the model decides when to wait or end"}

"""``attention.plan``: the order in which pending inputs are attended.

Input::

    {"items": [{"id": int, "source_kind": "operator" | "discord" | "job" | "source",
                "directed": bool,          # a DM or a mention
                "conversation": str,
                "received_at": float,      # unix seconds
                "text": str (optional)}, ...],
     "now": float}

Output::

    {"order": [id, ...],                   # attend these, in this order
     "defer": [{"id": id, "until": float}, ...],
     "reason": str}

The default policy:

1. operator input first, oldest first;
2. then directed Discord items (DMs, mentions);
3. then ambient Discord items received at least ``ambient_defer_seconds``
   (settings.toml) before ``now``;
4. every other ambient item is deferred until ``received_at`` plus that delay.

Within 2 and 3 conversations take turns: each conversation's items stay
oldest first, and a busy channel cannot push a quiet one to the back of a
burst (the host takes a burst in frames of bounded size, in this order).
Conversations take their turns in the order of their oldest item.

Ties on ``received_at`` are broken by id. Every input id appears exactly once,
in ``order`` or in ``defer``. The function is pure: it reads only its input and
the settings, changes nothing, and makes no host requests. Input that does not
have this shape raises ValueError; the host then applies its own default.
"""

from . import _shape
from .settings import SETTINGS

# job: a durable job's end (directed: someone waits on it); source: a source job's events.
SOURCE_KINDS = ("operator", "discord", "job", "source")


def plan(data):
    """The ``attention.plan`` slot, with the delay from settings.toml."""
    return plan_with(data, ambient_defer_seconds=SETTINGS.ambient_defer_seconds)


def plan_with(data, *, ambient_defer_seconds):
    """``plan`` with an explicit ambient delay (seconds, >= 0)."""
    items, now = _parse(data)
    operator, directed, due, deferred = [], [], [], []
    for item in items:
        if item["source_kind"] == "operator":
            operator.append(item)
        elif item["directed"]:
            directed.append(item)
        elif now - item["received_at"] >= ambient_defer_seconds:
            due.append(item)
        else:
            deferred.append(item)

    def oldest_first(group):
        return sorted(group, key=lambda it: (it["received_at"], it["id"]))

    def taking_turns(group):
        queues = {}
        for it in oldest_first(group):
            queues.setdefault(it["conversation"], []).append(it)
        rounds = list(queues.values())  # in the order of each one's oldest item
        out = []
        while rounds:
            out.extend(q.pop(0) for q in rounds)
            rounds = [q for q in rounds if q]
        return out

    order = [it["id"] for it in oldest_first(operator) + taking_turns(directed) + taking_turns(due)]
    defer = sorted(({"id": it["id"], "until": it["received_at"] + ambient_defer_seconds}
                    for it in deferred), key=lambda d: (d["until"], d["id"]))
    return {"order": order, "defer": defer,
            "reason": _reason(len(operator), len(directed), len(due), len(deferred),
                              ambient_defer_seconds)}


def _parse(data):
    _shape.mapping(data, "input")
    now = _shape.timestamp(_shape.required(data, "now", "input"), "input.now")
    raw = _shape.required(data, "items", "input")
    if not isinstance(raw, list):
        raise ValueError(f"input.items must be a list, got {type(raw).__name__}")
    items, seen = [], set()
    for i, entry in enumerate(raw):
        where = f"input.items[{i}]"
        _shape.mapping(entry, where)

        def field(key):
            return _shape.required(entry, key, where)

        item = {
            "id": _shape.integer(field("id"), f"{where}.id"),
            "source_kind": _shape.one_of(field("source_kind"), SOURCE_KINDS, f"{where}.source_kind"),
            "directed": _shape.boolean(field("directed"), f"{where}.directed"),
            "conversation": _shape.string(field("conversation"), f"{where}.conversation"),
            "received_at": _shape.timestamp(field("received_at"), f"{where}.received_at"),
        }
        _shape.optional_string(entry.get("text"), f"{where}.text")
        if item["id"] in seen:
            raise ValueError(f"{where}.id {item['id']} appears more than once")
        seen.add(item["id"])
        items.append(item)
    return items, now


def _reason(operator, directed, due, deferred, delay):
    parts = []
    if operator:
        parts.append(f"{operator} operator")
    if directed:
        parts.append(f"{directed} directed (DM or mention)")
    if due:
        parts.append(f"{due} ambient at least {delay:g} s old")
    text = "attend " + ", then ".join(parts) if parts else "nothing to attend now"
    if deferred:
        text += f"; defer {deferred} ambient until {delay:g} s after receipt"
    return text

"""klbr's policy hooks: the handlers the hook worker calls.

The hook worker imports this package from the active behavior release and
calls ``SLOTS[slot](input)``: a dict in, a dict out (or an awaitable of one).
The host validates every result; ``delivery.review`` fails closed (any error
holds the send); ``attention.plan`` and ``model.plan`` fall back to the
host's default.

Hooks have no effect scope: they decide, they do not act. Keep them pure and
fast (the host gives each invocation a deadline).


Decision slots have one handler each (``turn.prepare``, ``turn.next``,
``execution.review`` and the ones above). Transforms (``context.prepare``,
``delivery.prepare``, ``result.present``) are chains of handlers named, in
order, by settings.toml's ``[hooks.transforms]``; observers are bound by its
``[[hooks.observers]]``. Every handler is a key of SLOTS.
"""

from . import compaction, execution, jobs, model, shaping, turn
from .attention import plan
from .delivery import review

SLOTS = {
    "attention.plan": plan,
    "delivery.review": review,
    "model.plan": model.plan,
    "compaction.plan": compaction.plan,
    "summary.prepare": compaction.prepare,
    "job.plan": jobs.plan,
    "turn.prepare": turn.prepare,
    "turn.next": turn.next_step,
    "execution.review": execution.review,
    # Transform handlers (see [hooks.transforms] in settings.toml).
    "context.prepare": shaping.context,
    "delivery.prepare": shaping.delivery,
    "result.present": shaping.present,
}

__all__ = ["SLOTS", "compaction", "execution", "jobs", "model", "plan", "review", "shaping", "turn"]

"""klbr's policy hooks: the handlers the hook worker calls.

The hook worker imports this package from the active behavior release and
calls ``SLOTS[slot](input)``: a dict in, a dict out (or an awaitable of one).
The host validates every result; ``delivery.review`` fails closed (any error
holds the send); ``attention.plan`` and ``model.plan`` fall back to the
host's default.

Hooks have no effect scope: they decide, they do not act. Keep them pure and
fast (the host gives each invocation a deadline).
"""

from . import compaction, jobs, model
from .attention import plan
from .delivery import review

SLOTS = {
    "attention.plan": plan,
    "delivery.review": review,
    "model.plan": model.plan,
    "compaction.plan": compaction.plan,
    "summary.prepare": compaction.prepare,
    "job.plan": jobs.plan,
}

__all__ = ["SLOTS", "compaction", "jobs", "model", "plan", "review"]

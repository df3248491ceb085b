"""job.plan: admission and priority of a new durable job.

Input: ``{"kind", "spec", "schedule", "recovery", "running"}`` (``running``:
jobs running now). Answer: ``{"admit": bool, "priority": int (-100..100),
"reason": str}``, and optionally ``"host": "NAME"`` or ``"label:L"`` to send
the job (a command, a routine's runs, a child agent) to that worker host instead
of where it asked (``spec["host"]``; leave the key out to keep it). Among jobs
due at the same time the higher priority starts first; a refusal fails the
``jobs.run`` / ``jobs.schedule`` call with the reason.
"""

from ._shape import integer, mapping, one_of

KINDS = ("command", "routine", "source", "child")


def plan(job):
    job = mapping(job, "input")
    kind = one_of(job.get("kind"), KINDS, "input.kind")
    integer(job.get("running", 0), "input.running")
    if kind == "command":
        return {"admit": True, "priority": 10, "reason": "commands first: someone is usually waiting on them"}
    return {"admit": True, "priority": 0, "reason": "admitted"}

"""``klbr.agents``: child agents, delegated sessions that report back.

- ``child = await agents.spawn(task="...", refs=[...], budget={...},
  delegate=[])``: creates the child's session and its job (kind ``child``)
  in one transaction and returns once it is admitted, not finished. The child
  has its own history and workbench generation, is pinned to your behavior
  release, and sees its task and the refs you name (as text), not your
  scratchpad. A ref is an exact one you may see (``e12``, ``s3``,
  ``a<sha256>``) or a scope of your history (``scope:operator``,
  ``scope:agent``, ``scope:d1``); a summary reaches it only if every scope it
  covers is granted. It reports through its result; ``local.send`` and
  ``discord.send``/``react``/``mark`` are refused to it unless you delegate
  them (``delegate=["local.send"]``). Its end wakes you once with
  ``[klbr] child N ...``.
- ``await agents.get(id)``, ``await agents.list(state=None)``,
  ``await agents.cancel(id)``, ``await child.result(timeout=None)``. After a
  kernel reset, ``agents.get(id)`` rebuilds the handle from the record.
- ``child = await agents.spawn(task="...", profile="code-review")`` spawns
  with a profile of your behavior release (``profiles/<name>.toml``): its
  instructions are added to the child's task, its model requests go along
  the profile's route, its budget is the profile's narrowed by yours, and
  its delegated ops join yours. ``await agents.profiles()`` lists them.
- Inside a child: ``me = await agents.current()`` (its own record: ``me.task``,
  ``me.refs``, ``me["delegate"]``; None in a root) and ``await agents.finish(result)`` (any JSON value) ends it
  with that result and ends the cell, like ``runtime.wait``. A child that ends
  its turn without it ends with its last text as the result, marked
  ``{"implicit": true, ...}``.
- ``workspace=``: ``"shared"`` (the default: your workspace, as you have it;
  two modifying children can collide), ``"worktree"`` (a git repository of its
  own on a new branch ``klbr/...`` from HEAD, brought back into your
  repository under that name when it ends, for you to merge; or a copy of a
  directory that is no repository; kept after its end, ``agents.remove_workspace(id)`` removes
  it) or ``"read_only"`` (your workspace, not writable to it where Landlock
  enforces it). ``child["spec"]["workspace"]`` says where it works and what
  is enforced.
"""

import json as _json

from ._sdk import request, wait
from .jobs import Job

__all__ = ["spawn", "get", "list", "cancel", "current", "finish", "profiles", "remove_workspace", "Child"]

_list = list


class Child(Job):
    """A child agent's job record as last read: ``id``, ``state``,
    ``session`` (the child's session id), ``task``, ``result_value``,
    ``error``; ``child["field"]`` reads any field of the record."""

    session = property(lambda self: (self.raw.get("spec") or {}).get("session"))
    task = property(lambda self: (self.raw.get("spec") or {}).get("task"))
    refs = property(lambda self: (self.raw.get("spec") or {}).get("refs") or [])

    async def refresh(self):
        self.raw = await request("agents.get", {"id": self.id})
        return self

    async def result(self, timeout=None):
        """Wait until the child ends and return its result; raises
        TimeoutError after ``timeout`` seconds (the child keeps running)."""
        import time
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        while not self.done:
            left = 600.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"child {self.id} is still {self.state}")
            self.raw = await request("agents.wait", {"id": self.id, "timeout": min(left, 600.0)})
        return self.raw.get("result")

    async def cancel(self):
        self.raw = await request("agents.cancel", {"id": self.id})
        return self

    def __repr__(self):
        extra = f" error={self.error!r}" if self.error else ""
        return f"<child {self.id} {self.session} {self.state}{extra}>"


async def spawn(task, refs=None, budget=None, delegate=None, profile=None, workspace=None, host=None):
    """Spawn a child agent with ``task``; returns its handle once admitted.

    A child grants its own children only what it holds: ``delegate`` (and a
    profile's) only speech ops delegated to it, ``refs`` only evidence it may
    read, and a ``budget`` clamped to what is left of its own (which covers
    its whole subtree). Anything more is refused (``HostError`` code
    ``refused``) or clamped; see docs/agents.md.

    ``host`` (``"NAME"`` or ``"label:L"``, a ``[hosts.NAME]`` of klbr.toml)
    runs the child's workbench and its commands on that worker host, in a
    copy of your workspace there; its changes come back to you as a patch
    artifact when it ends (see docs/hosts.md)."""
    if not isinstance(task, str) or not task.strip():
        raise TypeError("agents.spawn: task is a non-empty str")
    args = {"task": task, "refs": [str(r) for r in (refs or [])]}
    if budget is not None:
        if not isinstance(budget, dict):
            raise TypeError("agents.spawn: budget is a dict")
        _json.dumps(budget)
        args["budget"] = budget
    if delegate:
        if isinstance(delegate, str):
            delegate = [delegate]
        args["delegate"] = [str(d) for d in delegate]
    if profile is not None:
        args["profile"] = str(profile)
    if workspace is not None:
        args["workspace"] = str(workspace)
    if host is not None:
        args["host"] = str(host)
    return Child(await request("agents.spawn", args))


async def remove_workspace(id):
    """Remove the worktree (or copy) of your ended child ``id``; a git
    worktree's branch stays, for you to merge or delete. Returns
    ``{"id", "removed": dir, "branch"}``."""
    return await request("agents.remove_workspace", {"id": int(id)})


async def get(id):
    return Child(await request("agents.get", {"id": int(id)}))


async def list(state=None, limit=100):
    args = {"limit": int(limit)}
    if state is not None:
        args["state"] = str(state)
    r = await request("agents.list", args)
    return [Child(j) for j in r.get("children") or []]


async def cancel(id):
    return Child(await request("agents.cancel", {"id": int(id)}))


async def profiles():
    """The profiles of your behavior release (``profiles/<name>.toml``), as
    dicts: ``name``, ``description``, ``instructions``, ``route``,
    ``fallback``, ``budget``, ``delegate``, ``workspace``."""
    r = await request("agents.profiles", {})
    return r.get("profiles") or []


async def current():
    """This child agent's own record (a Child), or None in a root session."""
    r = await request("agents.current", {})
    return Child(r) if r else None


async def finish(result=None):
    """End this child agent with ``result`` (JSON-serializable): the parent
    is woken with it. The cell ends here, as with ``runtime.wait``."""
    try:
        _json.dumps(result)
    except (TypeError, ValueError) as e:
        raise TypeError(f"agents.finish: the result must be JSON-serializable: {e}") from None
    r = await request("agents.finish", {"result": result})
    await wait(None, reason=f"finished: child {r.get('id')} reported its result")

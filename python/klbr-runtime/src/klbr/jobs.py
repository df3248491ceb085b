"""``klbr.jobs``: durable work that outlives the cell and the kernel.

- ``job = await jobs.run(argv, cwd=None, env=None, timeout=None, host=None,
  inputs=None, outputs=None)``: a tracked command in its own scope, with the
  host's limits. Its output goes to an artifact; ``job.output_preview`` is its
  tail. It keeps running when the cell ends or the kernel resets; its end
  wakes you with ``[klbr] job N ...``. ``host="gpu"`` (or ``"label:gpu"``)
  runs it on a worker host. ``inputs=["data/x.csv", "src"]`` (workspace
  paths) are copied into a directory of the job's own, where it runs;
  ``outputs=["out/*.bin", "**/report.txt"]`` (globs in that directory) come
  back as artifacts when it ends: ``job.result_value["artifacts"]`` lists
  ``{"path", "artifact", "bytes"}`` (read one with ``history.read``). The
  same here and on a host.
- ``job = await jobs.schedule("module:function", at=... | every=... | cron=...,
  tz=None, input={...}, recovery="retry_safe")``: a routine from your behavior
  release (``klbr_skills...``), called with its JSON input in a fresh worker
  pinned to the release that scheduled it (``await fn(input)`` for a coroutine
  function, ``fn(input)`` otherwise); its JSON return value is the job's
  result. ``at`` is an aware ``datetime`` or a Unix timestamp; ``every`` is
  seconds (or a ``timedelta``); ``cron`` is five fields read in ``tz``.
  ``kind="source"`` makes a source: it admits outside events with
  ``await jobs.source().emit(events, cursor=...)``. ``host=`` runs each run's
  worker on that worker host.
- ``await jobs.get(id)``, ``await jobs.list(state=None)``,
  ``await jobs.cancel(id)`` (kills the whole process tree),
  ``await job.result(timeout=None)`` (waits for the end; the result is read
  from the record). After a kernel reset, ``jobs.get(id)`` rebuilds the handle.
- Inside a routine: ``jobs.current()`` (its id, input, last checkpoint and a
  source's cursor) and ``await jobs.checkpoint(state)``.

Recovery after a klbr-core restart: ``retry_safe`` runs again, ``resume`` runs
again with its last checkpoint in ``jobs.current()["checkpoint"]``, ``manual``
(the default for commands) becomes ``unknown`` and you are told; a command is
never rerun silently.
"""

import datetime as _dt
import json as _json
import os as _os

from ._sdk import request

__all__ = ["run", "schedule", "get", "list", "cancel", "current", "checkpoint", "source",
           "Job", "Source", "STATES"]

STATES = ("pending", "running", "succeeded", "failed", "cancelled", "unknown")
FINAL = ("succeeded", "failed", "cancelled", "unknown")

_list = list


class Job:
    """A job's record as last read. ``state``, ``result``, ``error``,
    ``output_preview``, ``output_artifact``, ``runs``, ``next_due`` ...;
    ``job["field"]`` reads any field of the record."""

    def __init__(self, raw):
        self.raw = raw

    id = property(lambda self: self.raw.get("id"))
    kind = property(lambda self: self.raw.get("kind"))
    state = property(lambda self: self.raw.get("state"))
    result_value = property(lambda self: self.raw.get("result"))
    error = property(lambda self: self.raw.get("error", ""))
    output_preview = property(lambda self: self.raw.get("output_preview", ""))
    output_artifact = property(lambda self: self.raw.get("output_artifact", ""))
    runs = property(lambda self: self.raw.get("runs", 0))
    next_due = property(lambda self: self.raw.get("next_due"))
    done = property(lambda self: self.raw.get("state") in FINAL)

    def __getitem__(self, key):
        return self.raw[key]

    def get(self, key, default=None):
        return self.raw.get(key, default)

    async def refresh(self):
        self.raw = await request("jobs.get", {"id": self.id})
        return self

    async def result(self, timeout=None):
        """Wait until the job ends (a recurring job: until its current run
        ends) and return its result; raises TimeoutError after ``timeout``
        seconds. The job keeps running either way."""
        import time
        since = self.runs - 1 if self.state == "running" else self.runs
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        while True:
            left = 600.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"job {self.id} is still {self.state}")
            self.raw = await request("jobs.wait", {"id": self.id, "since": since, "timeout": min(left, 600.0)})
            # pending again ends a run of a scheduled job; a one-shot pending
            # again has not run (its host was not ready): keep waiting
            if self.done or (self.state == "pending" and self.raw.get("schedule") and self.runs > since):
                return self.raw.get("result")

    async def cancel(self):
        self.raw = await request("jobs.cancel", {"id": self.id})
        return self

    def __repr__(self):
        extra = f" error={self.error!r}" if self.error else ""
        return f"<job {self.id} {self.kind} {self.state}{extra}>"


def _paths(name, v):
    if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
        raise TypeError(f"jobs.run: {name}= is a list of paths, such as ['data/in.csv']")
    out = [_os.fspath(p) for p in v]
    if any(not isinstance(p, str) for p in out):
        raise TypeError(f"jobs.run: {name}= holds text paths")
    return out


def _host(fn, host):
    if not isinstance(host, str) or not host:
        raise TypeError(f'jobs.{fn}: host= names a [hosts.NAME] of klbr.toml, or "label:L"')
    return host


async def run(argv, cwd=None, env=None, timeout=None, recovery="manual", host=None, inputs=None, outputs=None):
    if isinstance(argv, str):
        raise TypeError("jobs.run: argv is a list such as ['make', 'test'], not a string")
    args = {"argv": [str(a) for a in argv], "recovery": recovery}
    if host is not None:
        args["host"] = _host("run", host)
    if inputs is not None:
        args["inputs"] = _paths("inputs", inputs)
    if outputs is not None:
        args["outputs"] = _paths("outputs", outputs)
    if cwd is not None:
        args["cwd"] = str(cwd)
    if env:
        args["env"] = {str(k): str(v) for k, v in dict(env).items()}
    if timeout is not None:
        args["timeout"] = float(timeout)
    return Job(await request("jobs.run", args))


def _unix(at):
    if isinstance(at, _dt.datetime):
        if at.tzinfo is None or at.utcoffset() is None:
            raise ValueError("jobs.schedule: at= must be a timezone-aware datetime (or a Unix timestamp)")
        return at.timestamp()
    if isinstance(at, bool) or not isinstance(at, (int, float)):
        raise TypeError("jobs.schedule: at= is an aware datetime or a Unix timestamp")
    return float(at)


async def schedule(entry, at=None, every=None, cron=None, tz=None, input=None, recovery="retry_safe",
                   kind="routine", host=None):
    if callable(entry):
        raise TypeError('jobs.schedule: entry is a "module:function" string from your release, never a function object')
    args = {"entry": str(entry), "recovery": recovery, "kind": kind}
    if host is not None:
        args["host"] = _host("schedule", host)
    if sum(x is not None for x in (at, every, cron)) != 1:
        raise ValueError("jobs.schedule: give exactly one of at=, every= or cron=")
    if at is not None:
        args["at"] = _unix(at)
    if every is not None:
        args["every"] = every.total_seconds() if isinstance(every, _dt.timedelta) else float(every)
    if cron is not None:
        args["cron"] = str(cron)
    if tz is not None:
        args["tz"] = str(getattr(tz, "key", tz))
    if input is not None:
        _json.dumps(input)  # refuse what is not JSON here, with Python's message
        args["input"] = input
    return Job(await request("jobs.schedule", args))


async def get(id):
    return Job(await request("jobs.get", {"id": int(id)}))


async def list(state=None, limit=100):
    args = {"limit": int(limit)}
    if state is not None:
        args["state"] = str(state)
    r = await request("jobs.list", args)
    return [Job(j) for j in r.get("jobs") or []]


async def cancel(id):
    return Job(await request("jobs.cancel", {"id": int(id)}))


# -- inside a routine ---------------------------------------------------------

_CURRENT = None


def _set_current(cur):
    global _CURRENT
    _CURRENT = cur


def current():
    """The running routine: ``{"id", "kind", "entry", "input", "run", "due",
    "checkpoint", "cursor"}``; None outside a routine."""
    return _CURRENT


async def checkpoint(state):
    """Store ``state`` (JSON) as this routine's checkpoint; a ``resume``
    routine started again after a restart finds it in ``current()``."""
    if _CURRENT is None:
        raise RuntimeError("jobs.checkpoint is only available inside a routine")
    _json.dumps(state)
    await request("jobs.checkpoint", {"state": state})
    _CURRENT["checkpoint"] = state


async def _finish(result):
    try:
        _json.dumps(result)
    except (TypeError, ValueError) as e:
        raise TypeError(f"a routine's result must be JSON-serializable: {e}") from None
    await request("jobs.finish", {"result": result})


class Source:
    """The running source: ``await emit(events, cursor=...)`` admits events
    (each a dict with a stable ``key`` and its ``text``, optionally ``author``
    and ``occurred_at``) and stores the cursor in the same transaction; an
    event whose key was admitted before is not admitted again."""

    @property
    def cursor(self):
        return (_CURRENT or {}).get("cursor")

    async def emit(self, events, cursor=None):
        evs = []
        for ev in _list(events):
            if not isinstance(ev, dict) or "key" not in ev:
                raise TypeError("source.emit: each event is a dict with a stable 'key' and its 'text'")
            evs.append({"key": str(ev["key"]), "text": str(ev.get("text", "")),
                        "author": str(ev.get("author", "")), "occurred_at": float(ev.get("occurred_at", 0) or 0)})
        args = {"events": evs}
        if cursor is not None:
            args["cursor"] = cursor
        r = await request("source.emit", args)
        if cursor is not None and _CURRENT is not None:
            _CURRENT["cursor"] = cursor
        return r


def source():
    if _CURRENT is None or _CURRENT.get("kind") != "source":
        raise RuntimeError("jobs.source() is only available inside a job of kind 'source'")
    return Source()

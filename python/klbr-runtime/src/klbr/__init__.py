"""klbr: the SDK that workbench cells import.

- ``klbr.host.request(op, args)``: a typed request to the host.
- ``klbr.local.send(text)``: speak on the operator's local lane.
- ``klbr.runtime.wait(seconds=None, reason="")``: a terminal yield.
- ``klbr.workspace``: ``open_file``, ``ls``, ``search``, ``delete``, ``run``
  (bound in every cell; ``klbr.workspace.PRELUDE_NAMES`` lists them).
- ``klbr.behavior``: ``status``, ``draft``, ``publish``, ``activate``,
  ``rollback`` (your behavior release).
- ``klbr.hooks``: ``list``, ``describe``, ``test``, ``trace``, ``bind`` (the
  policy hooks of a release).
- ``klbr.skills``: the skills this generation offers (``dir``, ``help``).
- ``klbr.history``: ``search``, ``describe``, ``read``, ``children`` (your
  lossless history; originals stay readable after compaction).
- ``klbr.discord``: ``current``, ``conversations``, ``conversation``, ``mark``;
  a conversation's ``history``, ``send`` (a Receipt) and ``react``.
- ``klbr.jobs``: ``run``, ``schedule``, ``get``, ``list``, ``cancel``; inside a
  routine ``current``, ``checkpoint`` and ``source`` (durable jobs).
- ``klbr.agents``: ``spawn``, ``get``, ``list``, ``cancel``; inside a child
  ``finish`` (child agents that report back).
- ``klbr.code``: ``open`` (a parsed source snapshot with ``symbols``),
  symbol ``replace_declaration``/``replace_body`` patches with ``diff`` and a
  checked ``apply``, raw ``query``, best-effort ``references``.
- ``klbr.spend``: ``summary`` (what model requests cost, against the caps;
  read-only; ``from klbr import spend``, not bound by the prelude).

``PRELUDE_MODULES`` are bound by name in every cell. All of it is a thin facade
over ``klbr._sdk``; klbr.behavior and klbr.hooks load ``klbr._behavior`` on
first use, and klbr.skills reads its file on first use.
"""

from ._sdk import SDK_VERSION as __version__
from ._sdk import DraftEscape, HostError, NoExecutionScope, WorkspaceEscape, Yielded
from . import agents, behavior, code, discord, history, hooks, host, jobs, local, runtime, skills, spend, workspace

PRELUDE_MODULES = ("local", "runtime", "workspace", "behavior", "hooks", "skills", "discord", "history", "jobs", "code",
                   "agents")

__all__ = ["DraftEscape", "HostError", "NoExecutionScope", "WorkspaceEscape", "Yielded",
           "PRELUDE_MODULES", "agents", "behavior", "code", "discord", "history", "hooks", "host", "jobs", "local", "runtime", "skills", "spend",
           "workspace"]

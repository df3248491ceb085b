"""Workspace helpers, bound to ``KLBR_WORKSPACE`` (resolved once per process).

``open_file``, ``ls``, ``search``, ``delete`` and ``run`` are bound in every
workbench cell (PRELUDE_NAMES); ``ws = await workspace.current()`` is the
object form. Paths are relative to the workspace root and may not resolve
outside it, through ``..`` or symlinks (WorkspaceEscape).
"""

from ._sdk import (
    Entry, Match, RunResult, SearchResult, Workspace, WorkspaceEscape, WorkspaceFile,
    current, delete, ls, open_file, run, search,
)

PRELUDE_NAMES = ("open_file", "ls", "search", "delete", "run")

__all__ = ["PRELUDE_NAMES", "current", "open_file", "ls", "search", "delete", "run",
           "Workspace", "WorkspaceFile", "Entry", "Match", "SearchResult", "RunResult",
           "WorkspaceEscape"]

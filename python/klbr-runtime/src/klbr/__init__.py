"""klbr: the SDK that workbench cells import.

- ``klbr.host.request(op, args)``: a typed request to the host.
- ``klbr.local.send(text)``: speak on the operator's local lane.
- ``klbr.runtime.wait(seconds=None, reason="")``: a terminal yield.
- ``klbr.workspace``: ``open_file``, ``ls``, ``search``, ``delete``, ``run``
  (bound in every cell; ``klbr.workspace.PRELUDE_NAMES`` lists them).

All of it is a thin facade over ``klbr._sdk``.
"""

from ._sdk import SDK_VERSION as __version__
from ._sdk import HostError, NoExecutionScope, WorkspaceEscape, Yielded
from . import host, local, runtime, workspace

__all__ = ["HostError", "NoExecutionScope", "WorkspaceEscape", "Yielded",
           "host", "local", "runtime", "workspace"]

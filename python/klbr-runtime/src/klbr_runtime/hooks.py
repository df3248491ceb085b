"""The hooks role: call policy hooks from the behavior release.

Convention: ``KLBR_BEHAVIOR_DIR`` holds the package ``klbr_hooks``, which
exposes ``SLOTS``, a dict mapping slot names to callables::

    SLOTS = {"attention.plan": plan, "delivery.review": review}

A handler takes the invocation's input (a dict) and returns a dict, directly
or as an awaitable. Anything else, or an exception, is ``ok: false``. Hooks
get no effect scope: klbr host requests raise NoExecutionScope here.

Invocations run one at a time in the main thread; a reader thread keeps
reading so ``shutdown`` (and end of stream) still end the process while a
handler blocks. asyncio is imported only when a handler returns an awaitable.
"""

import os
import queue
import signal
import sys

from . import framing
from .connection import ProtocolError, diag, field
from .util import error_info


def _fail(error_type, message, traceback=""):
    return {"type": error_type, "message": message, "traceback": traceback}


class HookTable:
    def __init__(self, slots=None, error=None):
        self.slots = slots or {}
        self.error = error   # set when no handler can run at all
        self._loop = None

    @classmethod
    def load(cls, behavior_dir):
        if not behavior_dir:
            return cls(error=_fail("NoHooks", "KLBR_BEHAVIOR_DIR is not set: no hooks are loaded"))
        behavior_dir = os.path.realpath(behavior_dir)
        if not os.path.isdir(behavior_dir):
            return cls(error=_fail("NoHooks", f"the behavior directory {behavior_dir!r} does not exist"))
        # A published release is immutable: never write bytecode into it.
        sys.dont_write_bytecode = True
        sys.path.insert(0, behavior_dir)
        try:
            import importlib
            mod = importlib.import_module("klbr_hooks")
        except BaseException as e:
            err = error_info(e, prefix=f"importing klbr_hooks from {behavior_dir} failed")
            diag(f"{err['message']}\n{err['traceback']}")
            return cls(error=err)
        origin = os.path.realpath(getattr(mod, "__file__", None) or "")
        if not origin.startswith(behavior_dir + os.sep):
            return cls(error=_fail("InvalidHooks", f"klbr_hooks was imported from {origin!r}, "
                                                   f"not from the behavior directory {behavior_dir!r}"))
        slots = getattr(mod, "SLOTS", None)
        if not isinstance(slots, dict):
            return cls(error=_fail("InvalidHooks", "klbr_hooks.SLOTS must be a dict mapping slot names "
                                                   f"to callables (it is {type(slots).__name__})"))
        bad = [repr(k) for k, v in slots.items() if not isinstance(k, str) or not callable(v)]
        if bad:
            return cls(error=_fail("InvalidHooks", "klbr_hooks.SLOTS entries must map a str to a callable: "
                                                   + ", ".join(bad)))
        return cls(slots=dict(slots))

    def _await(self, awaitable):
        if self._loop is None:
            import asyncio
            self._loop = asyncio.new_event_loop()

        async def _run():
            return await awaitable

        return self._loop.run_until_complete(_run())

    def call(self, slot, data):
        """Return (ok, result or error dict)."""
        if self.error is not None:
            return False, self.error
        fn = self.slots.get(slot)
        if fn is None:
            have = ", ".join(sorted(self.slots)) or "none"
            return False, _fail("UnknownSlot", f"klbr_hooks.SLOTS has no handler for {slot!r} (it has: {have})")
        try:
            result = fn(data)
            if hasattr(type(result), "__await__"):
                result = self._await(result)
        except BaseException as e:
            return False, error_info(e)
        if not isinstance(result, dict):
            return False, _fail("InvalidResult", f"the {slot} hook returned {type(result).__name__}, not a dict")
        return True, result


def run(conn):
    # Stopping is the host's (shutdown or kill). A no-op handler rather than
    # SIG_IGN, which commands a hook starts would inherit.
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    table = HookTable.load(os.environ.get("KLBR_BEHAVIOR_DIR", ""))
    work = queue.SimpleQueue()

    def dispatch(f):
        t = f["type"]
        if t == "hook_invoke":
            inv = field(f, "invocation", str, "")
            if not inv:
                raise ProtocolError("hook_invoke frame without an invocation id")
            work.put((inv, field(f, "slot", str, ""), field(f, "input", dict, {})))
        elif t == "shutdown":
            os._exit(0)
        elif t == "execute":
            conn.send(conn.frame(
                "outcome", execution=field(f, "execution", str, ""), status="error", value=None,
                value_truncated=False,
                error=_fail("WrongRole", "this worker runs hooks; cells run in the workbench role")))
        elif t in ("interrupt", "host_reply"):
            pass  # nothing to interrupt or answer in this role
        else:
            diag(f"ignoring a frame of unknown type {t!r}")

    from .runner import start_reader
    conn.send_hello()
    start_reader(conn, dispatch)
    while True:
        inv, slot, data = work.get()
        ok, value = table.call(slot, data)
        f = conn.frame("hook_result", invocation=inv, ok=ok)
        f["result" if ok else "error"] = value
        try:
            frame_bytes = framing.encode_frame(f)
        except framing.FrameLengthError as e:
            frame_bytes = framing.encode_frame(conn.frame(
                "hook_result", invocation=inv, ok=False,
                error=_fail("ResultTooLarge", f"the {slot} hook result is too large: {e}")))
        except (TypeError, ValueError, RecursionError) as e:
            frame_bytes = framing.encode_frame(conn.frame(
                "hook_result", invocation=inv, ok=False,
                error=_fail("InvalidResult", f"the {slot} hook result is not JSON: {e}")))
        conn.send_bytes(frame_bytes)

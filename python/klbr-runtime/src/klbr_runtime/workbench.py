"""The workbench role: persistent Python cells on one long-lived asyncio loop.

Threads:
  main         runs the event loop forever; every cell is a task on it.
  klbr-reader  reads every frame, so an interrupt arrives while sync code
               blocks the loop; it hands work to the loop with
               call_soon_threadsafe and never touches loop state itself.
  klbr-output  sends coalesced output about 5 ms after it was written.
Interrupts additionally start a short-lived timer thread (not on the hot path).
"""

import __future__
import ast
import asyncio
import builtins
import codecs
import contextvars
import io
import linecache
import os
import selectors
import signal
import sys
import threading
import time
import types

import klbr
import klbr._sdk as sdk

from . import framing
from .connection import ProtocolError, block_async_signals, diag, field
from .util import RUNTIME_DIR, bound_text, error_info, utf8_cut

CO_COROUTINE = 0x0080
TOP_LEVEL_AWAIT = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
FUTURE_FLAGS = 0
for _name in __future__.all_feature_names:
    FUTURE_FLAGS |= getattr(__future__, _name).compiler_flag

VALUE_LIMIT = 16 * 1024       # bytes of the displayed repr
DATA_LIMIT = 32 * 1024        # bytes of data in one output frame
FLUSH_AT = 4 * 1024           # buffered characters that trigger a send
FLUSH_DELAY = 0.005           # seconds output may wait to be coalesced
INTERRUPT_ESCALATE = 0.1      # seconds after the cancel before SIGINT
INTERRUPT_RETRY = 0.25        # then again this often...
INTERRUPT_RETRIES = 8         # ...this many times (the host kills after its grace)
CELL_SOURCES_KEPT = 512       # cell sources kept in linecache for tracebacks

_get_running_loop = asyncio.events._get_running_loop
_current_task = asyncio.current_task

# Frames of these files are the runner's machinery: a SIGINT that lands there
# never raises (it would break the loop or cut a frame); see Workbench._on_sigint.
_INFRA_PREFIXES = (RUNTIME_DIR, os.path.dirname(asyncio.__file__) + os.sep)
_SELECTORS_FILE = selectors.__file__
_RUN_ONCE_CODE = asyncio.base_events.BaseEventLoop._run_once.__code__

current_execution = contextvars.ContextVar("klbr_execution", default=None)


class Execution:
    """One cell. Created by the reader thread, run and finished on the loop."""

    __slots__ = ("id", "code", "task", "finished", "in_user", "interrupted", "cancel_sent",
                 "escalating", "raised", "last_request", "yield_payload", "keys")

    def __init__(self, eid, code):
        self.id = eid
        self.code = code
        self.task = None
        self.finished = False
        self.in_user = False        # user code (or an await inside it) is on the stack
        self.interrupted = False    # an interrupt was requested
        self.cancel_sent = False
        self.escalating = False
        self.raised = False         # a KeyboardInterrupt was raised in its code
        self.last_request = 0
        self.yield_payload = None
        self.keys = {
            "stdout": (eid, "stdout", "execution", None),
            "stderr": (eid, "stderr", "execution", None),
        }


def split_data(text):
    """Split text into pieces of at most DATA_LIMIT UTF-8 bytes (whole characters)."""
    if len(text) * 4 <= DATA_LIMIT:
        return (text,)
    b = text.encode("utf-8", "surrogatepass")
    if len(b) <= DATA_LIMIT:
        return (text,)
    out = []
    start = 0
    n = len(b)
    while start < n:
        end = n if n - start <= DATA_LIMIT else start + utf8_cut(b[start:], DATA_LIMIT)
        out.append(b[start:end].decode("utf-8", "surrogatepass"))
        start = end
    return out


class OutputHub:
    """Coalesces output in order and owns every send of the workbench.

    Consecutive writes with the same (execution, stream, origin, task) share a
    frame. Output is sent when 4 KiB is buffered, ~5 ms after the first
    buffered write (by the klbr-output thread), on flush(), and ahead of every
    other frame (send), so an outcome or a request never overtakes the output
    written before it.

    The locks are reentrant and a thread never flushes inside its own send:
    a finalizer (run by the garbage collector at any allocation) may print
    while this thread holds them, and must neither deadlock nor nest a frame
    inside a half-written one.
    """

    def __init__(self, conn):
        self._conn = conn
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._send_lock = threading.RLock()
        self._sending = None  # ident of the thread inside send()
        self._segs = []
        self._size = 0
        threading.Thread(target=self._flusher, name="klbr-output", daemon=True).start()

    def append(self, key, text):
        with self._lock:
            segs = self._segs
            if not segs:
                segs.append((key, [text]))
                self._wake.notify()
            else:
                last = segs[-1]
                if last[0] is key or last[0] == key:
                    last[1].append(text)
                else:
                    segs.append((key, [text]))
            self._size += len(text)
            full = self._size >= FLUSH_AT
        if full and self._sending != threading.get_ident():
            self.send(None)

    def flush(self):
        if self._sending != threading.get_ident():
            self.send(None)

    def send(self, data):
        """Send the pending output, then ``data`` (one encoded frame) if given."""
        me = threading.get_ident()
        if self._sending == me:
            raise RuntimeError("a frame may not be sent from inside another send")
        with self._send_lock:
            self._sending = me
            try:
                with self._lock:
                    segs = self._segs
                    self._segs = []
                    self._size = 0
                chunks = []
                if segs:
                    frame = self._conn.frame
                    for (eid, stream, origin, task), parts in segs:
                        text = parts[0] if len(parts) == 1 else "".join(parts)
                        for piece in split_data(text):
                            f = frame("output", execution=eid, stream=stream, data=piece, origin=origin)
                            if task is not None:
                                f["task"] = task
                            chunks.append(framing.encode_frame(f))
                if data is not None:
                    chunks.append(data)
                if chunks:
                    self._conn.send_bytes(chunks[0] if len(chunks) == 1 else b"".join(chunks))
            finally:
                self._sending = None

    def _flusher(self):
        block_async_signals()
        while True:
            with self._lock:
                while not self._segs:
                    self._wake.wait()
            time.sleep(FLUSH_DELAY)
            try:
                self.send(None)
            except BaseException as e:  # never let the flusher die
                diag(f"output flush failed: {e!r}")


class _BinaryOutput:
    """``sys.stdout.buffer``: bytes decoded as UTF-8 (invalid bytes escaped)."""

    def __init__(self, text):
        self._text = text
        self._decoder = codecs.getincrementaldecoder("utf-8")("backslashreplace")

    def write(self, b):
        n = len(b)
        s = self._decoder.decode(bytes(b))
        if s:
            self._text.write(s)
        return n

    def flush(self):
        self._text.flush()

    def writable(self):
        return True

    def readable(self):
        return False

    def seekable(self):
        return False

    def isatty(self):
        return False

    def fileno(self):
        raise io.UnsupportedOperation("captured output has no file descriptor")

    @property
    def closed(self):
        return False


class CapturedStream(io.TextIOBase):
    """sys.stdout / sys.stderr while the workbench runs: every write is routed
    by origin (the cell's own task, another task, or a thread) to the hub."""

    encoding = "utf-8"
    errors = "strict"
    newlines = None
    line_buffering = False

    def __init__(self, bench, stream):
        super().__init__()
        self._bench = bench
        self._stream = stream
        self._buffer = None

    @property
    def name(self):
        return f"<klbr {self._stream}>"

    @property
    def buffer(self):
        if self._buffer is None:
            self._buffer = _BinaryOutput(self)
        return self._buffer

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        n = len(s)
        if n:
            bench = self._bench
            bench.hub.append(bench.output_key(self._stream), s)
            if bench.deferred_interrupt is not None:
                bench.raise_deferred_interrupt()
        return n

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        self._bench.hub.flush()

    def isatty(self):
        return False

    def readable(self):
        return False

    def writable(self):
        return True

    def seekable(self):
        return False

    def fileno(self):
        raise io.UnsupportedOperation("captured output has no file descriptor")


def _semicolon_after(code, node):
    """Whether the final expression statement is followed by ``;`` (IPython: no display)."""
    lines = code.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    try:
        rest = lines[node.end_lineno - 1].encode("utf-8")[node.end_col_offset:]
    except (IndexError, TypeError, UnicodeEncodeError):
        return False
    return rest.lstrip().startswith(b";")


class Workbench:
    def __init__(self, conn):
        self.conn = conn
        self.main_ident = threading.get_ident()
        self.loop = loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        loop.set_exception_handler(self._loop_exception)
        self.hub = OutputHub(conn)
        self.current = None             # the running Execution (set on the loop)
        self.latest = None              # the last Execution the reader accepted
        self.last_id = ""
        self.pending = {}               # (execution id, request id) -> Future
        self.sync_pending = {}          # (execution id, request id) -> [Event, reply] (request_sync)
        self.rid_lock = threading.Lock()  # request ids: request_sync may run on another thread
        self.deferred_interrupt = None  # an Execution whose SIGINT landed in runner code
        self.sigint_target = None       # the Execution an escalation SIGINT is for
        self.shutting_down = False
        self.reattach_lock = threading.Lock()
        self.hello_after = None         # reattach: the Execution whose end is followed by a hello
        self.future_flags = 0
        self.cell_files = []
        self.carry_ctx = contextvars.copy_context()

        # Cells run in a real __main__ module, so pickle, dataclasses and
        # typing find what cells define.
        main = types.ModuleType("__main__")
        g = main.__dict__
        g["__builtins__"] = builtins
        for name in klbr.PRELUDE_MODULES:
            g[name] = getattr(klbr, name)
        for name in klbr.workspace.PRELUDE_NAMES:
            g[name] = getattr(klbr.workspace, name)
        sys.modules["__main__"] = main
        self.globals = g

        sdk._bind(self)
        sys.stdin = io.StringIO()  # cells have no interactive input: input() raises EOFError
        self.stdout = sys.stdout = CapturedStream(self, "stdout")
        self.stderr = sys.stderr = CapturedStream(self, "stderr")
        self._sigint_handler = self._on_sigint  # one bound method, so identity checks work
        signal.signal(signal.SIGINT, self._sigint_handler)

    # -- output ----------------------------------------------------------------

    def _fallback_id(self):
        cur = self.current
        return cur.id if cur is not None else self.last_id

    def output_key(self, stream):
        ex = current_execution.get()
        loop = _get_running_loop()
        if loop is not None:
            task = _current_task(loop)
            if task is not None:
                if ex is not None and task is ex.task:
                    return ex.keys[stream]
                return (ex.id if ex is not None else self._fallback_id(), stream, "task", task.get_name())
            name = "<callback>"
        else:
            name = "thread:" + threading.current_thread().name
        return (ex.id if ex is not None else self._fallback_id(), stream, "task", name)

    def _loop_exception(self, loop, context):
        """Unhandled errors of background tasks and callbacks: stderr output
        labeled with the task, never a diagnostic the cell cannot see."""
        try:
            import traceback
            text = (context.get("message") or "unhandled exception in the event loop") + "\n"
            exc = context.get("exception")
            if exc is not None:
                text += "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            task = context.get("task") or context.get("future")
            name = task.get_name() if isinstance(task, asyncio.Task) else "<callback>"
            ex = current_execution.get()
            self.hub.append((ex.id if ex is not None else self._fallback_id(), "stderr", "task", name), text)
        except BaseException as e:
            diag(f"event loop exception handler failed: {e!r}; context: {context!r}")

    # -- frames (reader thread) --------------------------------------------------

    def dispatch(self, f):
        t = f["type"]
        if t == "execute":
            eid = field(f, "execution", str, "")
            code = field(f, "code", str, "")
            if not eid:
                raise ProtocolError("execute frame without an execution id")
            ex = Execution(eid, code)
            prev = self.latest
            if prev is not None and not prev.finished:
                self.loop.call_soon_threadsafe(self._reject, ex, f"execution {prev.id} is still running")
                return
            self.latest = ex
            self.loop.call_soon_threadsafe(self._start, ex)
        elif t == "interrupt":
            self.interrupt(field(f, "execution", str, ""))
        elif t == "host_reply":
            eid = field(f, "execution", str, "")
            rid = field(f, "request", int, 0)
            field(f, "ok", bool, False)
            waiter = self.sync_pending.get((eid, rid))
            if waiter is not None:
                # A blocking request (request_sync): its thread waits on the
                # event, and may be the loop's own, so the loop is not involved.
                waiter[1] = f
                waiter[0].set()
                return
            self.loop.call_soon_threadsafe(self._on_reply, eid, rid, f)
        elif t == "shutdown":
            self.shutdown()
        elif t == "reattach":
            self.reattach()
        elif t == "hook_invoke":
            inv = field(f, "invocation", str, "")
            self.hub.send(framing.encode_frame(self.conn.frame(
                "hook_result", invocation=inv, ok=False,
                error={"type": "WrongRole", "message": "this worker is a workbench; hooks run in the hooks role",
                       "traceback": ""})))
        else:
            diag(f"ignoring a frame of unknown type {t!r}")

    def interrupt(self, eid):
        ex = self.latest
        if ex is None or ex.id != eid or ex.finished:
            return  # an interrupt naming a finished (or unknown) execution is ignored
        ex.interrupted = True
        self.loop.call_soon_threadsafe(self._cancel, ex)
        if not ex.escalating:
            ex.escalating = True
            t = threading.Timer(INTERRUPT_ESCALATE, self._escalate, (ex, 0))
            t.daemon = True
            t.start()

    def reattach(self):
        """``reattach``: a restarted klbr-core took this worker over (a worker
        on a host outlives klbr-core; docs/hosts.md). Whatever was in flight
        with its predecessor is gone: the running cell is interrupted (the
        host has recorded it lost; its outcome is not awaited), every pending
        host request ends with a ``lost`` error, and the worker says hello
        again for the new host to check, once that cell has ended (so that
        the host's next cell is not refused as a second one)."""
        ex = self.latest
        hello_now = True
        if ex is not None and not ex.finished:
            with self.reattach_lock:
                self.hello_after = ex
                hello_now = ex.finished  # it ended meanwhile: _finish did not see hello_after
                if hello_now:
                    self.hello_after = None
            if not hello_now:
                self.interrupt(ex.id)
        err = {"code": "lost", "message": "klbr-core restarted while this request was pending; its answer is lost"}
        for (eid, rid), waiter in list(self.sync_pending.items()):
            waiter[1] = self.conn.frame("host_reply", execution=eid, request=rid, ok=False, error=err)
            waiter[0].set()
        for eid, rid in list(self.pending):
            self.loop.call_soon_threadsafe(
                self._on_reply, eid, rid, self.conn.frame("host_reply", execution=eid, request=rid, ok=False, error=err))
        if hello_now:
            self.hub.send(framing.encode_frame(self.conn.hello_frame()))

    def _escalate(self, ex, attempt):
        """Timer thread: the cell has not finished since its cancel; if the
        loop is blocked in its sync code, a SIGINT raises KeyboardInterrupt there."""
        if ex.finished or ex.raised or self.shutting_down:
            return  # done, or it got its KeyboardInterrupt (what it does next is its business)
        if ex.in_user:
            self.sigint_target = ex
            signal.pthread_kill(self.main_ident, signal.SIGINT)
        if attempt < INTERRUPT_RETRIES:
            t = threading.Timer(INTERRUPT_RETRY, self._escalate, (ex, attempt + 1))
            t.daemon = True
            t.start()

    def shutdown(self):
        """``shutdown``: cancel every task, give them a moment, exit 0 (even if
        sync code blocks the loop)."""
        self.shutting_down = True
        done = threading.Event()

        def finish():
            try:
                self.hub.flush()
            finally:
                done.set()

        def stop():
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.loop.call_later(0.02, finish)

        self.loop.call_soon_threadsafe(stop)
        done.wait(0.25)
        os._exit(0)

    # -- signals (main thread) ---------------------------------------------------

    def _on_sigint(self, signum, frame):
        ex = self.current
        target = self.sigint_target
        self.sigint_target = None
        if ex is None or ex.finished or not ex.in_user:
            return  # no cell is running: ignore
        if target is not None and target is not ex:
            return  # a late escalation for a cell that already finished
        ex.interrupted = True  # a SIGINT from outside the protocol interrupts too
        if frame is not None:
            filename = frame.f_code.co_filename
            back = frame.f_back
            if filename == _SELECTORS_FILE and back is not None and back.f_code is _RUN_ONCE_CODE:
                # The loop is idle in select(): nothing is blocked, so cancel
                # cooperatively (the loop must not be broken by an exception).
                if not ex.cancel_sent:
                    self.loop.call_soon_threadsafe(self._cancel, ex)
                return
            if filename.startswith(_INFRA_PREFIXES):
                # Runner or asyncio machinery: raise at the next safe point
                # (the end of an output write) or at the next retry.
                self.deferred_interrupt = ex
                return
        ex.raised = True
        raise KeyboardInterrupt

    def raise_deferred_interrupt(self):
        ex = self.deferred_interrupt
        if ex is None or threading.get_ident() != self.main_ident:
            return
        self.deferred_interrupt = None
        if ex is self.current and ex.in_user and not ex.finished:
            ex.raised = True
            raise KeyboardInterrupt

    # -- cells (loop) ------------------------------------------------------------

    def _reject(self, ex, why):
        ex.finished = True
        self._send_outcome(ex, "error", None, {"type": "ProtocolError", "message": why, "traceback": ""})

    def _start(self, ex):
        if self.current is not None:
            self._reject(ex, f"execution {self.current.id} is still running")
            return
        self.current = ex
        if sys.stdout is not self.stdout or sys.stderr is not self.stderr:
            # A cell rebound them (to a file, to sys.__stdout__ = the diagnostic
            # stream): output is the protocol's again from this cell on.
            sys.stdout, sys.stderr = self.stdout, self.stderr
        if signal.getsignal(signal.SIGINT) is not self._sigint_handler:
            # A cell replaced it: interrupts must keep working for the next ones.
            signal.signal(signal.SIGINT, self._sigint_handler)
        if ex.interrupted:
            self._finish(ex, "cancelled", None, {
                "type": "KeyboardInterrupt", "message": "interrupted before it started", "traceback": ""})
            return
        ctx = self.carry_ctx.copy()
        ctx.run(current_execution.set, ex)
        ex.task = task = self.loop.create_task(self._run(ex), name=f"klbr-cell-{ex.id}", context=ctx)
        task.add_done_callback(self._task_done)

    def _task_done(self, task):
        # A task cancelled before its first step never runs _run (and so never
        # sends the outcome); every execute still gets exactly one outcome.
        ex = self.current
        if ex is None or ex.task is not task or ex.finished:
            return
        if task.cancelled() and ex.interrupted:
            self._finish(ex, "cancelled", None, {
                "type": "asyncio.CancelledError", "message": "interrupted before it started", "traceback": ""})
        else:
            exc = None if task.cancelled() else task.exception()
            self._finish(ex, "error", None, error_info(exc) if exc is not None else {
                "type": "asyncio.CancelledError", "message": "the cell's task was cancelled before it started",
                "traceback": ""})

    def _cancel(self, ex):
        if ex.finished or ex.task is None or ex.cancel_sent:
            return
        ex.cancel_sent = True
        ex.task.cancel()

    def _remember_source(self, filename, code):
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        files = self.cell_files
        files.append(filename)
        if len(files) > CELL_SOURCES_KEPT:
            linecache.cache.pop(files.pop(0), None)

    def _compile(self, ex):
        code = ex.code
        filename = f"<cell {ex.id}>"
        self._remember_source(filename, code)
        flags = TOP_LEVEL_AWAIT | self.future_flags
        tree = compile(code, filename, "exec", ast.PyCF_ONLY_AST | flags, dont_inherit=True)
        stmts = tree.body
        last = stmts.pop() if stmts and isinstance(stmts[-1], ast.Expr) else None
        body = None
        if stmts:
            body = compile(tree, filename, "exec", flags, dont_inherit=True)
            self.future_flags |= body.co_flags & FUTURE_FLAGS  # `from __future__` lasts
            flags = TOP_LEVEL_AWAIT | self.future_flags
        expr = display = None
        if last is not None:
            expr = compile(ast.Expression(last.value), filename, "eval", flags, dont_inherit=True)
            display = not _semicolon_after(code, last)
        return body, expr, display

    async def _run(self, ex):
        try:
            body, expr, display = self._compile(ex)
        except Exception as e:
            self._finish(ex, "error", None, error_info(e, only=isinstance(e, SyntaxError)))
            return
        g = self.globals
        value = None
        status = "ok"
        err = None
        try:
            try:
                ex.in_user = True
                if body is not None:
                    r = eval(body, g)
                    if body.co_flags & CO_COROUTINE:
                        await r
                if expr is not None:
                    r = eval(expr, g)
                    if expr.co_flags & CO_COROUTINE:
                        r = await r
                    if r is not None and display:
                        value = repr(r)
            finally:
                ex.in_user = False
        except BaseException as e:
            if ex.interrupted and isinstance(e, (KeyboardInterrupt, asyncio.CancelledError)):
                status = "cancelled"
            else:
                status = "error"
            err = error_info(e)
        if ex.yield_payload is not None:
            status, err, value = "yielded", None, None  # the host accepted a terminal wait
        self.carry_ctx = contextvars.copy_context()
        self._finish(ex, status, value, err)

    def _finish(self, ex, status, value, err):
        ex.finished = True
        if self.current is ex:
            self.current = None
        self.last_id = ex.id
        self.deferred_interrupt = None
        if self.shutting_down:
            return
        self._send_outcome(ex, status, value, err)
        with self.reattach_lock:
            hello = self.hello_after is ex
            if hello:
                self.hello_after = None
        if hello:
            self.hub.send(framing.encode_frame(self.conn.hello_frame()))

    def _send_outcome(self, ex, status, value, err):
        f = self.conn.frame("outcome", execution=ex.id, status=status, value=None, value_truncated=False)
        if value is not None:
            f["value"], f["value_truncated"] = bound_text(value, VALUE_LIMIT)
        if err is not None:
            f["error"] = err
        if status == "yielded":
            f["yield"] = ex.yield_payload
        try:
            data = framing.encode_frame(f)
        except (TypeError, ValueError) as e:  # cannot happen for our own fields; stay honest if it does
            data = framing.encode_frame(self.conn.frame(
                "outcome", execution=ex.id, status="error", value=None, value_truncated=False,
                error={"type": "RunnerError", "message": f"the outcome could not be encoded: {e}", "traceback": ""}))
        self.hub.send(data)

    # -- host requests -------------------------------------------------------------

    async def _request(self, op, args):
        """Send a host_request for the current execution; return (request id, reply)."""
        ex = current_execution.get()
        if ex is None:
            raise sdk.NoExecutionScope(
                "klbr host requests need an execution scope: call them from a workbench cell "
                "or a task it created")
        loop = self.loop
        if _get_running_loop() is not loop:
            raise RuntimeError("klbr host requests must be awaited on the workbench's event loop")
        with self.rid_lock:
            ex.last_request += 1
            rid = ex.last_request
        data = framing.encode_frame(self.conn.frame(
            "host_request", execution=ex.id, request=rid, op=op, args=args))
        key = (ex.id, rid)
        fut = loop.create_future()
        self.pending[key] = fut
        try:
            self.hub.send(data)
            reply = await fut
        finally:
            self.pending.pop(key, None)
        if reply.get("ok") is True:
            return rid, reply.get("result", {})
        err = reply.get("error")
        if not isinstance(err, dict):
            err = {}
        raise sdk.HostError(str(err.get("code") or "failed"), str(err.get("message") or ""))

    async def request(self, op, args):
        return (await self._request(op, args))[1]

    def request_sync(self, op, args):
        """A host request that blocks the calling thread until its answer (for
        properties such as an attachment's ``text``, which cannot await). On
        the loop's thread it blocks the loop like any synchronous call; the
        reader thread hands the answer over directly. An interrupt ends the wait."""
        ex = current_execution.get()
        if ex is None:
            raise sdk.NoExecutionScope(
                "klbr host requests need an execution scope: call them from a workbench cell "
                "or a task it created")
        with self.rid_lock:
            ex.last_request += 1
            rid = ex.last_request
        data = framing.encode_frame(self.conn.frame(
            "host_request", execution=ex.id, request=rid, op=op, args=args))
        key = (ex.id, rid)
        waiter = [threading.Event(), None]
        self.sync_pending[key] = waiter
        try:
            self.hub.send(data)
            while not waiter[0].wait(0.25):  # short waits: a SIGINT lands between them
                if ex.finished:
                    raise sdk.HostError("cancelled", "the cell ended while waiting for the host")
            reply = waiter[1]
        finally:
            self.sync_pending.pop(key, None)
        if reply.get("ok") is True:
            return reply.get("result", {})
        err = reply.get("error")
        if not isinstance(err, dict):
            err = {}
        raise sdk.HostError(str(err.get("code") or "failed"), str(err.get("message") or ""))

    async def wait(self, seconds, reason):
        rid, _ = await self._request("runtime.wait", {"seconds": seconds, "reason": reason})
        ex = current_execution.get()
        payload = {"op": "runtime.wait", "request": rid, "seconds": seconds, "reason": reason}
        if ex.yield_payload is None:
            ex.yield_payload = payload
        if not ex.finished and ex.task is not None and _current_task(self.loop) is not ex.task:
            # Waited from a background task while the cell runs: the cell ends too.
            self._cancel(ex)
        raise sdk.Yielded(payload)

    def _on_reply(self, eid, rid, f):
        fut = self.pending.get((eid, rid))
        if fut is None or fut.done():
            return  # unknown request, or its awaiter is gone: never satisfies another request
        fut.set_result(f)

    # -- main ----------------------------------------------------------------------

    def serve(self):
        from .runner import start_reader
        self.conn.send_hello()
        start_reader(self.conn, self.dispatch)
        loop = self.loop
        while True:
            try:
                loop.run_forever()
            except (KeyboardInterrupt, SystemExit):
                # Raised in a background task or callback (a cell's own task
                # catches everything): that task is done, the loop goes on.
                continue


def run(conn):
    Workbench(conn).serve()

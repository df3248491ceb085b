"""A small test-only host peer: starts the real runner as a subprocess with a
socketpair as its protocol socket and speaks frames to it.

The framing here is written independently of klbr_runtime.framing so the
tests do not share bugs with the code under test.
"""

import json
import os
import unittest
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
SESSION = "test-session"
GENERATION = 7


def encode(obj):
    body = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    return struct.pack(">I", len(body)) + body


class Closed(Exception):
    pass


class Worker:
    """One runner process and the host end of its protocol socket."""

    def __init__(self, role="workbench", env=None, workspace=None, behavior_dir=None,
                 fd3=False, python=None, extra_args=()):
        self.host, child = socket.socketpair()
        self.stderr = tempfile.TemporaryFile()
        e = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": SRC,
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONSAFEPATH": "1",
            "KLBR_ROLE": role,
            "KLBR_SESSION": SESSION,
            "KLBR_GENERATION": str(GENERATION),
            "KLBR_SKILLS_REVISION": "rev-test",
            "KLBR_WORKSPACE": workspace or os.getcwd(),
        }
        if behavior_dir is not None:
            e["KLBR_BEHAVIOR_DIR"] = behavior_dir
        argv = [python or sys.executable, "-s", *extra_args, "-m", "klbr_runtime"]
        if fd3:
            cfd = child.fileno()

            def to_fd3():
                os.dup2(cfd, 3)

            self.proc = subprocess.Popen(argv, env={**e, **(env or {})}, stdin=subprocess.DEVNULL,
                                         stdout=self.stderr, stderr=self.stderr,
                                         close_fds=False, preexec_fn=to_fd3, cwd=workspace)
        else:
            e["KLBR_PROTOCOL_FD"] = str(child.fileno())
            self.proc = subprocess.Popen(argv, env={**e, **(env or {})}, stdin=subprocess.DEVNULL,
                                         stdout=self.stderr, stderr=self.stderr,
                                         pass_fds=(child.fileno(),), cwd=workspace)
        child.close()
        self._buf = b""
        self._seq = 0
        self.late = []       # frames read while waiting for something else
        self.hello = None

    # -- wire ---------------------------------------------------------------

    def send_raw(self, data):
        self.host.sendall(data)

    def send(self, type_, **fields):
        f = {"v": 1, "type": type_, "session": SESSION, "generation": GENERATION}
        f.update(fields)
        self.host.sendall(encode(f))

    def _read_exact(self, n, deadline):
        while len(self._buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no frame within the deadline; worker stderr:\n{self.diagnostics()}")
            self.host.settimeout(left)
            try:
                chunk = self.host.recv(1 << 16)
            except socket.timeout:
                continue
            if not chunk:
                raise Closed(f"worker closed the socket; stderr:\n{self.diagnostics()}")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def recv(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        (n,) = struct.unpack(">I", self._read_exact(4, deadline))
        assert 1 <= n <= 1 << 20, n
        f = json.loads(self._read_exact(n, deadline).decode("utf-8"))
        assert isinstance(f, dict)
        assert f["v"] == 1 and f["session"] == SESSION and f["generation"] == GENERATION, f
        return f

    def start(self, timeout=20.0):
        self.hello = self.recv(timeout)
        assert self.hello["type"] == "hello", self.hello
        return self

    # -- cells --------------------------------------------------------------

    def next_id(self):
        self._seq += 1
        return f"x{self._seq}"

    def execute(self, code, timeout=10.0, on_request=None, eid=None, interrupt_after=None):
        """Run a cell; return (outcome, output frames of this execution,
        host_request frames of this execution). ``on_request(frame)`` is called
        for every host_request (of any execution) and returns the fields of the
        host_reply (``ok``, ``result``/``error``) or None to leave it unanswered.
        Frames of other executions are kept in ``self.late``."""
        eid = eid or self.next_id()
        self.send("execute", execution=eid, code=code)
        return self.collect(eid, timeout, on_request, interrupt_after)

    def collect(self, eid, timeout=10.0, on_request=None, interrupt_after=None):
        deadline = time.monotonic() + timeout
        interrupt_at = None if interrupt_after is None else time.monotonic() + interrupt_after
        outputs, requests = [], []
        while True:
            now = time.monotonic()
            if interrupt_at is not None and now >= interrupt_at:
                self.send("interrupt", execution=eid)
                interrupt_at = None
            wait = deadline - now
            if interrupt_at is not None:
                wait = min(wait, interrupt_at - now)
            try:
                f = self.recv(max(wait, 0.001))
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise
                continue
            t = f["type"]
            if t == "host_request":
                (requests if f["execution"] == eid else self.late).append(f)
                if on_request is not None:
                    reply = on_request(f)
                    if reply is not None:
                        self.send("host_reply", execution=f["execution"], request=f["request"], **reply)
                continue
            if f.get("execution") != eid:
                self.late.append(f)
                continue
            if t == "output":
                outputs.append(f)
            elif t == "outcome":
                return f, outputs, requests
            else:
                self.late.append(f)

    def run_ok(self, code, **kw):
        outcome, outputs, _ = self.execute(code, **kw)
        assert outcome["status"] == "ok", outcome
        return outcome, outputs

    # -- end ----------------------------------------------------------------

    def wait_exit(self, timeout=5.0):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def diagnostics(self):
        try:
            self.stderr.seek(0)
            return self.stderr.read().decode("utf-8", "replace")
        except Exception:
            return "<unavailable>"

    def close(self):
        try:
            self.host.close()
        except OSError:
            pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.stderr.close()


def text_of(outputs, stream=None, origin=None):
    return "".join(f["data"] for f in outputs
                   if (stream is None or f["stream"] == stream) and (origin is None or f["origin"] == origin))


class HostRequestsTest(unittest.TestCase):
    """A real workbench runner whose host requests a test answers in order:
    ``cell`` returns (outcome, [(op, args)]); ``value`` asserts the cell ran
    and returns its value and the requests."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="klbr-peer-")
        cls.worker = Worker(workspace=cls.tmp).start()

    @classmethod
    def tearDownClass(cls):
        cls.worker.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def cell(self, code, answers):
        queue = list(answers)
        outcome, _, reqs = self.worker.execute(code, on_request=lambda f: queue.pop(0))
        return outcome, [(r["op"], r["args"]) for r in reqs]

    def value(self, code, answers):
        outcome, reqs = self.cell(code, answers)
        self.assertEqual(outcome["status"], "ok", outcome)
        return outcome["value"], reqs

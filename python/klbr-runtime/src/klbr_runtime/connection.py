"""The worker's end of the protocol socket: identity, sending, diagnostics.

Writes are serialized by one lock. A write from the main thread runs with the
asynchronous signals blocked, so the SIGINT used to interrupt a blocked cell
(or any signal handler a cell installs) can never cut a frame in half.
"""

import os
import signal
import sys
import threading

from . import PROTOCOL, SDK_VERSION, framing

try:  # the raw function returns plain ints; the signal.py wrapper builds enums
    from _signal import pthread_sigmask as _sigmask
except ImportError:  # pragma: no cover
    _sigmask = signal.pthread_sigmask

_SYNC_SIGNALS = {
    getattr(signal, name) for name in
    ("SIGKILL", "SIGSTOP", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS", "SIGABRT")
    if hasattr(signal, name)
}
ASYNC_SIGNALS = frozenset(int(s) for s in signal.valid_signals() if s not in _SYNC_SIGNALS)

EXIT_OK = 0          # shutdown, or the host closed the socket
EXIT_PROTOCOL = 2    # malformed frame, identity mismatch, bad environment
EXIT_INTERNAL = 3    # a bug in the runner itself


def diag(message):
    """Write a diagnostic line to the real stderr (the kernel's diagnostic tail)."""
    try:
        os.write(2, f"klbr-runtime[{os.getpid()}]: {message}\n".encode("utf-8", "backslashreplace"))
    except OSError:
        pass


def block_async_signals():
    """Block asynchronous signals in the calling thread (helper threads call
    this first, so process-directed signals are delivered to the main thread)."""
    _sigmask(signal.SIG_BLOCK, ASYNC_SIGNALS)


class ProtocolError(Exception):
    """A well-formed frame that breaks the protocol (identity, field types)."""


class Connection:
    def __init__(self, fd, role, session, generation, skills_revision="", out_fd=None):
        self.fd = fd  # frames are read from fd and written to out_fd (the same by default)
        self.out_fd = fd if out_fd is None else out_fd
        self.role = role
        self.session = session
        self.generation = generation
        self.skills_revision = skills_revision
        self._lock = threading.Lock()
        self._main_ident = threading.main_thread().ident
        self._reader = framing.FrameReader.from_fd(fd)

    # -- sending -------------------------------------------------------------

    def frame(self, type_, **fields):
        f = {"v": PROTOCOL, "type": type_, "session": self.session, "generation": self.generation}
        f.update(fields)
        return f

    def send(self, frame):
        """Encode and send one frame. Encoding errors (too large, not JSON)
        propagate to the caller; a closed socket ends the process."""
        self.send_bytes(framing.encode_frame(frame))

    def send_bytes(self, data):
        if threading.get_ident() == self._main_ident:
            old = _sigmask(signal.SIG_BLOCK, ASYNC_SIGNALS)
            try:
                self._write(data)
            finally:
                _sigmask(signal.SIG_SETMASK, old)
        else:
            self._write(data)

    def _write(self, data):
        try:
            with self._lock:
                framing.write_all(self.out_fd, data)
        except OSError as e:
            self.host_gone(f"writing to the protocol socket failed: {e}")

    def hello_frame(self):
        v = sys.version_info
        return self.frame(
            "hello", role=self.role, pid=os.getpid(),
            python=f"{v.major}.{v.minor}.{v.micro}", sdk=SDK_VERSION,
            protocol=PROTOCOL, skills_revision=self.skills_revision)

    def send_hello(self):
        self.send(self.hello_frame())

    # -- receiving -----------------------------------------------------------

    def read(self):
        """Return the next frame (identity checked), or None at end of stream.
        Raises framing.FrameError or ProtocolError."""
        f = self._reader.read_frame()
        if f is None:
            return None
        v, s, g = f.get("v"), f.get("session"), f.get("generation")
        if type(v) is not int or v != PROTOCOL:
            raise ProtocolError(f"frame has protocol version {v!r}, want {PROTOCOL}")
        if s != self.session or type(g) is not int or g != self.generation:
            raise ProtocolError(
                f"frame is for session {s!r} generation {g!r}, "
                f"this worker is {self.session!r} generation {self.generation}")
        t = f.get("type")
        if type(t) is not str or not t:
            raise ProtocolError("frame has no type")
        return f

    # -- ending --------------------------------------------------------------

    def host_gone(self, why="the host closed the protocol socket"):
        diag(f"{why}; exiting")
        os._exit(EXIT_OK)

    def protocol_error(self, err):
        diag(f"protocol error: {err}; abandoning the connection")
        os._exit(EXIT_PROTOCOL)


def field(frame, name, kind, default=None):
    """A typed field of a received frame. The host omits empty fields, so a
    missing (or null) value is the zero value ``default`` rather than an error."""
    v = frame.get(name)
    if v is None:
        v = default
    if kind is int:
        ok = type(v) is int
    else:
        ok = isinstance(v, kind)
    if not ok:
        raise ProtocolError(f"{frame.get('type')} frame: field {name!r} is {v!r}, want {kind.__name__}")
    return v

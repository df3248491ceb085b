"""Process entry: read the environment, open the protocol socket, run the role."""

import os
import threading

from . import framing
from .connection import (
    EXIT_INTERNAL, EXIT_PROTOCOL, Connection, ProtocolError, block_async_signals, diag,
)

ROLES = ("workbench", "hooks", "routine")  # a routine runs one cell in a fresh workbench


def _fail(message):
    diag(message)
    os._exit(EXIT_PROTOCOL)


def connect(environ=os.environ):
    """Validate the environment and return the Connection (no frame sent yet)."""
    role = environ.get("KLBR_ROLE", "")
    if role not in ROLES:
        _fail(f"KLBR_ROLE is {role!r}; want one of {', '.join(ROLES)}")
    session = environ.get("KLBR_SESSION", "")
    if not session:
        _fail("KLBR_SESSION is not set")
    try:
        generation = int(environ.get("KLBR_GENERATION", ""))
    except ValueError:
        generation = 0
    if generation < 1:
        _fail(f"KLBR_GENERATION is {environ.get('KLBR_GENERATION')!r}; want an integer >= 1")
    try:
        fd = int(environ.get("KLBR_PROTOCOL_FD", "3"))
        os.fstat(fd)
    except (ValueError, OSError) as e:
        _fail(f"KLBR_PROTOCOL_FD {environ.get('KLBR_PROTOCOL_FD', '3')!r} is not an open descriptor: {e}")
    # Under klbr-kernel --protocol-stdio (a worker host) the stream comes in on
    # fd and goes out on another descriptor: the kernel's stdin and stdout.
    out_fd = fd
    if environ.get("KLBR_PROTOCOL_OUT_FD"):
        try:
            out_fd = int(environ["KLBR_PROTOCOL_OUT_FD"])
            os.fstat(out_fd)
        except (ValueError, OSError) as e:
            _fail(f"KLBR_PROTOCOL_OUT_FD {environ['KLBR_PROTOCOL_OUT_FD']!r} is not an open descriptor: {e}")
    # Children a cell starts must not hold the protocol socket open: the host
    # sees EOF only when every copy is closed.
    for d in {fd, out_fd}:
        os.set_inheritable(d, False)
        os.set_blocking(d, True)
    return Connection(fd, role, session, generation, environ.get("KLBR_SKILLS_REVISION", ""), out_fd=out_fd)


def start_reader(conn, dispatch, name="klbr-reader"):
    """Start the thread that reads every frame and hands it to ``dispatch``.

    End of stream means the host is gone: the process exits. A malformed frame
    abandons the connection (exit 2). Anything ``dispatch`` raises other than a
    ProtocolError is logged and the thread keeps reading: it must never die.
    """

    def loop():
        block_async_signals()
        while True:
            try:
                f = conn.read()
            except (framing.FrameError, ProtocolError) as e:
                conn.protocol_error(e)
            except OSError as e:
                conn.host_gone(f"reading the protocol socket failed: {e}")
            if f is None:
                conn.host_gone()
            try:
                dispatch(f)
            except ProtocolError as e:
                conn.protocol_error(e)
            except BaseException as e:  # keep reading, whatever happened
                try:
                    import traceback
                    diag("reader: dispatch failed:\n" + "".join(traceback.format_exception(e)))
                except BaseException:
                    pass

    t = threading.Thread(target=loop, name=name, daemon=True)
    t.start()
    return t


def main():
    conn = connect()
    try:
        import faulthandler
        faulthandler.enable(file=2)
    except Exception:
        pass
    try:
        if conn.role in ("workbench", "routine"):
            from .workbench import run
        else:
            from .hooks import run
        run(conn)
    except BaseException as e:
        import traceback
        diag("the runner failed:\n" + "".join(traceback.format_exception(e)))
        os._exit(EXIT_INTERNAL)
    os._exit(EXIT_INTERNAL)  # run() never returns

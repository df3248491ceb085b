"""The ipykernel side of BenchmarkWorkbench (internal/worker/bench_test.go).

    /usr/bin/python3 ipykernel_bench.py --mode roundtrip|coldstart|idle-rss --n N \
        [--client blocking|raw] [--python /usr/bin/python3.11]

Starts Jupyter's ipykernel through jupyter_client's KernelManager, with the
kernel running on the interpreter given by --python (default: this script's
own interpreter, symlinks resolved), and prints one JSON object on stdout:

    {"mode": ..., "client": ..., "n": N, "python": ..., "versions": {...},
     "samples_us": [...],                  # roundtrip: one per cell
     "ready_ms": [...], "first_cell_ms": [...],   # coldstart: one per start
     "python_rss_mb": ...}                        # idle-rss

What is measured (the same things the klbr side measures):

  roundtrip   execute("x = 1") sent -> its execute_reply on the shell channel
              AND the kernel's "idle" status for it on iopub (the cell is
              really done only then). 20 unmeasured warm-up cells first.
  coldstart   start_kernel() -> client ready (kernel_info answered and iopub
              connected) = ready_ms; -> the first "x = 1" cell done =
              first_cell_ms. One unmeasured warm-up start first.
  idle-rss    VmRSS of the kernel process after startup and one cell
              (python_rss_mb; blocking client).

Clients:

  blocking    jupyter_client's BlockingKernelClient, the standard way to drive
              a kernel from Python: execute(), get_shell_msg(),
              get_iopub_msg(), wait_for_ready(). Its wait_for_ready polls
              (1 s shell timeout, 0.2 s iopub check) and ZeroMQ reconnects
              every 100 ms, so its cold start is partly client latency.
  raw         the same kernel and KernelManager, but plain synchronous
              pyzmq sockets and jupyter_client.session.Session, with a 5 ms
              reconnect interval and kernel_info_request re-sent every 20 ms:
              close to the lowest latency any Jupyter client can see. Reported
              so the comparison does not rest on the blocking client's costs.

Everything happens in this one process; diagnostics go to stderr.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def make_manager(python, spec_dir):
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    kdir = os.path.join(spec_dir, "kernels", "klbrbench")
    os.makedirs(kdir, exist_ok=True)
    with open(os.path.join(kdir, "kernel.json"), "w") as f:
        json.dump({"argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                   "display_name": "bench", "language": "python"}, f)
    ksm = KernelSpecManager(kernel_dirs=[os.path.join(spec_dir, "kernels")], ensure_native_kernel=False)
    return KernelManager(kernel_name="klbrbench", kernel_spec_manager=ksm)


# -- the blocking client -------------------------------------------------------

def blocking_cell(kc, code="x = 1", timeout=30):
    msg_id = kc.execute(code)
    reply = idle = False
    while not reply:
        m = kc.get_shell_msg(timeout=timeout)
        if m["parent_header"].get("msg_id") == msg_id:
            if m["content"].get("status") != "ok":
                raise RuntimeError(f"cell failed: {m['content']}")
            reply = True
    while not idle:
        m = kc.get_iopub_msg(timeout=timeout)
        if (m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "status"
                and m["content"].get("execution_state") == "idle"):
            idle = True


def blocking_roundtrip(km, n):
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        for _ in range(20):
            blocking_cell(kc)
        out = []
        for _ in range(n):
            t = time.perf_counter()
            blocking_cell(kc)
            out.append((time.perf_counter() - t) * 1e6)
        return out
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def blocking_coldstart_once(km):
    t0 = time.perf_counter()
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        t1 = time.perf_counter()
        blocking_cell(kc)
        t2 = time.perf_counter()
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return (t1 - t0) * 1e3, (t2 - t0) * 1e3


# -- the raw client ------------------------------------------------------------

class Raw:
    """Synchronous pyzmq sockets to a started kernel (shell DEALER, iopub SUB)."""

    def __init__(self, km):
        import zmq
        self.zmq = zmq
        self.session = km.session
        info = km.get_connection_info()
        self.ctx = zmq.Context()
        ip = info["ip"]
        tr = info["transport"]
        self.shell = self.ctx.socket(zmq.DEALER)
        self.iopub = self.ctx.socket(zmq.SUB)
        for s in (self.shell, self.iopub):
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RECONNECT_IVL, 5)
            s.setsockopt(zmq.RECONNECT_IVL_MAX, 5)
        self.iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self.shell.connect(f"{tr}://{ip}:{info['shell_port']}")
        self.iopub.connect(f"{tr}://{ip}:{info['iopub_port']}")

    def close(self):
        self.shell.close(0)
        self.iopub.close(0)
        self.ctx.term()

    def recv(self, sock, timeout_ms):
        if not sock.poll(timeout_ms):
            return None
        _, msg = self.session.recv(sock, mode=0)
        return msg

    def wait_ready(self, timeout=60):
        """kernel_info_request every 20 ms until answered; then until iopub
        delivers anything (the kernel's status messages), so a cell's idle
        status cannot be missed by a SUB socket that is not connected yet."""
        deadline = time.monotonic() + timeout
        sent = set()
        while True:
            if time.monotonic() > deadline:
                raise RuntimeError("kernel not ready")
            sent.add(self.session.send(self.shell, "kernel_info_request", {})["header"]["msg_id"])
            m = self.recv(self.shell, 20)
            if m is not None and m["parent_header"].get("msg_id") in sent:
                break
        while True:
            if time.monotonic() > deadline:
                raise RuntimeError("iopub not connected")
            if self.recv(self.iopub, 0) is not None:
                return
            self.session.send(self.shell, "kernel_info_request", {})
            self.recv(self.iopub, 20)  # also drains the replies' status messages
            while self.recv(self.shell, 0) is not None:
                pass

    def cell(self, code="x = 1", timeout=30):
        content = {"code": code, "silent": False, "store_history": True,
                   "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}
        msg_id = self.session.send(self.shell, "execute_request", content)["header"]["msg_id"]
        reply = idle = False
        poller = self.zmq.Poller()
        poller.register(self.shell, self.zmq.POLLIN)
        poller.register(self.iopub, self.zmq.POLLIN)
        deadline = time.monotonic() + timeout
        while not (reply and idle):
            if time.monotonic() > deadline:
                raise RuntimeError("cell timed out")
            for sock, _ in poller.poll(1000):
                _, m = self.session.recv(sock, mode=0)
                if m["parent_header"].get("msg_id") != msg_id:
                    continue
                if sock is self.shell:
                    if m["content"].get("status") != "ok":
                        raise RuntimeError(f"cell failed: {m['content']}")
                    reply = True
                elif m["msg_type"] == "status" and m["content"].get("execution_state") == "idle":
                    idle = True


def raw_roundtrip(km, n):
    km.start_kernel()
    r = Raw(km)
    try:
        r.wait_ready()
        for _ in range(20):
            r.cell()
        out = []
        for _ in range(n):
            t = time.perf_counter()
            r.cell()
            out.append((time.perf_counter() - t) * 1e6)
        return out
    finally:
        r.close()
        km.shutdown_kernel(now=True)


def raw_coldstart_once(km):
    t0 = time.perf_counter()
    km.start_kernel()
    r = Raw(km)
    try:
        r.wait_ready()
        t1 = time.perf_counter()
        r.cell()
        t2 = time.perf_counter()
    finally:
        r.close()
        km.shutdown_kernel(now=True)
    return (t1 - t0) * 1e3, (t2 - t0) * 1e3


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def idle_rss(km):
    """RSS of the kernel process after startup and one cell."""
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        blocking_cell(kc)
        time.sleep(0.5)
        return rss_mb(km.provisioner.process.pid)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("roundtrip", "coldstart", "idle-rss"), required=True)
    ap.add_argument("--client", choices=("blocking", "raw"), default="blocking")
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--python", default=os.path.realpath(sys.executable))
    a = ap.parse_args()

    import ipykernel
    import jupyter_client
    import zmq

    spec_dir = tempfile.mkdtemp(prefix="klbr-ipykernel-bench-")
    # IPython's profile and history database: a private directory (set by the
    # Go benchmark, shared by its runs), not the user's ~/.ipython.
    os.environ.setdefault("IPYTHONDIR", os.path.join(spec_dir, "ipython"))
    res = {"mode": a.mode, "client": a.client, "n": a.n, "python": a.python,
           "client_python": sys.executable,
           "versions": {"ipykernel": ipykernel.__version__, "jupyter_client": jupyter_client.__version__,
                        "pyzmq": zmq.__version__, "python": sys.version.split()[0]}}
    try:
        if a.mode == "roundtrip":
            fn = blocking_roundtrip if a.client == "blocking" else raw_roundtrip
            xs = fn(make_manager(a.python, spec_dir), a.n)
            res["samples_us"] = xs
            res["p50_us"] = statistics.median(xs)
            res["p99_us"] = pct(xs, 0.99)
        elif a.mode == "idle-rss":
            res["python_rss_mb"] = idle_rss(make_manager(a.python, spec_dir))
        else:
            once = blocking_coldstart_once if a.client == "blocking" else raw_coldstart_once
            # A manager cannot start a second kernel after shutting one down
            # (its ZeroMQ context is gone): a fresh one, made untimed, per start.
            once(make_manager(a.python, spec_dir))  # warm-up: page cache, IPython profile
            ready, first = [], []
            for _ in range(a.n):
                r, f = once(make_manager(a.python, spec_dir))
                ready.append(r)
                first.append(f)
            res["ready_ms"] = ready
            res["first_cell_ms"] = first
            res["p50_ms"] = statistics.median(ready)
            res["p50_first_cell_ms"] = statistics.median(first)
    finally:
        shutil.rmtree(spec_dir, ignore_errors=True)
    json.dump(res, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

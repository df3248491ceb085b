"""Rough performance figures of the runner, through the test host peer.

    python3 python/klbr-runtime/tests/bench_roundtrip.py

Prints the cold start (spawn to hello) of both roles, the round trip of an
``x = 1`` cell and of a hook invocation, and the floor of the same peer
against a trivial echo process (so runner overhead ~= round trip - floor).
Not a test: numbers depend on the machine.
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peer  # noqa: E402

ECHO = r"""
import os, struct, sys
fd = int(os.environ["KLBR_PROTOCOL_FD"])
hello = b'{"v":1,"type":"hello","session":"%s","generation":%d}' % (os.environ["KLBR_SESSION"].encode(), int(os.environ["KLBR_GENERATION"]))
os.write(fd, struct.pack(">I", len(hello)) + hello)
buf = b""
while True:
    while len(buf) < 4:
        c = os.read(fd, 65536)
        if not c: sys.exit(0)
        buf += c
    n = struct.unpack(">I", buf[:4])[0]
    while len(buf) < 4 + n:
        c = os.read(fd, 65536)
        if not c: sys.exit(0)
        buf += c
    body, buf = buf[4:4 + n], buf[4 + n:]
    import json
    f = json.loads(body)
    out = json.dumps({"v": 1, "type": "outcome", "session": f["session"], "generation": f["generation"],
                      "execution": f["execution"], "status": "ok", "value": None, "value_truncated": False},
                     separators=(",", ":")).encode()
    os.write(fd, struct.pack(">I", len(out)) + out)
"""


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def summary(name, ms):
    print(f"{name:44s} median {statistics.median(ms):7.3f} ms   p99 {pct(ms, 0.99):7.3f} ms   min {min(ms):7.3f} ms")


def cold_start(role, n=10, **kw):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        w = peer.Worker(role=role, **kw).start()
        out.append((time.perf_counter() - t) * 1000)
        w.send("shutdown")
        w.wait_exit()
        w.close()
    return out


def bare(args, n=10):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-s", *args], check=True)
        out.append((time.perf_counter() - t) * 1000)
    return out


def cells(w, code, n):
    for _ in range(100):
        w.execute(code)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        w.execute(code)
        out.append((time.perf_counter() - t) * 1000)
    return out


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    print(f"python {sys.version.split()[0]} ({sys.executable})")
    summary("interpreter: python -s -c pass", bare(["-c", "pass"]))
    summary("interpreter: python -s -c 'import asyncio'", bare(["-c", "import asyncio"]))
    summary("cold start, workbench (spawn -> hello)", cold_start("workbench"))
    summary("cold start, hooks (spawn -> hello)", cold_start("hooks"))

    with tempfile.TemporaryDirectory() as d:
        w = peer.Worker(workspace=d).start()
        summary(f"round trip 'x = 1' (n={n})", cells(w, "x = 1", n))
        summary(f"round trip 'print(x)' (n={n})", cells(w, "print(x)", n))
        w.send("shutdown")
        w.wait_exit()
        w.close()

        w = peer.Worker(python=None, extra_args=("-c", ECHO, "--"))
        # -c replaces -m: the echo process ignores the module arguments.
        w.start()
        summary(f"floor: same peer against an echo process", cells(w, "x = 1", n))
        w.close()

        pkg = os.path.join(d, "b", "klbr_hooks")
        os.makedirs(pkg)
        with open(os.path.join(pkg, "__init__.py"), "w") as f:
            f.write("SLOTS = {'attention.plan': lambda data: {'ok': True}}\n")
        w = peer.Worker(role="hooks", behavior_dir=os.path.dirname(pkg)).start()
        out = []
        for i in range(n + 100):
            t = time.perf_counter()
            w.send("hook_invoke", invocation=f"h{i}", slot="attention.plan", input={"items": []})
            assert w.recv()["ok"] is True
            if i >= 100:
                out.append((time.perf_counter() - t) * 1000)
        summary(f"round trip hook_invoke (n={n})", out)
        w.send("shutdown")
        w.wait_exit()
        w.close()


if __name__ == "__main__":
    main()

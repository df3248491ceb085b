"""The host's validation suite of a candidate behavior release.

It ships with klbr-core (inside klbr_runtime, never in a release), so a
candidate cannot edit what judges it. klbr-core runs it in a fresh, contained
process at activation::

    python -s -P -m klbr_runtime.validate [--site DIR] TREE

and accepts exactly one JSON line on its stdout, from a process that exited 0::

    {"ok": bool, "slots": [str, ...], "attempts": [str, ...],
     "checks": [{"name": str, "ok": bool, "detail": str}, ...]}

With fake effects, it checks that every module of ``klbr_hooks`` and
``klbr_skills`` imports, and that none of them connects a socket, sends,
resolves a name or starts a process while importing; that ``klbr_hooks.SLOTS``
maps slot names to callables (their names are reported: the host then has
each bound slot answer its fixtures); and that every ``skills/<id>/SKILL.md``
starts with ``# <id>``. Nothing here trusts the candidate's own tests.

Why the candidate cannot forge the report
-----------------------------------------
Code that runs in a process owns that process: it can print, find and write
every descriptor (``/proc/self/fd``), read any secret in its memory, patch
any function and end the process. So the process that reports to the host,
the *supervisor*, never runs candidate code: it only reads files of the tree.
Each module is imported by a *probe* of its own, a child forked from the
supervisor that, before any candidate code runs, takes its own process group,
keeps only its own pipes (stdout and stderr to one, its answer on fd 3) and
closes every other descriptor; it imports that one module, answers one JSON
line about it and exits. The supervisor judges each probe from outside:

- a probe that exits non-zero, is killed, exits before answering, answers
  twice, answers about another module or overruns its time fails its check;
- so a module's code can decide at most the answer of the probe its own
  import runs in, which is no more than it could do by importing cleanly;
  it cannot reach another module's check, the SKILL.md checks, or the report.

The supervisor makes itself non-dumpable before forking (the probes inherit
it), so processes of the sandbox's uid can neither trace it nor open its
descriptors under ``/proc``. klbr-core accepts only a single report line,
from a supervisor that exited 0, naming exactly the checks it expects (it
enumerates the modules and skills itself): a report printed by anything else
is a second line, a killed supervisor a non-zero exit, a missing check a
refusal. A per-run nonce would add nothing: the probes are forked from the
supervisor, so any secret it held would be theirs too, and a report that
is not the supervisor's is refused by the rules above. Run as root without
the workers' sandbox, candidate code could trace the supervisor like
anything else of that uid; the workers' sandbox (its own uid, no
capabilities) is what makes the above hold.
"""

import contextlib
import io
import json
import os
import selectors
import signal
import subprocess
import sys
import time

MAX_DETAIL = 2000
MAX_ATTEMPTS = 64  # attempts a probe lists; more are counted
MAX_ANSWER = 256 << 10  # bytes of a probe's answer; more is a failure
MAX_OUTPUT = 4 << 10  # bytes of a probe's own output kept for the detail
PROBE_TIMEOUT = 15.0  # seconds one probe may take
SUITE_BUDGET = 45.0  # seconds all probes may take (the host allows 60)


class EffectAttempted(Exception):
    pass


def _short(text):
    text = str(text)
    return text if len(text) <= MAX_DETAIL else text[:MAX_DETAIL - 1] + "…"


@contextlib.contextmanager
def fake_effects(attempts):
    """Refuse and record every network, send and process effect (plain
    attribute swaps: unittest.mock would double the suite's start-up)."""
    import socket

    def refuse(what):
        def _refused(*args, **kwargs):
            attempts.append(what)
            raise EffectAttempted(f"{what} during import: modules of a release must not act when imported")
        return _refused

    targets = [(socket.socket, n, f"socket.{n}") for n in ("connect", "connect_ex", "sendto", "sendmsg", "send", "sendall")]
    targets += [(socket, n, f"socket.{n}") for n in ("create_connection", "getaddrinfo", "gethostbyname")]
    targets += [(subprocess, "Popen", "subprocess.Popen")]
    targets += [(os, n, f"os.{n}") for n in ("system", "popen", "execv", "execve", "fork", "posix_spawn") if hasattr(os, n)]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in targets]
    try:
        for obj, name, what in targets:
            setattr(obj, name, refuse(what))
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


def _modules(tree, package):
    """Dotted names of every module of ``package`` in ``tree``, package first.

    klbr-core enumerates the same names itself (activation.expectedChecks) and
    requires a check for each: keep the two in step."""
    root = os.path.join(tree, package)
    if not os.path.isdir(root):
        return []
    names = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        rel = os.path.relpath(dirpath, tree).replace(os.sep, ".")
        for f in sorted(filenames):
            if not f.endswith(".py"):
                continue
            names.append(rel if f == "__init__.py" else f"{rel}.{f[:-3]}")
    names.sort(key=lambda n: (n != package, n))
    return names


def _import(name, attempts):
    import importlib
    import traceback
    before = len(attempts)
    out, err = io.StringIO(), io.StringIO()
    try:
        with fake_effects(attempts), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            mod = importlib.import_module(name)
    except BaseException as e:  # a module may raise anything, SystemExit included
        tb = traceback.format_exception_only(type(e), e)
        return None, {"name": f"import {name}", "ok": False, "detail": _short("".join(tb).strip())}
    if len(attempts) > before:
        return mod, {"name": f"import {name}", "ok": False,
                     "detail": f"attempted {', '.join(attempts[before:])} while importing (caught and refused)"}
    return mod, {"name": f"import {name}", "ok": True, "detail": ""}


def _slots_check(mod):
    """The check of klbr_hooks.SLOTS and the names it binds."""
    if mod is None:
        return {"name": "klbr_hooks.SLOTS", "ok": False, "detail": "klbr_hooks did not import"}, []
    table = getattr(mod, "SLOTS", None)
    if not isinstance(table, dict):
        return {"name": "klbr_hooks.SLOTS", "ok": False,
                "detail": f"SLOTS must be a dict of slot name to callable, not {type(table).__name__}"}, []
    bad = [repr(k) for k, v in table.items() if not isinstance(k, str) or not callable(v)]
    return ({"name": "klbr_hooks.SLOTS", "ok": not bad,
             "detail": _short("entries that are not str → callable: " + ", ".join(bad)) if bad else ""},
            sorted(k for k in table if isinstance(k, str)))


def _skills(tree):
    checks = []
    root = os.path.join(tree, "skills")
    if not os.path.isdir(root):
        return checks
    for sid in sorted(os.listdir(root)):
        p = os.path.join(root, sid, "SKILL.md")
        if not os.path.isdir(os.path.join(root, sid)):
            continue
        ok, detail = True, ""
        try:
            with open(p, encoding="utf-8") as f:
                first = next((ln.strip() for ln in f if ln.strip()), "")
            if first != f"# {sid}":
                ok, detail = False, f"the first non-empty line is {first!r}, want '# {sid}'"
        except (OSError, UnicodeDecodeError) as e:
            ok, detail = False, str(e)
        checks.append({"name": f"skills/{sid}/SKILL.md", "ok": ok, "detail": detail})
    return checks


# ---- the probe: a forked child that imports one module, answers, exits ----

def _probe(tree, site, name, below, answer_fd):
    """In a freshly forked child: import ``name`` from ``tree`` and write one
    JSON line about it to ``answer_fd``. Everything the probe needs was
    imported by the supervisor before the fork, so no module of the tree can
    stand in for it.

    When ``name`` is a package that imported cleanly, the answer also names
    (``covers``) the modules of ``below`` (its submodules) that its import
    loaded: importing one of them in a fresh process would run exactly this
    import again (its parent package first, which loads it), so the same
    code would decide its check. The others get probes of their own."""
    sys.dont_write_bytecode = True
    runtime = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, tree)
    if site:  # as the hook worker's PYTHONPATH orders them: the runtime, then the release's dependencies
        sys.path.insert(sys.path.index(runtime) + 1 if runtime in sys.path else len(sys.path), site)
    attempts = []
    mod, check = _import(name, attempts)
    answer = {"module": name, "checks": [check], "attempts": attempts[:MAX_ATTEMPTS], "slots": [], "covers": []}
    if check["ok"]:
        answer["covers"] = [n for n in below if n in sys.modules]
    if len(attempts) > MAX_ATTEMPTS:
        answer["attempts"].append(f"… and {len(attempts) - MAX_ATTEMPTS} more")
    if name == "klbr_hooks":
        slots_check, answer["slots"] = _slots_check(mod)
        answer["checks"].append(slots_check)
    data = (json.dumps(answer) + "\n").encode()
    while data:
        data = data[os.write(answer_fd, data):]


# ---- the supervisor: never imports the candidate ----

def _no_dumps():
    """Make this process non-dumpable (PR_SET_DUMPABLE 0), and so every probe
    forked from it: other processes of its uid cannot trace it or open its
    descriptors under /proc."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        return False


def _failed(name, detail, output=b""):
    if output:
        detail += "; its output: " + output.decode("utf-8", "replace").strip()[-500:]
    return {"name": f"import {name}", "ok": False, "detail": _short(detail)}


def _judge(name, below, code, timed_out, answer, output):
    """The checks a probe's run yields, judged from outside it: (checks,
    attempts, slots, covers). code is its exit status (negative: killed by a
    signal); below are the submodules of name it may cover."""
    if timed_out:
        return [_failed(name, f"its import did not finish within {PROBE_TIMEOUT:g}s", output)], [], [], []
    if code < 0:
        return [_failed(name, f"its import probe was killed by signal {-code} (a module killed its validator)", output)], [], [], []
    if answer is None:
        return [_failed(name, f"its import probe answered over {MAX_ANSWER} bytes", output)], [], [], []
    lines = answer.splitlines()
    if not lines:
        return [_failed(name, f"its import probe exited with code {code} before answering "
                              "(a module ended the process while importing)", output)], [], [], []
    if len(lines) > 1:
        return [_failed(name, "its import probe answered more than once (something else wrote on its answer pipe)")], [], [], []
    try:
        a = json.loads(lines[0])
        checks, attempts, slots, covers = a["checks"], a["attempts"], a["slots"], a["covers"]
        ok = (a["module"] == name and isinstance(checks, list) and isinstance(attempts, list) and isinstance(slots, list)
              and isinstance(covers, list) and all(isinstance(s, str) for s in attempts + slots))
        ok = ok and len(set(covers)) == len(covers) and set(covers) <= set(below)
        want = [f"import {name}"] + (["klbr_hooks.SLOTS"] if name == "klbr_hooks" else [])
        ok = ok and [c.get("name") if isinstance(c, dict) else None for c in checks] == want
        ok = ok and (name == "klbr_hooks" or not slots)  # only klbr_hooks binds slots
        checks = [{"name": c["name"], "ok": c["ok"] is True, "detail": _short(c.get("detail", ""))} for c in checks] if ok else []
        ok = ok and (not covers or checks[0]["ok"])  # only a clean import covers its submodules
    except (ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        return [_failed(name, "its import probe's answer is not an answer about this module")], [], [], []
    if code != 0:
        return [_failed(name, f"its import probe exited with code {code} after answering", output)], [], [], []
    return checks, attempts, slots, covers


class _Run:
    """One probe being supervised."""

    def __init__(self, name, pid, answer_fd, output_fd, limit):
        self.name, self.pid, self.limit = name, pid, limit
        self.bufs = {answer_fd: bytearray(), output_fd: bytearray()}
        self.answer_fd, self.output_fd = answer_fd, output_fd
        self.code, self.exited_at = None, None


def _fork_probe(tree, site, name, below, limit):
    """Fork a probe for ``name``. In the child, before any candidate code:
    its own process group; stdin the null device, stdout and stderr its
    output pipe, its answer pipe on fd 3, every other descriptor closed."""
    ar, aw = os.pipe()
    orr, ow = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            os.setpgid(0, 0)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(ow, 1)
            os.dup2(ow, 2)
            os.dup2(aw, 3)
            os.closerange(4, 1 << 20)
            code = 0
            _probe(tree, site, name, below, 3)
        except BaseException:  # noqa: BLE001  (reported as no answer)
            code = 70
        finally:
            os._exit(code)  # no atexit of the candidate's, no flush of its buffers
    os.close(aw)
    os.close(ow)
    return _Run(name, pid, ar, orr, limit)


def _kill_group(pid):
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # whatever the module left in its group


def _below(name, names):
    return [n for n in names if n.startswith(name + ".")]


def _supervise(tree, site, names):
    """Run a probe per module, at most a few at once, each after its parent
    packages' probes (which may cover it), and judge each."""
    results, pending, running = {}, list(names), {}
    sel = selectors.DefaultSelector()
    deadline = time.monotonic() + SUITE_BUDGET
    workers = max(1, min(4, os.cpu_count() or 1))
    while pending or running:
        busy = set(pending) | {r.name for r in running.values()}
        for name in [n for n in pending if not any(n.startswith(b + ".") for b in busy)]:
            if len(running) >= workers:
                break
            pending.remove(name)
            now = time.monotonic()
            if now >= deadline:
                results[name] = ([_failed(name, f"not imported: the suite's {SUITE_BUDGET:g}s were spent on other modules")], [], [])
                continue
            run = _fork_probe(tree, site, name, [n for n in _below(name, names) if n in pending],
                              min(now + PROBE_TIMEOUT, deadline))
            running[run.pid] = run
            for fd in run.bufs:
                sel.register(fd, selectors.EVENT_READ, run)
        if not sel.get_map():
            time.sleep(0.01)  # only exits (or time limits) are left to wait for
        for key, _ in sel.select(timeout=0.05) if sel.get_map() else ():
            run, buf = key.data, key.data.bufs[key.fd]
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fd)
                continue
            room = (MAX_ANSWER + 1 if key.fd == run.answer_fd else MAX_OUTPUT) - len(buf)
            buf += chunk[:max(room, 0)]
        now = time.monotonic()
        for pid, run in list(running.items()):
            if run.code is None:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    run.code, run.exited_at = os.waitstatus_to_exitcode(status), now
            open_fds = [fd for fd in run.bufs if fd in sel.get_map()]
            # Done when both pipes ended; a module may leave a process holding
            # them open: once the probe itself exited, a short grace, then done.
            grace_over = run.exited_at is not None and now - run.exited_at > 0.5
            timed_out = run.code is None and now >= run.limit
            if open_fds and not grace_over and not timed_out:
                continue
            _kill_group(pid)
            if run.code is None:
                run.code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            for fd in open_fds:
                sel.unregister(fd)
            for fd in run.bufs:
                os.close(fd)
            answer = bytes(run.bufs[run.answer_fd])
            below = [n for n in _below(run.name, names) if n in pending]
            checks, attempts, slots, covers = _judge(run.name, below, run.code, timed_out,
                                                     None if len(answer) > MAX_ANSWER else answer,
                                                     bytes(run.bufs[run.output_fd]))
            results[run.name] = (checks, attempts, slots)
            for n in covers:
                pending.remove(n)
                results[n] = ([{"name": f"import {n}", "ok": True, "detail": f"imported by {run.name}"}], [], [])
            del running[pid]
    sel.close()
    return [results[n] for n in names]


def validate(tree, site=""):
    """Judge ``tree`` with one probe per module; never imports from it."""
    tree = os.path.realpath(tree)
    names = _modules(tree, "klbr_hooks") + _modules(tree, "klbr_skills")
    checks, attempts, slots = [], [], []
    for name, (c, a, s) in zip(names, _supervise(tree, site, names)):
        if name == "klbr_hooks" and len(c) == 1:  # its probe failed before judging SLOTS
            c = c + [{"name": "klbr_hooks.SLOTS", "ok": False, "detail": "klbr_hooks did not import"}]
        checks += c
        attempts += a
        slots += s
    if "klbr_hooks" not in names:
        checks.append({"name": "klbr_hooks.SLOTS", "ok": False, "detail": "klbr_hooks did not import"})
    checks.extend(_skills(tree))
    return {"ok": all(c["ok"] for c in checks), "slots": sorted(set(slots)), "attempts": attempts, "checks": checks}


def main(argv):
    args = argv[1:]
    site = ""
    if args[:1] == ["--site"] and len(args) >= 2:
        site, args = args[1], args[2:]
    if len(args) != 1:
        print("usage: python -m klbr_runtime.validate [--site DIR] TREE", file=sys.stderr)
        return 2
    # What a probe uses, loaded here before any fork (and before the tree is
    # on any path): the socket and subprocess that fake_effects patches,
    # importlib and traceback for _import.
    import importlib  # noqa: F401
    import socket  # noqa: F401
    import traceback  # noqa: F401
    _no_dumps()
    report = validate(args[0], site)
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

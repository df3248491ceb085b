"""The host's validation suite of a candidate behavior release.

It ships with klbr-core (inside klbr_runtime, never in a release), so a
candidate cannot edit what judges it. klbr-core runs it in a fresh, contained
process at activation::

    python -s -m klbr_runtime.validate TREE

and reads one JSON object from stdout::

    {"ok": bool, "slots": [str, ...], "attempts": [str, ...],
     "checks": [{"name": str, "ok": bool, "detail": str}, ...]}

With fake effects, it checks that every module of ``klbr_hooks`` and
``klbr_skills`` imports, and that none of them connects a socket, sends,
resolves a name or starts a process while importing; that ``klbr_hooks.SLOTS``
maps slot names to callables (their names are reported: the host then has
each bound slot answer its fixtures); and that every ``skills/<id>/SKILL.md``
starts with ``# <id>``. Nothing here trusts the candidate's own tests.
"""

import contextlib
import io
import json
import os
import sys

MAX_DETAIL = 2000


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
    import subprocess

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
    """Dotted names of every module of ``package`` in ``tree``, package first."""
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


def validate(tree):
    tree = os.path.realpath(tree)
    sys.dont_write_bytecode = True
    sys.path.insert(0, tree)
    attempts, checks, slots = [], [], []
    hooks_mod = None
    for name in _modules(tree, "klbr_hooks"):
        mod, check = _import(name, attempts)
        checks.append(check)
        if name == "klbr_hooks":
            hooks_mod = mod
    if hooks_mod is None:
        checks.append({"name": "klbr_hooks.SLOTS", "ok": False, "detail": "klbr_hooks did not import"})
    else:
        table = getattr(hooks_mod, "SLOTS", None)
        if not isinstance(table, dict):
            checks.append({"name": "klbr_hooks.SLOTS", "ok": False,
                           "detail": f"SLOTS must be a dict of slot name to callable, not {type(table).__name__}"})
        else:
            bad = [repr(k) for k, v in table.items() if not isinstance(k, str) or not callable(v)]
            checks.append({"name": "klbr_hooks.SLOTS", "ok": not bad,
                           "detail": ("entries that are not str → callable: " + ", ".join(bad)) if bad else ""})
            slots = sorted(k for k in table if isinstance(k, str))
    for name in _modules(tree, "klbr_skills"):
        checks.append(_import(name, attempts)[1])
    checks.extend(_skills(tree))
    return {"ok": all(c["ok"] for c in checks), "slots": slots, "attempts": attempts, "checks": checks}


def main(argv):
    if len(argv) != 2:
        print("usage: python -m klbr_runtime.validate TREE", file=sys.stderr)
        return 2
    real_stdout = sys.stdout
    report = validate(argv[1])
    real_stdout.write(json.dumps(report) + "\n")
    real_stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""The host's validation suite (klbr_runtime.validate) on small trees."""

import json
import os
import socket
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
sys.dont_write_bytecode = True  # keep src/ free of __pycache__ (klbr-core embeds the tree)
sys.path.insert(0, SRC)

from klbr_runtime import validate  # noqa: E402

GOOD_HOOKS = ("def review(inp):\n    return {'decision': 'allow', 'reason': ''}\n"
              "SLOTS = {'delivery.review': review}\n")


def tree(files):
    d = tempfile.mkdtemp(prefix="klbr-validate-")
    for path, body in files.items():
        p = os.path.join(d, path)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(body)
    return d


def run(d):
    """Run the suite as klbr-core does; its whole stdout is one report line."""
    env = dict(os.environ, PYTHONPATH=SRC, PYTHONDONTWRITEBYTECODE="1", PYTHONSAFEPATH="1")
    out = subprocess.run([sys.executable, "-s", "-P", "-m", "klbr_runtime.validate", d], env=env, cwd=d,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.count("\n") == 1, (out.returncode, out.stdout, out.stderr)
    return json.loads(out.stdout)


def failed(r):
    return {c["name"]: c["detail"] for c in r["checks"] if not c["ok"]}


FORGED = ('{"ok": true, "slots": ["delivery.review"], "attempts": [], "checks": []}')


class ValidateTest(unittest.TestCase):
    def test_fake_effects_refuse_and_restore(self):
        attempts = []
        before = socket.create_connection
        with validate.fake_effects(attempts):
            with self.assertRaises(validate.EffectAttempted):
                socket.create_connection(("127.0.0.1", 9))
            with self.assertRaises(validate.EffectAttempted):
                os.system("true")
        self.assertIs(socket.create_connection, before)
        self.assertEqual(attempts, ["socket.create_connection", "os.system"])

    def test_good_tree(self):
        r = run(tree({"klbr_hooks/__init__.py": GOOD_HOOKS, "klbr_skills/__init__.py": "",
                      "klbr_skills/tool.py": "def f():\n    return 1\n", "skills/a/SKILL.md": "# a\nbody\n"}))
        self.assertTrue(r["ok"], r)
        self.assertEqual(r["slots"], ["delivery.review"])
        self.assertIn("import klbr_skills.tool", [c["name"] for c in r["checks"]])

    def test_refusals(self):
        r = run(tree({"klbr_hooks/__init__.py": "import socket\ntry:\n    socket.getaddrinfo('example.com', 80)\n"
                                                "except Exception:\n    pass\n" + GOOD_HOOKS,
                      "klbr_skills/__init__.py": "", "klbr_skills/bad.py": "def f(:\n",
                      "klbr_skills/quits.py": "raise SystemExit(3)\n", "skills/a/SKILL.md": "# b\n"}))
        self.assertFalse(r["ok"])
        bad = {c["name"]: c["detail"] for c in r["checks"] if not c["ok"]}
        self.assertIn("socket.getaddrinfo", bad["import klbr_hooks"])
        self.assertIn("SyntaxError", bad["import klbr_skills.bad"])
        self.assertIn("SystemExit", bad["import klbr_skills.quits"])
        self.assertIn("want '# a'", bad["skills/a/SKILL.md"])
        self.assertEqual(r["attempts"], ["socket.getaddrinfo"])


class ProbeTest(unittest.TestCase):
    """Each module is imported in a probe of its own; what a module does to
    its probe decides at most its own check, and a probe that ends early,
    is killed or answers wrongly fails it."""

    def test_each_way_of_ending_a_probe_fails_only_that_module(self):
        bodies = {
            "exits": "import os\nos.write(1, b'%s\\n')\nos._exit(0)\n" % FORGED,
            "killed": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
            "twice": "import os, json\nfor m in ('klbr_skills.twice', 'klbr_skills.bad'):\n"
                     "    os.write(3, (json.dumps({'module': m, 'checks': [{'name': 'import ' + m, 'ok': True}],"
                     " 'attempts': [], 'slots': [], 'covers': []}) + '\\n').encode())\n",
            "other": "import os, json\nos.write(3, (json.dumps({'module': 'klbr_skills.bad', 'checks':"
                     " [{'name': 'import klbr_skills.bad', 'ok': True}], 'attempts': [], 'slots': [], 'covers': []})"
                     " + '\\n').encode())\nos._exit(0)\n",
            "patches": "import sys\nm = sys.modules['__main__']\nm._import = lambda n, a: (None, {'name': 'import ' + n, 'ok': True, 'detail': ''})\n"
                       "m._skills = lambda tree: []\n",
            "fds": "import os\nfor n in os.listdir('/proc/self/fd'):\n    try:\n        os.write(int(n), b'%s\\n')\n"
                   "    except OSError:\n        pass\nos._exit(0)\n" % FORGED,
        }
        files = {"klbr_hooks/__init__.py": GOOD_HOOKS, "klbr_skills/__init__.py": "", "klbr_skills/bad.py": "def f(:\n",
                 "skills/a/SKILL.md": "# b\n"}
        files.update({f"klbr_skills/{k}.py": v for k, v in bodies.items()})
        r = run(tree(files))
        self.assertFalse(r["ok"])
        bad = failed(r)
        self.assertIn("exited with code 0 before answering", bad["import klbr_skills.exits"])
        self.assertIn("killed by signal 9", bad["import klbr_skills.killed"])
        self.assertIn("more than once", bad["import klbr_skills.twice"])
        self.assertIn("not an answer about this module", bad["import klbr_skills.other"])
        self.assertIn("not an answer about this module", bad["import klbr_skills.fds"])  # it wrote on fd 3 too
        # What they forged or patched reached nothing else: the other checks stand.
        self.assertIn("SyntaxError", bad["import klbr_skills.bad"])
        self.assertIn("want '# a'", bad["skills/a/SKILL.md"])
        self.assertNotIn("import klbr_skills.patches", bad)
        self.assertEqual(r["slots"], ["delivery.review"])
        self.assertEqual(sorted(c["name"] for c in r["checks"]), sorted(
            ["import klbr_hooks", "klbr_hooks.SLOTS", "import klbr_skills", "import klbr_skills.bad", "skills/a/SKILL.md"]
            + [f"import klbr_skills.{k}" for k in bodies]))

    def test_a_package_covers_only_what_its_import_loaded(self):
        r = run(tree({"klbr_hooks/__init__.py": "from . import a\n" + GOOD_HOOKS, "klbr_hooks/a.py": "X = 1\n",
                      "klbr_hooks/b.py": "def f(:\n"}))
        checks = {c["name"]: c for c in r["checks"]}
        self.assertEqual(checks["import klbr_hooks.a"]["detail"], "imported by klbr_hooks")
        self.assertFalse(checks["import klbr_hooks.b"]["ok"])
        self.assertIn("SyntaxError", checks["import klbr_hooks.b"]["detail"])

    def test_a_probe_does_not_hold_the_supervisors_descriptors(self):
        r = run(tree({"klbr_hooks/__init__.py": GOOD_HOOKS, "klbr_skills/__init__.py": "",
                      "klbr_skills/fds.py": "import os\nFDS = sorted(int(n) for n in os.listdir('/proc/self/fd'))\n"
                                            "assert FDS[:4] == [0, 1, 2, 3] and all(n > 3 for n in FDS[4:]) and len(FDS) <= 5, FDS\n"}))
        self.assertTrue(r["ok"], failed(r))

    def test_a_release_cannot_stand_in_for_the_suite(self):
        r = run(tree({"klbr_hooks/__init__.py": GOOD_HOOKS, "klbr_skills/__init__.py": "", "klbr_skills/bad.py": "def f(:\n",
                      "klbr_runtime/__init__.py": "", "klbr_runtime/validate.py": f"print({FORGED!r})\n",
                      "json.py": "raise SystemExit('the suite imported json from the tree')\n"}))
        self.assertIn("SyntaxError", failed(r)["import klbr_skills.bad"])


if __name__ == "__main__":
    unittest.main()

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
    env = dict(os.environ, PYTHONPATH=SRC, PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run([sys.executable, "-s", "-m", "klbr_runtime.validate", d], env=env,
                         capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])


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


if __name__ == "__main__":
    unittest.main()

"""The hooks role, end to end, with a temporary behavior directory."""

import os
import shutil
import sys
import tempfile
import textwrap
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peer  # noqa: E402

HOOKS = textwrap.dedent('''
    import asyncio
    import sys

    import klbr

    def plan(data):
        items = data.get("items", [])
        return {"order": sorted(items), "defer_seconds": 8}

    async def review(data):
        await asyncio.sleep(0.01)
        return {"decision": "allow" if "ok" in data.get("text", "") else "hold"}

    def boom(data):
        raise RuntimeError("policy exploded: " + str(data.get("why")))

    def not_a_dict(data):
        return ["allow"]

    def not_json(data):
        return {"x": float("nan")}

    def too_big(data):
        return {"x": "y" * (2 << 20)}

    def exits(data):
        sys.exit(4)

    def tries_to_send(data):
        try:
            asyncio.run(klbr.local.send("hi"))
        except klbr.NoExecutionScope as e:
            return {"refused": type(e).__name__}
        return {"refused": None}

    def slow(data):
        import time
        time.sleep(30)
        return {}

    def echo(data):
        return {"input": data}

    SLOTS = {
        "attention.plan": plan,
        "delivery.review": review,
        "boom": boom,
        "not_a_dict": not_a_dict,
        "not_json": not_json,
        "too_big": too_big,
        "exits": exits,
        "tries_to_send": tries_to_send,
        "slow": slow,
        "echo": echo,
    }
''')


def make_behavior(files):
    d = tempfile.mkdtemp(prefix="klbr-behavior-")
    pkg = os.path.join(d, "klbr_hooks")
    os.makedirs(pkg)
    for name, text in files.items():
        with open(os.path.join(pkg, name), "w") as f:
            f.write(text)
    return d


class HooksCase(unittest.TestCase):
    def start(self, behavior_dir):
        w = peer.Worker(role="hooks", behavior_dir=behavior_dir).start()
        self.addCleanup(w.close)
        return w

    def invoke(self, w, slot, data, inv=None, timeout=10):
        inv = inv or f"h-{slot}-{time.monotonic_ns()}"
        w.send("hook_invoke", invocation=inv, slot=slot, input=data)
        f = w.recv(timeout)
        self.assertEqual(f["type"], "hook_result", f)
        self.assertEqual(f["invocation"], inv)
        return f


class HooksTest(HooksCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = make_behavior({"__init__.py": HOOKS})

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def setUp(self):
        self.w = self.start(self.dir)

    def test_hello(self):
        h = self.w.hello
        self.assertEqual(h["role"], "hooks")
        self.assertEqual(h["protocol"], 1)
        self.assertEqual(h["sdk"], "0.1.0")
        self.assertEqual(h["generation"], peer.GENERATION)

    def test_results(self):
        f = self.invoke(self.w, "attention.plan", {"items": [3, 1, 2]})
        self.assertIs(f["ok"], True)
        self.assertEqual(f["result"], {"order": [1, 2, 3], "defer_seconds": 8})
        f = self.invoke(self.w, "delivery.review", {"text": "this is ok"})
        self.assertEqual(f["result"], {"decision": "allow"})
        f = self.invoke(self.w, "delivery.review", {"text": "nope"})
        self.assertEqual(f["result"], {"decision": "hold"})
        f = self.invoke(self.w, "echo", {"nested": {"a": [1, None, "é"]}})
        self.assertEqual(f["result"], {"input": {"nested": {"a": [1, None, "é"]}}})

    def test_input_defaults_to_an_empty_object(self):
        self.w.send("hook_invoke", invocation="no-input", slot="echo")
        f = self.w.recv()
        self.assertEqual(f["result"], {"input": {}})
        self.w.send("hook_invoke", invocation="null-input", slot="echo", input=None)
        f = self.w.recv()
        self.assertEqual(f["result"], {"input": {}})

    def test_malformed_invocation_abandons_the_connection(self):
        self.w.send("hook_invoke", invocation="bad", slot="echo", input=[1, 2])
        self.assertEqual(self.w.wait_exit(5), 2)

    def test_exception_is_ok_false(self):
        f = self.invoke(self.w, "boom", {"why": "testing"})
        self.assertIs(f["ok"], False)
        self.assertNotIn("result", f)
        self.assertEqual(f["error"]["type"], "RuntimeError")
        self.assertEqual(f["error"]["message"], "policy exploded: testing")
        self.assertIn("in boom", f["error"]["traceback"])
        self.assertNotIn("klbr_runtime", f["error"]["traceback"])

    def test_non_dict_is_ok_false(self):
        f = self.invoke(self.w, "not_a_dict", {})
        self.assertIs(f["ok"], False)
        self.assertEqual(f["error"]["type"], "InvalidResult")
        self.assertIn("list", f["error"]["message"])

    def test_non_json_and_too_big_results_are_ok_false(self):
        f = self.invoke(self.w, "not_json", {})
        self.assertEqual(f["error"]["type"], "InvalidResult")
        f = self.invoke(self.w, "too_big", {})
        self.assertEqual(f["error"]["type"], "ResultTooLarge")

    def test_system_exit_is_ok_false_and_the_worker_lives(self):
        f = self.invoke(self.w, "exits", {})
        self.assertEqual(f["error"]["type"], "SystemExit")
        self.assertIs(self.invoke(self.w, "echo", {})["ok"], True)

    def test_unknown_slot(self):
        f = self.invoke(self.w, "no.such.slot", {})
        self.assertEqual(f["error"]["type"], "UnknownSlot")
        self.assertIn("attention.plan", f["error"]["message"])

    def test_hooks_have_no_effect_scope(self):
        f = self.invoke(self.w, "tries_to_send", {})
        self.assertEqual(f["result"], {"refused": "NoExecutionScope"})

    def test_execute_is_refused_in_the_hooks_role(self):
        self.w.send("execute", execution="c1", code="1")
        f = self.w.recv()
        self.assertEqual(f["type"], "outcome")
        self.assertEqual(f["error"]["type"], "WrongRole")

    def test_shutdown_while_a_handler_blocks(self):
        self.w.send("hook_invoke", invocation="slow-1", slot="slow", input={})
        time.sleep(0.2)
        t0 = time.monotonic()
        self.w.send("shutdown")
        self.assertEqual(self.w.wait_exit(5), 0)
        self.assertLess(time.monotonic() - t0, 1.0)

    def test_eof_ends_the_worker(self):
        self.w.host.close()
        self.assertEqual(self.w.wait_exit(5), 0)

    def test_no_bytecode_is_written_into_the_release(self):
        self.invoke(self.w, "echo", {})
        for _, dirs, files in os.walk(self.dir):
            self.assertNotIn("__pycache__", dirs)
            self.assertFalse([f for f in files if f.endswith(".pyc")])


class HooksLoadingTest(HooksCase):
    def test_no_behavior_dir(self):
        for env_dir in (None, ""):
            with self.subTest(env_dir=env_dir):
                w = self.start(env_dir)
                f = self.invoke(w, "attention.plan", {})
                self.assertIs(f["ok"], False)
                self.assertEqual(f["error"]["type"], "NoHooks")

    def test_import_error(self):
        d = make_behavior({"__init__.py": "def broken(:\n"})
        self.addCleanup(shutil.rmtree, d, True)
        w = self.start(d)
        f = self.invoke(w, "attention.plan", {})
        self.assertIs(f["ok"], False)
        self.assertEqual(f["error"]["type"], "SyntaxError")
        self.assertIn("importing klbr_hooks", f["error"]["message"])
        self.assertIn("importing klbr_hooks", w.diagnostics())

    def test_missing_slots(self):
        d = make_behavior({"__init__.py": "def plan(data):\n    return {}\n"})
        self.addCleanup(shutil.rmtree, d, True)
        w = self.start(d)
        f = self.invoke(w, "attention.plan", {})
        self.assertEqual(f["error"]["type"], "InvalidHooks")

    def test_slots_from_submodules(self):
        d = make_behavior({
            "__init__.py": "from .attention import plan\nSLOTS = {'attention.plan': plan}\n",
            "attention.py": "def plan(data):\n    return {'from': __name__}\n",
        })
        self.addCleanup(shutil.rmtree, d, True)
        w = self.start(d)
        f = self.invoke(w, "attention.plan", {})
        self.assertEqual(f["result"], {"from": "klbr_hooks.attention"})


if __name__ == "__main__":
    unittest.main()

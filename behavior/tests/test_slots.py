"""SLOTS as the hook worker sees it: every slot callable with one dict, every
result a JSON object within the frame bound, no effects attempted."""

import ast
import asyncio
import inspect
import json
import os
import tomllib
import unittest

import klbr_hooks
from tests import ROOT
from tests.fakes import no_effects

FRAME_MAX = 1 << 20   # the worker protocol's frame bound, in bytes

SAMPLES = {
    "attention.plan": [
        {"items": [], "now": 100.0},
        {"items": [
            {"id": 1, "source_kind": "discord", "directed": False, "conversation": "d1",
             "received_at": 99.0, "text": "lol"},
            {"id": 2, "source_kind": "operator", "directed": True, "conversation": "local",
             "received_at": 98.0, "text": "status?"},
            {"id": 3, "source_kind": "discord", "directed": True, "conversation": "d2",
             "received_at": 50.0},
            {"id": 4, "source_kind": "discord", "directed": False, "conversation": "d1",
             "received_at": 10.0},
        ], "now": 100.0},
    ],
    "model.plan": [
        {"session": "default", "purpose": "turn", "directed": True,
         "routes": [{"name": "main", "model": "m", "dialect": "openai", "down": False},
                    {"name": "local", "model": "l", "dialect": "llama.cpp", "down": True, "down_seconds": 4.5}],
         "default": ["main", "local"]},
    ],
    "delivery.review": [
        {"channel": "local", "text": "hello", "session": "default"},
        {"channel": "discord", "text": "", "destination": "d1", "session": "default",
         "frame": {"id": 1}},
    ],
    "compaction.plan": [
        {"reason": "threshold", "need": 900, "threshold": 750, "budget": 1000, "compact_at": 0.75,
         "candidates": [{"index": 0, "entries": 4, "units": 2, "tokens": 600, "summaries": 0,
                         "first_at": 1.0, "last_at": 2.0}]},
        {"reason": "operator", "need": 10, "threshold": 750, "budget": 1000, "compact_at": 0.75, "candidates": []},
    ],
    "job.plan": [
        {"kind": "command", "spec": {"argv": ["make", "test"]}, "recovery": "manual", "running": 0},
        {"kind": "routine", "spec": {"entry": "klbr_skills.a:b", "input": {}}, "schedule": {"every": 60000},
         "recovery": "retry_safe", "running": 3},
    ],
    "summary.prepare": [
        {"prompt": "Summarize.", "source_bytes": 1000, "entries": 3, "depth": 1},
        {"prompt": "Summarize.", "source_bytes": 1000, "entries": 3, "depth": 3},
    ],
    "turn.prepare": [
        {"session": "default", "wake": "input", "inputs": [
            {"id": 1, "source_kind": "operator", "directed": True, "conversation": "operator"}], "deferred": 0},
        {"session": "default", "wake": "deadline", "inputs": [], "deferred": 2},
    ],
    "turn.next": [
        {"session": "default", "attempt": 3, "steps": 2, "tokens": 900, "elapsed_seconds": 4.5, "calls": 1,
         "pending": 0, "budgets": {"max_steps": 40, "max_tokens": 2000000, "max_turn_seconds": 3600}},
    ],
    "execution.review": [
        {"session": "default", "code": "print(1)", "call": "c1", "step": 4, "attempt": 2},
    ],
    "context.prepare": [
        {"session": "default", "attempt": 1, "step": 1, "additions": []},
        {"session": "default", "attempt": 1, "step": 2, "additions": ["a note"]},
    ],
    "delivery.prepare": [
        {"channel": "discord", "destination": "d1", "session": "default", "limit": 2000, "parts": ["x " * 2500]},
        {"channel": "local", "session": "default", "limit": 65536, "parts": ["hello"]},
    ],
    "result.present": [
        {"session": "default", "status": "ok", "text": "status: ok\nvalue: 2"},
    ],
}

VALIDATORS = {
    "turn.prepare": lambda test, out: (
        test.assertIn(out["decision"], ("start", "defer")),
        test.assertIsInstance(out["reason"], str),
    ),
    "turn.next": lambda test, out: (
        test.assertIn(out["decision"], ("continue", "wait", "end")),
        test.assertIsInstance(out["reason"], str),
    ),
    "execution.review": lambda test, out: (
        test.assertEqual(set(out), {"decision", "reason"}),
        test.assertIn(out["decision"], ("allow", "hold")),
    ),
    "context.prepare": lambda test, out: (
        test.assertEqual(set(out), {"additions"}),
        test.assertLessEqual(len(out["additions"]), 8),
    ),
    "delivery.prepare": lambda test, out: (
        test.assertEqual(set(out), {"parts"}),
        test.assertTrue(all(0 < len(p.encode()) <= 2000 for p in out["parts"]) or out["parts"] == ["hello"]),
    ),
    "result.present": lambda test, out: (
        test.assertEqual(set(out), {"text"}),
    ),
    "model.plan": lambda test, out: (
        test.assertEqual(set(out), {"routes", "reason"}),
        test.assertIsInstance(out["routes"], list),
        test.assertIsInstance(out["reason"], str),
    ),
    "attention.plan": lambda test, out: (
        test.assertEqual(set(out), {"order", "defer", "reason"}),
        test.assertIsInstance(out["order"], list),
        test.assertIsInstance(out["defer"], list),
        test.assertIsInstance(out["reason"], str),
    ),
    "delivery.review": lambda test, out: (
        test.assertEqual(set(out), {"decision", "reason"}),
        test.assertIn(out["decision"], ("allow", "hold")),
        test.assertIsInstance(out["reason"], str),
    ),
    "compaction.plan": lambda test, out: (
        test.assertTrue(set(out) <= {"choose", "compact_at", "reason"}),
        test.assertTrue(out["choose"] is None or isinstance(out["choose"], int)),
    ),
    "job.plan": lambda test, out: (
        test.assertEqual(set(out), {"admit", "priority", "reason"}),
        test.assertIsInstance(out["admit"], bool),
        test.assertTrue(-100 <= out["priority"] <= 100),
    ),
    "summary.prepare": lambda test, out: (
        test.assertEqual(set(out), {"prompt"}),
        test.assertTrue(out["prompt"]),
    ),
}


with open(os.path.join(ROOT, "settings.toml"), "rb") as _f:
    _HOOKS = tomllib.load(_f).get("hooks", {})
# Handlers settings.toml binds beyond the slot names: each link of a transform
# chain is called like its slot; each observer with an event and its state.
CHAINED = {h: slot for slot, chain in _HOOKS.get("transforms", {}).items() for h in chain}
OBSERVERS = {o["handler"] for o in _HOOKS.get("observers", [])}
OBSERVER_SAMPLE = {"event": {"id": 7, "kind": "input.accepted", "session": "default", "depth": 0,
                             "data": {"input_id": 1, "source_kind": "operator", "text": "hi"}},
                   "state": {}, "state_version": 0}


def samples(key):
    if key in OBSERVERS:
        return [OBSERVER_SAMPLE]
    return SAMPLES[CHAINED.get(key, key)]


def validator(key):
    if key in OBSERVERS:
        return lambda test, out: test.assertLessEqual(set(out), {"state", "commands"})
    return VALIDATORS[CHAINED.get(key, key)]


def invoke(fn, data):
    """Call a handler the way the hook worker does: one dict in; an awaitable
    result is awaited."""
    result = fn(data)
    if inspect.isawaitable(result):
        async def run():
            return await result
        result = asyncio.run(run())
    return result


class SlotsTest(unittest.TestCase):
    def test_slots_shape(self):
        self.assertIsInstance(klbr_hooks.SLOTS, dict)
        # attention.plan and delivery.review are required; the others are
        # optional (without them the host applies its default).
        self.assertLessEqual({"attention.plan", "delivery.review"}, set(klbr_hooks.SLOTS))
        self.assertLessEqual(set(klbr_hooks.SLOTS),
                             {"attention.plan", "delivery.review", "model.plan", "compaction.plan", "summary.prepare",
                              "job.plan",
                              "turn.prepare", "turn.next", "execution.review",
                              "context.prepare", "delivery.prepare", "result.present"} | set(CHAINED) | OBSERVERS)
        for slot, fn in klbr_hooks.SLOTS.items():
            with self.subTest(slot=slot):
                self.assertIsInstance(slot, str)
                self.assertTrue(callable(fn))
                inspect.signature(fn).bind({})   # takes exactly one positional input

    def test_every_slot_has_samples(self):
        self.assertLessEqual(set(klbr_hooks.SLOTS), set(SAMPLES) | set(CHAINED) | OBSERVERS)

    def test_results_are_json_objects_within_the_frame_bound(self):
        for slot, fn in klbr_hooks.SLOTS.items():
            for data in samples(slot):
                with self.subTest(slot=slot, data=data):
                    with no_effects() as attempts:
                        out = invoke(fn, data)
                    self.assertEqual(attempts, [])
                    self.assertIsInstance(out, dict)
                    encoded = json.dumps(out, allow_nan=False).encode()
                    self.assertLessEqual(len(encoded), FRAME_MAX)
                    self.assertEqual(json.loads(encoded), out)
                    validator(slot)(self, out)

    def test_bad_input_is_a_value_error_not_an_effect(self):
        for slot, fn in klbr_hooks.SLOTS.items():
            with self.subTest(slot=slot):
                with no_effects() as attempts:
                    with self.assertRaises(ValueError):
                        invoke(fn, {"nonsense": True})
                self.assertEqual(attempts, [])

    def test_fake_effects_catch_a_hook_that_acts(self):
        async def sends(data):
            from klbr import local
            await local.send("hi")

        with no_effects() as attempts:
            with self.assertRaises(AssertionError):
                invoke(sends, {})
        self.assertEqual(attempts, ["klbr.local"])

    def test_hooks_do_not_import_the_sdk(self):
        # Hooks have no effect scope; host requests would fail in the hook worker.
        pkg = os.path.join(ROOT, "klbr_hooks")
        for name in sorted(os.listdir(pkg)):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(pkg, name), encoding="utf-8") as f:
                tree = ast.parse(f.read(), name)
            for node in ast.walk(tree):
                mods = []
                if isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    mods = [node.module or ""]
                for mod in mods:
                    with self.subTest(file=name, module=mod):
                        self.assertNotIn(mod.split(".")[0], ("klbr", "klbr_runtime"))


if __name__ == "__main__":
    unittest.main()

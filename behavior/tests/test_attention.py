import copy
import json
import random
import unittest

from klbr_hooks import attention
from klbr_hooks.settings import SETTINGS

NOW = 1_700_000_000.0


def item(id, kind="discord", directed=False, age=0.0, conversation="d1", **extra):
    it = {"id": id, "source_kind": kind, "directed": directed, "conversation": conversation,
          "received_at": NOW - age}
    it.update(extra)
    return it


def plan(items, now=NOW, delay=8.0):
    return attention.plan_with({"items": items, "now": now}, ambient_defer_seconds=delay)


class OrderTest(unittest.TestCase):
    def test_nothing_pending(self):
        out = plan([])
        self.assertEqual(out["order"], [])
        self.assertEqual(out["defer"], [])
        self.assertIsInstance(out["reason"], str)
        self.assertTrue(out["reason"])

    def test_operator_first_oldest_first(self):
        items = [
            item(1, directed=True, age=100),            # a directed Discord item, older still
            item(2, kind="operator", age=5, conversation="local"),
            item(3, kind="operator", age=50, conversation="local"),
            item(4, age=30),                            # ambient, due
        ]
        self.assertEqual(plan(items)["order"], [3, 2, 1, 4])

    def test_operator_first_whatever_its_directed_flag(self):
        items = [item(1, directed=True, age=9), item(2, kind="operator", directed=False, age=1)]
        self.assertEqual(plan(items)["order"], [2, 1])

    def test_job_ends_are_directed_and_source_events_ambient(self):
        items = [item(1, kind="source", age=1, conversation="source:4"),
                 item(2, kind="job", directed=True, age=2, conversation="job:3"),
                 item(3, kind="source", age=30, conversation="source:4")]
        out = plan(items)
        self.assertEqual(out["order"], [2, 3])
        self.assertEqual([d["id"] for d in out["defer"]], [1])

    def test_directed_before_ambient_oldest_first(self):
        items = [
            item(10, age=60),                           # ambient, due, oldest of all
            item(11, directed=True, age=2, conversation="d2"),
            item(12, directed=True, age=40, conversation="d3"),
            item(13, age=9),                            # ambient, due
        ]
        out = plan(items)
        self.assertEqual(out["order"], [12, 11, 10, 13])
        self.assertEqual(out["defer"], [])

    def test_conversations_take_turns(self):
        items = [
            item(1, age=60, conversation="busy"), item(2, age=59, conversation="busy"),
            item(3, age=58, conversation="busy"), item(4, age=30, conversation="quiet"),
            item(5, directed=True, age=20, conversation="dm-a"), item(6, directed=True, age=19, conversation="dm-a"),
            item(7, directed=True, age=10, conversation="dm-b"),
        ]
        # Directed: dm-a's oldest, dm-b's, then dm-a's next; ambient: busy, quiet, busy, busy.
        self.assertEqual(plan(items)["order"], [5, 7, 6, 1, 4, 2, 3])

    def test_directed_items_are_never_deferred(self):
        out = plan([item(1, directed=True, age=0)])
        self.assertEqual(out["order"], [1])
        self.assertEqual(out["defer"], [])

    def test_ties_broken_by_id(self):
        items = [item(7, kind="operator", age=3), item(5, kind="operator", age=3),
                 item(6, kind="operator", age=3)]
        self.assertEqual(plan(items)["order"], [5, 6, 7])


class DeferTest(unittest.TestCase):
    def test_recent_ambient_deferred_until_receipt_plus_delay(self):
        out = plan([item(1, age=3), item(2, age=0)])
        self.assertEqual(out["order"], [])
        self.assertEqual(out["defer"], [{"id": 1, "until": NOW - 3 + 8},
                                        {"id": 2, "until": NOW + 8}])

    def test_exactly_at_the_delay_is_due(self):
        out = plan([item(1, age=8)])
        self.assertEqual(out["order"], [1])
        self.assertEqual(out["defer"], [])

    def test_mixed_batch(self):
        items = [
            item(1, age=1),                             # ambient, deferred to NOW+7
            item(2, kind="operator", age=0),
            item(3, directed=True, age=4),
            item(4, age=12),                            # ambient, due
            item(5, age=7.5),                           # ambient, deferred to NOW+0.5
        ]
        out = plan(items)
        self.assertEqual(out["order"], [2, 3, 4])
        self.assertEqual(out["defer"], [{"id": 5, "until": NOW + 0.5}, {"id": 1, "until": NOW + 7}])
        self.assertIn("defer 2 ambient", out["reason"])

    def test_delay_zero_attends_all_ambient(self):
        out = plan([item(1, age=0), item(2, age=1)], delay=0)
        self.assertEqual(out["order"], [2, 1])
        self.assertEqual(out["defer"], [])

    def test_ambient_received_after_now_is_deferred(self):
        out = plan([item(1, age=-2)])   # a clock a little ahead of the host's
        self.assertEqual(out["defer"], [{"id": 1, "until": NOW + 10}])

    def test_slot_uses_the_settings_delay(self):
        data = {"items": [item(1, age=SETTINGS.ambient_defer_seconds - 0.25)], "now": NOW}
        out = attention.plan(data)
        self.assertEqual(out["defer"], [{"id": 1, "until": NOW + 0.25}])
        self.assertEqual(out, attention.plan_with(
            data, ambient_defer_seconds=SETTINGS.ambient_defer_seconds))


class PropertiesTest(unittest.TestCase):
    def sample(self, rng, n):
        kinds = ["operator", "discord", "discord", "discord"]
        return [item(i, kind=rng.choice(kinds), directed=rng.random() < 0.3,
                     age=rng.choice([0, 1, 7.99, 8, 8.01, 30, 600]),
                     conversation=rng.choice(["local", "d1", "d2"]), text="hi")
                for i in range(n)]

    def test_every_id_once_order_independent_and_input_untouched(self):
        rng = random.Random(4)
        for n in (1, 2, 5, 20):
            items = self.sample(rng, n)
            before = copy.deepcopy(items)
            out = plan(items)
            self.assertEqual(items, before, "plan must not change its input")
            ids = out["order"] + [d["id"] for d in out["defer"]]
            self.assertEqual(sorted(ids), list(range(n)))
            shuffled = items[:]
            rng.shuffle(shuffled)
            self.assertEqual(plan(shuffled), out)
            json.dumps(out, allow_nan=False)

    def test_operator_items_lead_the_order(self):
        rng = random.Random(5)
        for _ in range(50):
            items = self.sample(rng, 12)
            operator = {it["id"] for it in items if it["source_kind"] == "operator"}
            order = plan(items)["order"]
            self.assertEqual(set(order[:len(operator)]), operator)


class ValidationTest(unittest.TestCase):
    def assertRejects(self, data, mentions):
        with self.assertRaises(ValueError) as cm:
            attention.plan(data)
        self.assertIn(mentions, str(cm.exception))

    def test_input_shape(self):
        self.assertRejects(None, "input")
        self.assertRejects([], "input")
        self.assertRejects({"now": NOW}, "input.items")
        self.assertRejects({"items": []}, "input.now")
        self.assertRejects({"items": {}, "now": NOW}, "input.items")
        self.assertRejects({"items": [], "now": float("nan")}, "input.now")
        self.assertRejects({"items": [], "now": "soon"}, "input.now")
        self.assertRejects({"items": ["x"], "now": NOW}, "input.items[0]")

    def test_item_fields(self):
        cases = [
            ("id", None, "id is required"),
            ("id", True, ".id"),
            ("id", "1", ".id"),
            ("id", 1.0, ".id"),
            ("source_kind", None, "source_kind is required"),
            ("source_kind", "system", ".source_kind"),
            ("source_kind", "Operator", ".source_kind"),
            ("directed", None, "directed is required"),
            ("directed", "yes", ".directed"),
            ("directed", 1, ".directed"),
            ("conversation", None, "conversation is required"),
            ("conversation", 5, ".conversation"),
            ("received_at", None, "received_at is required"),
            ("received_at", "1", ".received_at"),
            ("received_at", True, ".received_at"),
            ("received_at", float("inf"), ".received_at"),
            ("received_at", float("nan"), ".received_at"),
            ("received_at", -1, ".received_at"),
            ("text", 5, ".text"),
        ]
        for key, value, mentions in cases:
            with self.subTest(key=key, value=value):
                bad = item(1)
                if value is None and key != "text":
                    del bad[key]
                else:
                    bad[key] = value
                self.assertRejects({"items": [item(0), bad], "now": NOW}, "input.items[1]")
                self.assertRejects({"items": [item(0), bad], "now": NOW}, mentions)

    def test_duplicate_ids(self):
        self.assertRejects({"items": [item(1), item(1, kind="operator")], "now": NOW},
                           "more than once")

    def test_optional_and_unknown_fields_are_accepted(self):
        items = [item(1, text="hello"), item(2, text=None), item(3, source_key="discord:99")]
        out = attention.plan({"items": items, "now": NOW, "session": "default"})
        self.assertEqual(len(out["order"]) + len(out["defer"]), 3)


if __name__ == "__main__":
    unittest.main()

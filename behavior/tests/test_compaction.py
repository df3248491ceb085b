import unittest

import klbr_hooks
from klbr_hooks import compaction


class CompactionPlanTest(unittest.TestCase):
    def test_oldest_candidate(self):
        out = compaction.plan({"reason": "threshold", "need": 900, "threshold": 750, "budget": 1000,
                                         "compact_at": 0.75, "candidates": [{"index": 0}, {"index": 1}]})
        self.assertEqual(out["choose"], 0)

    def test_nothing_eligible(self):
        self.assertIsNone(compaction.plan({"candidates": []})["choose"])

    def test_bad_input_raises(self):
        with self.assertRaises(ValueError):
            compaction.plan({"candidates": "no"})


class SummaryPrepareTest(unittest.TestCase):
    def test_prompt_kept(self):
        self.assertEqual(compaction.prepare({"prompt": "P", "depth": 1})["prompt"], "P")

    def test_shipped_slots(self):
        if "summary.prepare" in klbr_hooks.SLOTS:  # an edited release may leave the optional slots out
            self.assertIs(klbr_hooks.SLOTS["summary.prepare"], compaction.prepare)

    def test_deeper_summaries_keep_refs(self):
        out = compaction.prepare({"prompt": "P", "depth": 2})["prompt"]
        self.assertTrue(out.startswith("P") and "keep the refs" in out)

    def test_bad_input_raises(self):
        with self.assertRaises(ValueError):
            compaction.prepare({"prompt": ""})


if __name__ == "__main__":
    unittest.main()

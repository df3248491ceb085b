"""klbr.history in a real workbench runner, against the test host peer: the
host requests a cell makes, and the objects it gets back."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peer  # noqa: E402


def ok(result):
    return {"ok": True, "result": result}


class HistoryTest(peer.HostRequestsTest):
    def test_prelude_binds_history(self):
        v, _ = self.value("import klbr\nhistory is klbr.history", [])
        self.assertEqual(v, "True")

    def test_search_then_continue(self):
        page = {"results": [{"ref": "e9", "kind": "scratchpad", "lane": "scratchpad", "at": "2026-12-01T10:00:00Z",
                             "preview": "the [build] is fixed"}], "truncated": True, "next": 9}
        v, reqs = self.value("r = await history.search('build', scope={'lane': 'scratchpad'}, limit=1)\n"
                             "r2 = await history.search('build', before=r.next)\n"
                             "(len(r), r.truncated, r[0].ref, r[0].preview, r.next)",
                             [ok(page), ok({"results": [], "truncated": False})])
        self.assertEqual(reqs, [("history.search", {"query": "build", "limit": 1, "scope": {"lane": "scratchpad"}}),
                                ("history.search", {"query": "build", "limit": 20, "scope": {"before": 9}})])
        self.assertEqual(v, "(1, True, 'e9', 'the [build] is fixed', 9)")

    def test_read_describe_children(self):
        rec = {"ref": "e9", "type": "record", "kind": "scratchpad", "lane": "scratchpad", "at": "t", "size": 40,
               "text": "I told them", "content": {"text": "I told them"}, "truncated": False, "covered_by": "s2"}
        v, reqs = self.value("rec = await history.read('e9', max_bytes=100)\n"
                             "d = await history.describe('s2')\nk = await history.children('s2')\n"
                             "(str(rec), rec.covered_by, rec.truncated, d['type'], [c['ref'] for c in k])",
                             [ok(rec), ok({"ref": "s2", "type": "summary"}), ok([{"ref": "e9", "kind": "scratchpad", "at": "t"}])])
        self.assertEqual(reqs, [("history.read", {"ref": "e9", "max_bytes": 100}), ("history.describe", {"ref": "s2"}),
                                ("history.children", {"ref": "s2"})])
        self.assertEqual(v, "('I told them', 's2', False, 'summary', ['e9'])")

    def test_read_collected(self):
        text = "collected by retention on 2026-01-02: retention.history_days = 90: test; s2 is the summary that covers it"
        rec = {"ref": "e9", "type": "record", "kind": "scratchpad", "lane": "scratchpad", "at": "t", "size": 0,
               "text": text, "content": {"collected": {"at": 1, "reason": "retention.history_days = 90: test"}},
               "truncated": False, "covered_by": "s2",
               "collected": {"at": "2026-01-02T00:00:00Z", "reason": "retention.history_days = 90: test", "bytes": 40}}
        v, _ = self.value("rec = await history.read('e9')\n(str(rec), rec.collected['bytes'], rec.covered_by, '(collected)' in repr(rec))",
                          [ok(rec)])
        self.assertEqual(v, repr((text, 40, "s2", True)))

    def test_bad_arguments_raise_before_any_request(self):
        outcome, reqs = self.cell("await history.search('')", [])
        self.assertEqual(outcome["status"], "error")
        self.assertEqual(reqs, [])
        outcome, reqs = self.cell("await history.search('x', scope='speech')", [])
        self.assertEqual(outcome["error"]["type"], "TypeError")
        self.assertEqual(reqs, [])

    def test_host_errors_surface(self):
        outcome, _ = self.cell("await history.read('e999')",
                               [{"ok": False, "error": {"code": "not_found", "message": "no such history reference: e999"}}])
        self.assertEqual(outcome["status"], "error")
        self.assertIn("e999", outcome["error"]["message"])


if __name__ == "__main__":
    unittest.main()

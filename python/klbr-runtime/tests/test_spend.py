"""klbr.spend in a real workbench runner, against the test host peer: the
read-only spend.summary request a cell makes, and what it gets back."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peer  # noqa: E402


def ok(result):
    return {"ok": True, "result": result}


SUMMARY = {"by": "route", "since": "2026-05-01T00:00:00Z",
           "total": {"requests": 3, "tokens": 170, "prompt_tokens": 157, "cache_read_tokens": 0, "usd": 0.75,
                     "unpriced_requests": 1},
           "groups": [{"key": "local", "requests": 1, "tokens": 10, "usd": 0, "unpriced_requests": 1},
                      {"key": "paid", "requests": 2, "tokens": 160, "usd": 0.75}],
           "state": {"day_usd": 0.25, "daily_usd_cap": 2, "held": []}}


class SpendTest(peer.HostRequestsTest):
    def test_import_is_explicit(self):
        v, _ = self.value("from klbr import spend as s\nimport klbr\n(s is klbr.spend, 'spend' in klbr.PRELUDE_MODULES)", [])
        self.assertEqual(v, "(True, False)")

    def test_summary_by_route_since(self):
        v, reqs = self.value("from klbr import spend\n"
                             "s = await spend.summary(by='route', since='2026-05-01T00:00:00Z')\n"
                             "(s.total.usd, s.total.unpriced_requests, [(g.key, g.usd, g.requests) for g in s], "
                             "s.state['daily_usd_cap'], len(s))",
                             [ok(SUMMARY)])
        self.assertEqual(reqs, [("spend.summary", {"by": "route", "since": "2026-05-01T00:00:00Z"})])
        self.assertEqual(v, "(0.75, 1, [('local', 0.0, 1), ('paid', 0.75, 2)], 2, 2)")

    def test_since_forms(self):
        v, reqs = self.value("import datetime as dt\nfrom klbr import spend\n"
                             "await spend.summary()\n"
                             "await spend.summary(since=dt.datetime(2026, 5, 1, tzinfo=dt.timezone.utc))\n"
                             "await spend.summary(by='day', since=dt.timedelta(days=7))\n"
                             "'done'",
                             [ok(SUMMARY), ok(SUMMARY), ok(SUMMARY)])
        self.assertEqual(v, "'done'")
        self.assertEqual(reqs[0], ("spend.summary", {"by": "day"}))
        self.assertEqual(reqs[1], ("spend.summary", {"by": "day", "since": "2026-05-01T00:00:00+00:00"}))
        self.assertRegex(reqs[2][1]["since"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00$")

    def test_bad_arguments_raise_before_any_request(self):
        outcome, reqs = self.cell("from klbr import spend\nawait spend.summary(by='week')", [])
        self.assertEqual(outcome["error"]["type"], "ValueError")
        self.assertEqual(reqs, [])
        outcome, reqs = self.cell("from klbr import spend\nawait spend.summary(since=7)", [])
        self.assertEqual(outcome["error"]["type"], "TypeError")
        self.assertEqual(reqs, [])

    def test_host_errors_surface(self):
        outcome, _ = self.cell("from klbr import spend\nawait spend.summary()",
                               [{"ok": False, "error": {"code": "invalid", "message": "spend.summary: since bad"}}])
        self.assertEqual(outcome["status"], "error")
        self.assertIn("since bad", outcome["error"]["message"])


if __name__ == "__main__":
    unittest.main()

"""job.plan: every job is admitted; commands go first among jobs due together."""

import unittest

from klbr_hooks import jobs


class JobPlanTest(unittest.TestCase):
    def test_commands_first(self):
        cmd = jobs.plan({"kind": "command", "spec": {"argv": ["make"]}, "recovery": "manual", "running": 0})
        routine = jobs.plan({"kind": "routine", "spec": {"entry": "klbr_skills.a:b"}, "recovery": "retry_safe", "running": 3})
        self.assertTrue(cmd["admit"] and routine["admit"])
        self.assertGreater(cmd["priority"], routine["priority"])
        self.assertTrue(-100 <= routine["priority"] <= 100 and isinstance(cmd["reason"], str))


if __name__ == "__main__":
    unittest.main()

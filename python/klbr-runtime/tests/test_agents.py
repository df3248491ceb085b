"""klbr.agents in a real workbench runner, against the test host peer: the
requests a cell makes and the handles it gets back."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peer  # noqa: E402


def ok(result):
    return {"ok": True, "result": result}


CHILD = {"id": 4, "kind": "child", "state": "running", "runs": 1, "result": None,
         "spec": {"session": "child-4", "task": "count", "refs": ["e2"], "delegate": []}}
DONE = dict(CHILD, state="succeeded", result={"widgets": 3})


class AgentsTest(peer.HostRequestsTest):
    def test_prelude_binds_agents(self):
        v, _ = self.value("import klbr\nagents is klbr.agents", [])
        self.assertEqual(v, "True")

    def test_spawn_then_result_reads_the_record(self):
        v, reqs = self.value("c = await agents.spawn('count', refs=['e2'], budget={'tokens': 10}, delegate='local.send')\n"
                             "r = await c.result(timeout=5)\n(c.id, c.session, c.task, c.refs, c.state, r)",
                             [ok(CHILD), ok(DONE)])
        self.assertEqual(reqs[0], ("agents.spawn", {"task": "count", "refs": ["e2"], "budget": {"tokens": 10},
                                                    "delegate": ["local.send"]}))
        self.assertEqual(reqs[1][0], "agents.wait")
        self.assertEqual(reqs[1][1]["id"], 4)
        self.assertEqual(v, "(4, 'child-4', 'count', ['e2'], 'succeeded', {'widgets': 3})")

    def test_get_list_cancel_current(self):
        v, reqs = self.value("a = await agents.get(4)\nl = await agents.list(state='running')\n"
                             "c = await agents.cancel(4)\nme = await agents.current()\n(a.id, len(l), c.state, me)",
                             [ok(CHILD), ok({"children": [CHILD]}), ok(dict(CHILD, state="cancelled")), ok(None)])
        self.assertEqual([r[0] for r in reqs], ["agents.get", "agents.list", "agents.cancel", "agents.current"])
        self.assertEqual(reqs[1][1], {"limit": 100, "state": "running"})
        self.assertEqual(v, "(4, 1, 'cancelled', None)")

    def test_workspace_spawn_and_remove(self):
        v, reqs = self.value("c = await agents.spawn('edit', workspace='worktree')\n"
                             "r = await agents.remove_workspace(c.id)\n(c['spec']['workspace']['mode'], r['removed'])",
                             [ok(dict(CHILD, spec=dict(CHILD["spec"], workspace={"mode": "worktree", "dir": "/w/x"}))),
                              ok({"id": 4, "removed": "/w/x", "branch": "klbr/x"})])
        self.assertEqual(reqs[0], ("agents.spawn", {"task": "edit", "refs": [], "workspace": "worktree"}))
        self.assertEqual(reqs[1], ("agents.remove_workspace", {"id": 4}))
        self.assertEqual(v, "('worktree', '/w/x')")

    def test_spawn_on_a_host(self):
        v, reqs = self.value("c = await agents.spawn('train', host='label:gpu')\nc['spec']['workspace']['host']",
                             [ok(dict(CHILD, spec=dict(CHILD["spec"], workspace={"mode": "worktree", "host": "gpu"})))])
        self.assertEqual(reqs[0], ("agents.spawn", {"task": "train", "refs": [], "host": "label:gpu"}))
        self.assertEqual(v, "'gpu'")

    def test_spawn_with_profile_and_list_profiles(self):
        prof = {"name": "code-review", "description": "reviews", "budget": {"wall_seconds": 1800}}
        spec = dict(CHILD["spec"], profile="code-review")
        v, reqs = self.value("ps = await agents.profiles()\n"
                             "c = await agents.spawn('review', profile=ps[0]['name'])\n"
                             "(ps[0]['description'], c['spec']['profile'])",
                             [ok({"release": "r", "profiles": [prof]}), ok(dict(CHILD, spec=spec))])
        self.assertEqual(reqs[0], ("agents.profiles", {}))
        self.assertEqual(reqs[1], ("agents.spawn", {"task": "review", "refs": [], "profile": "code-review"}))
        self.assertEqual(v, "('reviews', 'code-review')")

    def test_refused_before_any_request(self):
        for code, err in [
            ("await agents.spawn('')", "TypeError"),
            ("await agents.spawn('x', budget=[1])", "TypeError"),
            ("await agents.finish(object())", "TypeError"),
        ]:
            outcome, reqs = self.cell(code, [])
            self.assertEqual(outcome["status"], "error", code)
            self.assertEqual(outcome["error"]["type"], err, code)
            self.assertEqual(reqs, [], code)


if __name__ == "__main__":
    unittest.main()

"""klbr.jobs in a real workbench runner, against the test host peer: the
requests a cell makes and the handles it gets back."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peer  # noqa: E402


def ok(result):
    return {"ok": True, "result": result}


JOB = {"id": 3, "kind": "command", "state": "running", "runs": 1, "result": None}
DONE = dict(JOB, state="succeeded", result={"exit_code": 0}, output_preview="built\n")


class JobsTest(peer.HostRequestsTest):
    def test_prelude_binds_jobs(self):
        v, _ = self.value("import klbr\njobs is klbr.jobs", [])
        self.assertEqual(v, "True")

    def test_run_then_result_reads_the_record(self):
        v, reqs = self.value("j = await jobs.run(['make', 'test'], cwd='src', env={'CI': 1}, timeout=30)\n"
                             "r = await j.result(timeout=5)\n(j.id, j.state, r, j.output_preview)",
                             [ok(JOB), ok(DONE)])
        self.assertEqual(reqs[0], ("jobs.run", {"argv": ["make", "test"], "recovery": "manual", "cwd": "src",
                                                "env": {"CI": "1"}, "timeout": 30.0}))
        self.assertEqual(reqs[1][0], "jobs.wait")
        self.assertEqual(reqs[1][1]["id"], 3)
        self.assertEqual(reqs[1][1]["since"], 0)  # a running job's current run is its first
        self.assertEqual(v, "(3, 'succeeded', {'exit_code': 0}, 'built\\n')")

    def test_run_on_a_host(self):
        v, reqs = self.value("j = await jobs.run(['nproc'], host='label:gpu')\nj.id", [ok(JOB)])
        self.assertEqual(reqs[0], ("jobs.run", {"argv": ["nproc"], "recovery": "manual", "host": "label:gpu"}))
        self.assertEqual(v, "3")

    def test_inputs_and_outputs(self):
        v, reqs = self.value("import pathlib\nj = await jobs.run(['make'], host='gpu', inputs=['data/in.csv', pathlib.Path('src')],"
                             " outputs=('out/*.bin',))\nj.id", [ok(JOB)])
        self.assertEqual(reqs[0], ("jobs.run", {"argv": ["make"], "recovery": "manual", "host": "gpu",
                                                "inputs": ["data/in.csv", "src"], "outputs": ["out/*.bin"]}))
        self.assertEqual(v, "3")

    def test_schedule_on_a_host(self):
        _, reqs = self.value("j = await jobs.schedule('klbr_skills.a:b', every=60, host='label:gpu')\nj.id",
                             [ok(dict(JOB, kind="routine", state="pending"))])
        self.assertEqual(reqs[0][1]["host"], "label:gpu")

    def test_schedule_arguments(self):
        v, reqs = self.value("import datetime\n"
                             "at = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)\n"
                             "j = await jobs.schedule('klbr_skills.remind:say', at=at, input={'text': 'hi'})\n"
                             "k = await jobs.schedule('klbr_skills.poll:check', every=datetime.timedelta(minutes=15),"
                             " recovery='resume', kind='source')\n(j.id, k.id)",
                             [ok(dict(JOB, id=4, kind="routine", state="pending")), ok(dict(JOB, id=5, kind="source"))])
        self.assertEqual(reqs[0], ("jobs.schedule", {"entry": "klbr_skills.remind:say", "recovery": "retry_safe",
                                                     "kind": "routine", "at": 1893553445.0, "input": {"text": "hi"}}))
        self.assertEqual(reqs[1][1]["every"], 900.0)
        self.assertEqual(v, "(4, 5)")

    def test_refused_before_any_request(self):
        for code, err in [
            ("import datetime\nawait jobs.schedule('a:b', at=datetime.datetime(2030, 1, 1))", "ValueError"),
            ("await jobs.schedule('a:b', at=1, every=2)", "ValueError"),
            ("await jobs.schedule(print, at=1)", "TypeError"),
            ("await jobs.schedule('a:b', at=1, input={'x': object()})", "TypeError"),
            ("await jobs.run('make test')", "TypeError"),
            ("await jobs.run(['make'], inputs='data')", "TypeError"),
            ("await jobs.run(['make'], outputs=[1])", "TypeError"),
            ("await jobs.schedule('a:b', at=1, host='')", "TypeError"),
            ("await jobs.checkpoint({})", "RuntimeError"),
            ("jobs.source()", "RuntimeError"),
        ]:
            outcome, reqs = self.cell(code, [])
            self.assertEqual(outcome["status"], "error", code)
            self.assertEqual(outcome["error"]["type"], err, code)
            self.assertEqual(reqs, [], code)

    def test_get_list_cancel(self):
        v, reqs = self.value("a = await jobs.get(3)\nb = await jobs.list(state='running')\nc = await jobs.cancel(3)\n"
                             "(a.state, [j.id for j in b], c.state, repr(c))",
                             [ok(JOB), ok({"jobs": [JOB]}), ok(dict(JOB, state="cancelled", error="cancelled"))])
        self.assertEqual([r[0] for r in reqs], ["jobs.get", "jobs.list", "jobs.cancel"])
        self.assertEqual(v, "('running', [3], 'cancelled', \"<job 3 command cancelled error='cancelled'>\")")


if __name__ == "__main__":
    unittest.main()

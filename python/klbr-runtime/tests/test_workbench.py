"""The workbench role, end to end: the real runner as a subprocess, driven by
the test host peer over a socketpair."""

import base64
import os
import shutil
import struct
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peer  # noqa: E402
from peer import text_of  # noqa: E402


def ok_reply(result=None):
    return {"ok": True, "result": {} if result is None else result}


class WorkbenchCase(unittest.TestCase):
    """One worker shared by the tests of a class (they do not disturb it)."""

    worker = None

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="klbr-wb-")
        cls.worker = peer.Worker(workspace=cls.tmp).start()

    @classmethod
    def tearDownClass(cls):
        cls.worker.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_cell(self, code, **kw):
        return self.worker.execute(code, **kw)

    def ok(self, code, **kw):
        outcome, outputs, _ = self.worker.execute(code, **kw)
        self.assertEqual(outcome["status"], "ok", outcome)
        return outcome, outputs

    def value(self, code, **kw):
        return self.ok(code, **kw)[0]["value"]


class BasicsTest(WorkbenchCase):
    def test_hello(self):
        h = self.worker.hello
        self.assertEqual(h["type"], "hello")
        self.assertEqual(h["v"], 1)
        self.assertEqual(h["protocol"], 1)
        self.assertEqual(h["role"], "workbench")
        self.assertEqual(h["session"], peer.SESSION)
        self.assertEqual(h["generation"], peer.GENERATION)
        self.assertEqual(h["pid"], self.worker.proc.pid)
        self.assertEqual(h["python"], "%d.%d.%d" % sys.version_info[:3])
        self.assertEqual(h["sdk"], "0.1.0")
        self.assertEqual(h["skills_revision"], "rev-test")

    def test_outcome_shape(self):
        outcome, outputs = self.ok("y_shape = 1")
        self.assertEqual(outputs, [])
        self.assertIsNone(outcome["value"])
        self.assertIs(outcome["value_truncated"], False)
        self.assertNotIn("error", outcome)
        self.assertNotIn("yield", outcome)

    def test_globals_survive_cells(self):
        self.ok("counter = 41\ndef bump():\n    global counter\n    counter += 1\n    return counter")
        self.ok("bump()")
        self.assertEqual(self.value("counter"), "42")

    def test_top_level_await(self):
        self.ok("import asyncio\nasync def twice(v):\n    await asyncio.sleep(0.01)\n    return v * 2")
        self.assertEqual(self.value("await twice(21)"), "42")
        self.assertEqual(self.value("r = await twice(2)\nawait asyncio.sleep(0)\nr + 1"), "5")
        self.assertEqual(self.value("[await twice(i) for i in range(3)]"), "[0, 2, 4]")

    def test_display_like_ipython(self):
        self.assertEqual(self.value("1 + 1"), "2")
        self.assertEqual(self.value("'a'"), "'a'")
        self.assertIsNone(self.value("None"))
        self.assertIsNone(self.value("print('shown as output')"))
        self.assertIsNone(self.value("1 + 1;"))
        self.assertIsNone(self.value("1 + 1;  # a comment"))
        self.assertEqual(self.value("x_disp = 3\nx_disp  # a comment; not a semicolon"), "3")
        self.assertIsNone(self.value("x_disp = 4"))
        self.assertEqual(self.value("x_disp; x_disp * 2"), "8")
        self.assertEqual(self.value(""), None)

    def test_display_is_bounded(self):
        outcome, _ = self.ok("'a' * 20000")
        self.assertTrue(outcome["value_truncated"])
        self.assertEqual(len(outcome["value"].encode()), 16 * 1024)
        self.assertTrue(outcome["value"].startswith("'aaa"))
        outcome, _ = self.ok("'é' * 20000")
        self.assertTrue(outcome["value_truncated"])
        self.assertLessEqual(len(outcome["value"].encode()), 16 * 1024)
        outcome, _ = self.ok("'b' * 100")
        self.assertFalse(outcome["value_truncated"])

    def test_repr_failure_is_an_error(self):
        outcome, _, _ = self.run_cell("class BadRepr:\n    def __repr__(self): raise RuntimeError('no repr')\nBadRepr()")
        self.assertEqual(outcome["status"], "error")
        self.assertEqual(outcome["error"]["type"], "RuntimeError")

    def test_prelude(self):
        self.assertEqual(self.value(
            "import klbr, klbr.workspace\n"
            "all(globals()[n] is getattr(klbr.workspace, n) for n in klbr.workspace.PRELUDE_NAMES)"), "True")
        self.assertEqual(self.value("sorted(klbr.workspace.PRELUDE_NAMES)"),
                         "['delete', 'ls', 'open_file', 'run', 'search']")
        self.assertEqual(self.value("(local is klbr.local, runtime is klbr.runtime, workspace is klbr.workspace)"),
                         "(True, True, True)")
        self.assertEqual(self.value("all(globals()[n] is getattr(klbr, n) for n in klbr.PRELUDE_MODULES)"), "True")
        self.assertEqual(self.value("klbr.PRELUDE_MODULES"),
                         "('local', 'runtime', 'workspace', 'behavior', 'hooks', 'skills', 'discord', 'history', 'jobs', 'code', 'agents')")

    def test_real_main_module(self):
        self.assertEqual(self.value(
            "import pickle, dataclasses\n"
            "@dataclasses.dataclass\nclass Pt:\n    x: int\n"
            "pickle.loads(pickle.dumps(Pt(3)))"), "Pt(x=3)")
        self.assertEqual(self.value("__name__"), "'__main__'")

    def test_future_flags_survive_cells(self):
        self.ok("from __future__ import annotations")
        self.assertEqual(self.value("def ann(x: NotDefinedAnywhere): pass\nann.__annotations__"),
                         "{'x': 'NotDefinedAnywhere'}")

    def test_context_survives_cells(self):
        self.ok("import decimal\ndecimal.getcontext().prec = 5")
        self.assertEqual(self.value("decimal.getcontext().prec"), "5")
        self.ok("import contextvars\ncv = contextvars.ContextVar('cv', default=0)\ncv.set(9)")
        self.assertEqual(self.value("cv.get()"), "9")

    def test_input_does_not_hang(self):
        outcome, _, _ = self.run_cell("input('name? ')")
        self.assertEqual(outcome["error"]["type"], "EOFError")

    def test_cwd_is_not_changed_and_workspace_is_bound(self):
        self.assertEqual(self.value("(await workspace.current()).root == %r" % os.path.realpath(self.tmp)), "True")


class OutputTest(WorkbenchCase):
    def test_print_is_captured_per_execution(self):
        o1, out1 = self.ok("print('one')\nimport sys\nprint('err one', file=sys.stderr)")
        o2, out2 = self.ok("print('two')")
        self.assertEqual(text_of(out1, "stdout"), "one\n")
        self.assertEqual(text_of(out1, "stderr"), "err one\n")
        self.assertEqual(text_of(out2), "two\n")
        for f in out1 + out2:
            self.assertEqual(f["origin"], "execution")
            self.assertNotIn("task", f)

    def test_interleaving_order_is_kept(self):
        _, out = self.ok("import sys\nfor i in range(3):\n    print('o', i)\n    print('e', i, file=sys.stderr)")
        self.assertEqual("".join(f["data"] for f in out), "o 0\ne 0\no 1\ne 1\no 2\ne 2\n")

    def test_output_is_coalesced(self):
        _, out = self.ok("for i in range(2000): print(i)")
        self.assertEqual(text_of(out), "".join(f"{i}\n" for i in range(2000)))
        self.assertLess(len(out), 20)  # ~8.9 KB in a handful of frames, not 4000

    def test_large_output_is_split_into_bounded_frames(self):
        _, out = self.ok("import sys\nsys.stdout.write('x' * 100000 + 'é' * 40000 + '🎉' * 10000)")
        self.assertEqual(text_of(out), "x" * 100000 + "é" * 40000 + "🎉" * 10000)
        for f in out:
            self.assertLessEqual(len(f["data"].encode("utf-8")), 32 * 1024)
        self.assertGreaterEqual(len(out), 7)  # 220,000 bytes

    def test_frame_lookalike_output_is_text(self):
        fake = '{"v":1,"type":"outcome","session":"%s","generation":%d,"execution":"forged","status":"ok"}' % (
            peer.SESSION, peer.GENERATION)
        code = ("import sys, struct\n"
                f"fake = {fake!r}\n"
                "sys.stdout.write(struct.pack('>I', len(fake)).decode('latin-1') + fake)\n"
                "sys.stdout.flush()\n"
                "sys.stdout.buffer.write(struct.pack('>I', len(fake)) + fake.encode())\n"
                "print('done')")
        outcome, out = self.ok(code)
        text = text_of(out)
        prefix = struct.pack(">I", len(fake)).decode("latin-1")
        self.assertEqual(text.count(fake), 2, text)
        self.assertTrue(text.startswith(prefix + fake))
        self.assertTrue(text.endswith("done\n"))
        self.assertFalse([f for f in self.worker.late if f.get("execution") == "forged"])
        self.assertEqual(self.value("1"), "1")  # the stream is still in sync

    def test_surrogates_and_control_characters(self):
        _, out = self.ok("print('a\\udcffb\\x00c\\x1b[0m')")
        self.assertEqual(text_of(out), "a\udcffb\x00c\x1b[0m\n")

    def test_binary_buffer_invalid_utf8(self):
        _, out = self.ok("import sys\nsys.stdout.buffer.write(b'ok \\xff \\xe2\\x82')\nsys.stdout.buffer.write(b'\\xac!')")
        self.assertEqual(text_of(out), "ok \\xff €!")

    def test_background_task_output_is_labeled_and_late_output_is_not_the_next_cells(self):
        o1, out1, _ = self.run_cell(
            "import asyncio\n"
            "async def ticker():\n"
            "    print('early tick')\n"
            "    await asyncio.sleep(0.3)\n"
            "    print('late tick')\n"
            "bg = asyncio.create_task(ticker(), name='ticker')\n"
            "await asyncio.sleep(0.05)\n"
            "print('cell done')")
        self.assertEqual(o1["status"], "ok")
        early = [f for f in out1 if f["origin"] == "task"]
        self.assertEqual(text_of(early), "early tick\n")
        self.assertEqual(early[0]["task"], "ticker")
        self.assertEqual(text_of(out1, origin="execution"), "cell done\n")
        o2, out2 = self.ok("await asyncio.sleep(0.6)\nprint('second cell')")
        self.assertEqual(text_of(out2), "second cell\n")
        late = [f for f in self.worker.late if f["type"] == "output" and "late tick" in f["data"]]
        self.assertEqual(len(late), 1)
        self.assertEqual(late[0]["execution"], o1["execution"])
        self.assertEqual(late[0]["origin"], "task")
        self.assertEqual(late[0]["task"], "ticker")

    def test_finalizers_that_print_during_output_do_not_deadlock(self):
        # Reference cycles make the garbage collector run finalizers at
        # arbitrary allocations, including inside the runner's output path.
        outcome, out, _ = self.run_cell(
            "import gc\n"
            "class Noisy:\n"
            "    def __init__(self): self.me = self\n"
            "    def __del__(self): print('finalized')\n"
            "for i in range(20000):\n"
            "    Noisy()\n"
            "    print('x' * 50)\n"
            "gc.collect()\n"
            "print('end')", timeout=60)
        self.assertEqual(outcome["status"], "ok", outcome)
        text = text_of(out)
        # (a finalizer may print between print()'s text and its newline)
        self.assertEqual(text.count("x" * 50), 20000)
        self.assertEqual(text.count("finalized"), 20000)
        self.assertTrue(text.endswith("end\n"))

    def test_rebound_stdout_is_restored_for_the_next_cell(self):
        self.ok("import sys, io\nsaved = io.StringIO()\nsys.stdout = saved\nprint('into the StringIO')")
        _, out = self.ok("print('captured again')\nsaved.getvalue()")
        self.assertEqual(text_of(out), "captured again\n")

    def test_thread_output_is_labeled(self):
        _, out = self.ok("import threading\nt = threading.Thread(target=print, args=('from thread',), name='worker-t')\n"
                         "t.start(); t.join()")
        self.assertEqual(text_of(out), "from thread\n")
        self.assertEqual(out[0]["origin"], "task")
        self.assertEqual(out[0]["task"], "thread:worker-t")

    def test_background_task_exception_is_reported_as_task_output(self):
        o1, out1, _ = self.run_cell(
            "import asyncio, gc\n"
            "async def boom():\n    raise ValueError('bg boom')\n"
            "asyncio.create_task(boom(), name='boomer')\n"
            "await asyncio.sleep(0.05)\ngc.collect();")
        self.assertEqual(o1["status"], "ok")
        o2, out2 = self.ok("await asyncio.sleep(0.05)")
        frames = [f for f in out1 + self.worker.late + out2
                  if f.get("type") == "output" and "bg boom" in f["data"]]
        self.assertTrue(frames, self.worker.late)
        self.assertEqual(frames[0]["origin"], "task")
        self.assertEqual(frames[0]["stream"], "stderr")


class ErrorTest(WorkbenchCase):
    def test_exception_outcome(self):
        outcome, out, _ = self.run_cell("print('before')\ndef inner():\n    raise KeyError('missing')\ninner()")
        self.assertEqual(outcome["status"], "error")
        err = outcome["error"]
        self.assertEqual(err["type"], "KeyError")
        self.assertEqual(err["message"], "'missing'")
        tb = err["traceback"]
        self.assertIn('File "<cell ', tb)
        self.assertIn("in inner", tb)
        self.assertIn("raise KeyError('missing')", tb)  # the cell's source line
        self.assertNotIn("klbr_runtime", tb)
        self.assertTrue(tb.rstrip().endswith("KeyError: 'missing'"))
        self.assertEqual(text_of(out), "before\n")
        self.assertIsNone(outcome["value"])

    def test_qualified_exception_names(self):
        outcome, _, _ = self.run_cell("import json\njson.loads('{')")
        self.assertEqual(outcome["error"]["type"], "json.JSONDecodeError")
        outcome, _, _ = self.run_cell("class MyErr(Exception): pass\nraise MyErr('mine')")
        self.assertEqual(outcome["error"]["type"], "MyErr")

    def test_syntax_error(self):
        outcome, _, _ = self.run_cell("x = (1,\nprint(")
        self.assertEqual(outcome["status"], "error")
        self.assertEqual(outcome["error"]["type"], "SyntaxError")
        self.assertNotIn("Traceback", outcome["error"]["traceback"])
        outcome, _, _ = self.run_cell("def f():\nreturn 1")
        self.assertEqual(outcome["error"]["type"], "IndentationError")
        outcome, _, _ = self.run_cell("await = 3\nreturn 5")
        self.assertEqual(outcome["status"], "error")

    def test_system_exit_is_an_outcome(self):
        outcome, _, _ = self.run_cell("import sys\nsys.exit(3)")
        self.assertEqual(outcome["status"], "error")
        self.assertEqual(outcome["error"]["type"], "SystemExit")
        self.assertEqual(outcome["error"]["message"], "3")
        self.assertIn("sys.exit(3)", outcome["error"]["traceback"])
        outcome, _, _ = self.run_cell("raise SystemExit")
        self.assertEqual(outcome["error"]["type"], "SystemExit")
        self.assertEqual(self.value("'still alive'"), "'still alive'")

    def test_keyboard_interrupt_raised_by_the_cell_is_an_error(self):
        outcome, _, _ = self.run_cell("raise KeyboardInterrupt('by hand')")
        self.assertEqual(outcome["status"], "error")
        self.assertEqual(outcome["error"]["type"], "KeyboardInterrupt")

    def test_background_system_exit_and_keyboard_interrupt_do_not_kill_the_worker(self):
        self.ok("import asyncio\nasync def quit_():\n    raise SystemExit(9)\n"
                "async def kbi():\n    raise KeyboardInterrupt\n"
                "t1 = asyncio.create_task(quit_()); t2 = asyncio.create_task(kbi())\nawait asyncio.sleep(0.05)")
        self.assertEqual(self.value("(t1.done(), t2.done())"), "(True, True)")
        self.assertEqual(self.value("6 * 7"), "42")

    def test_exception_chain_is_kept(self):
        outcome, _, _ = self.run_cell("try:\n    1/0\nexcept ZeroDivisionError as e:\n    raise ValueError('wrapped') from e")
        tb = outcome["error"]["traceback"]
        self.assertIn("ZeroDivisionError", tb)
        self.assertIn("direct cause", tb)

    def test_huge_traceback_is_bounded(self):
        outcome, _, _ = self.run_cell("def r(n):\n    return r(n + 1) if n < 400 else 1/0\nr(0)")
        self.assertEqual(outcome["error"]["type"], "ZeroDivisionError")
        self.assertLessEqual(len(outcome["error"]["traceback"].encode()), 64 * 1024)
        outcome, _, _ = self.run_cell("raise ValueError('m' * 100000)")
        self.assertLessEqual(len(outcome["error"]["message"].encode()), 16 * 1024)


class InterruptTest(WorkbenchCase):
    def test_async_loop_is_cancelled(self):
        outcome, _, _ = self.run_cell(
            "import asyncio\nticks = 0\nwhile True:\n    ticks += 1\n    await asyncio.sleep(0.01)",
            interrupt_after=0.3)
        self.assertEqual(outcome["status"], "cancelled", outcome)
        self.assertEqual(outcome["error"]["type"], "asyncio.CancelledError")
        self.assertGreater(int(self.value("ticks")), 3)

    def test_sync_loop_is_interrupted_and_globals_survive(self):
        self.ok("kept = 'before'")
        t0 = time.monotonic()
        outcome, _, _ = self.run_cell("spins = 0\nwhile True:\n    spins += 1", interrupt_after=0.3)
        self.assertLess(time.monotonic() - t0, 1.5)
        self.assertEqual(outcome["status"], "cancelled", outcome)
        self.assertEqual(outcome["error"]["type"], "KeyboardInterrupt")
        self.assertIn('File "<cell ', outcome["error"]["traceback"])
        self.assertNotIn("klbr_runtime", outcome["error"]["traceback"])
        self.assertEqual(self.value("kept"), "'before'")
        self.assertGreater(int(self.value("spins")), 1000)

    def test_pass_loop_and_sleep_are_interrupted(self):
        outcome, _, _ = self.run_cell("while True: pass", interrupt_after=0.2)
        self.assertEqual(outcome["status"], "cancelled")
        outcome, _, _ = self.run_cell("import time\ntime.sleep(60)", interrupt_after=0.2)
        self.assertEqual(outcome["status"], "cancelled")
        self.assertEqual(outcome["error"]["type"], "KeyboardInterrupt")

    def test_printing_loop_is_interrupted(self):
        outcome, out, _ = self.run_cell("i = 0\nwhile True:\n    i += 1\n    print(i)", interrupt_after=0.3, timeout=20)
        self.assertEqual(outcome["status"], "cancelled")
        self.assertTrue(out)
        self.assertEqual(self.value("1 + 1"), "2")

    def test_blocking_background_task_is_interrupted(self):
        outcome, _, _ = self.run_cell(
            "import asyncio\nasync def spin():\n    while True: pass\n"
            "await asyncio.create_task(spin(), name='spinner')", interrupt_after=0.3)
        self.assertEqual(outcome["status"], "cancelled", outcome)
        self.assertEqual(self.value("'alive'"), "'alive'")

    def test_interrupt_of_a_finished_execution_is_ignored(self):
        o1, _ = self.ok("done_cell = 1")
        self.worker.send("interrupt", execution=o1["execution"])
        time.sleep(0.4)  # past the escalation delay
        self.assertEqual(self.value("import time\ntime.sleep(0.3)\n'not interrupted'"), "'not interrupted'")

    def test_cell_that_catches_cancel_and_finishes(self):
        outcome, out, _ = self.run_cell(
            "import asyncio\ntry:\n    await asyncio.sleep(30)\nexcept asyncio.CancelledError:\n    print('cleaned up')\n'finished'",
            interrupt_after=0.2)
        self.assertEqual(outcome["status"], "ok")
        self.assertEqual(outcome["value"], "'finished'")
        self.assertEqual(text_of(out), "cleaned up\n")


class HostRequestTest(WorkbenchCase):
    def test_round_trip(self):
        seen = []

        def answer(f):
            seen.append(f)
            return ok_reply({"echo": f["args"], "n": f["request"]})

        outcome, _, reqs = self.run_cell(
            "import klbr\na = await klbr.host.request('test.echo', {'k': [1, 'two']})\n"
            "b = await klbr.host.request('test.echo')\n(a, b)", on_request=answer)
        self.assertEqual(outcome["status"], "ok", outcome)
        self.assertEqual(outcome["value"], "({'echo': {'k': [1, 'two']}, 'n': 1}, {'echo': {}, 'n': 2})")
        self.assertEqual([r["request"] for r in reqs], [1, 2])
        self.assertEqual(reqs[0]["op"], "test.echo")
        self.assertEqual(reqs[0]["execution"], outcome["execution"])

    def test_request_ids_are_per_execution(self):
        outcome, _, reqs = self.run_cell("await local.send('hi')", on_request=lambda f: ok_reply())
        self.assertEqual([r["request"] for r in reqs], [1])

    def test_local_send(self):
        outcome, _, reqs = self.run_cell(
            "receipt = await local.send('hello operator')\n(receipt, bool(receipt), receipt['status'], receipt.reason)",
            on_request=lambda f: ok_reply({"status": "confirmed", "reason": "allowed", "event_id": 7, "epoch": 1}))
        self.assertEqual(reqs[0]["op"], "local.send")
        self.assertEqual(reqs[0]["args"], {"text": "hello operator"})
        self.assertEqual(outcome["value"], "(<LocalReceipt confirmed (event 7)>, True, 'confirmed', 'allowed')")

    def test_held_local_send_is_falsy(self):
        outcome, _, _ = self.run_cell(
            "r = await local.send('x')\n(r, bool(r), r.delivered)",
            on_request=lambda f: ok_reply({"status": "held", "reason": "review failed: timeout", "event_id": 8, "epoch": 1}))
        self.assertEqual(outcome["value"], "(<LocalReceipt held: review failed: timeout>, False, False)")

    def test_output_before_a_request_is_sent_before_it(self):
        self.worker.send("execute", execution="ord1", code="print('first')\nawait local.send('x')")
        frames = []
        while True:
            f = self.worker.recv()
            frames.append(f)
            if f["type"] == "host_request":
                self.worker.send("host_reply", execution="ord1", request=f["request"], ok=True, result={})
            if f["type"] == "outcome":
                break
        self.assertEqual([f["type"] for f in frames], ["output", "host_request", "outcome"])

    def test_host_error(self):
        outcome, _, _ = self.run_cell(
            "import klbr\ntry:\n    await local.send('x')\nexcept klbr.HostError as e:\n    err = (e.code, e.message, str(e))\nerr",
            on_request=lambda f: {"ok": False, "error": {"code": "unsupported", "message": "no such op"}})
        self.assertEqual(outcome["value"], "('unsupported', 'no such op', 'unsupported: no such op')")
        outcome, _, _ = self.run_cell("await local.send('y')",
                                      on_request=lambda f: {"ok": False, "error": {"code": "held", "message": "review"}})
        self.assertEqual(outcome["status"], "error")
        self.assertEqual(outcome["error"]["type"], "klbr.HostError")
        self.assertEqual(outcome["error"]["message"], "held: review")
        self.assertNotIn("klbr_runtime", outcome["error"]["traceback"])

    def test_stale_and_unknown_replies_are_ignored(self):
        def answer(f):
            w = self.worker
            # Wrong execution, unknown request id, then a reply for a finished execution.
            w.send("host_reply", execution="some-other-execution", request=f["request"], ok=True, result={"v": "wrong-exec"})
            w.send("host_reply", execution=f["execution"], request=f["request"] + 100, ok=True, result={"v": "wrong-id"})
            w.send("host_reply", execution="x1", request=1, ok=True, result={"v": "finished"})
            time.sleep(0.05)
            return ok_reply({"v": "right"})

        outcome, _, _ = self.run_cell("import klbr\nawait klbr.host.request('t.op', {})", on_request=answer)
        self.assertEqual(outcome["value"], "{'v': 'right'}")
        self.assertEqual(self.value("'in sync'"), "'in sync'")

    def test_late_reply_after_cancel_does_not_satisfy_the_next_request(self):
        held = []
        outcome, _, reqs = self.run_cell("await local.send('never answered')",
                                         on_request=lambda f: held.append(f), interrupt_after=0.2)
        self.assertEqual(outcome["status"], "cancelled")
        old = held[0]

        def answer(f):
            # The late reply for the cancelled execution's request 1 arrives first.
            self.worker.send("host_reply", execution=old["execution"], request=old["request"], ok=True,
                             result={"v": "late"})
            time.sleep(0.05)
            return ok_reply({"v": "fresh"})

        outcome, _, _ = self.run_cell("(await local.send('second')).raw", on_request=answer)
        self.assertEqual(outcome["value"], "{'v': 'fresh'}")

    def test_request_from_a_background_task_after_the_cell_finished(self):
        def answer(f):
            if f["execution"] != current["id"]:
                return {"ok": False, "error": {"code": "stale", "message": "execution has finished"}}
            return ok_reply()

        current = {"id": "bgreq1"}
        o1, _, _ = self.run_cell(
            "import asyncio, klbr\n"
            "async def later():\n"
            "    await asyncio.sleep(0.2)\n"
            "    try:\n"
            "        await local.send('too late')\n"
            "    except klbr.HostError as e:\n"
            "        print('refused:', e.code)\n"
            "bgt = asyncio.create_task(later(), name='later')", eid="bgreq1", on_request=answer)
        self.assertEqual(o1["status"], "ok")
        current["id"] = "bgreq2"
        o2, out2, reqs2 = self.run_cell("await asyncio.sleep(0.5)", eid="bgreq2", on_request=answer)
        self.assertEqual(reqs2, [])
        late_reqs = [f for f in self.worker.late if f["type"] == "host_request" and f["execution"] == "bgreq1"]
        self.assertEqual(len(late_reqs), 1)
        self.assertEqual(late_reqs[0]["request"], 1)
        refused = [f for f in self.worker.late if f["type"] == "output" and "refused" in f["data"]]
        self.assertEqual(refused[0]["data"], "refused: stale\n")
        self.assertEqual(refused[0]["execution"], "bgreq1")
        self.assertEqual(refused[0]["origin"], "task")

    def test_request_args_must_be_json(self):
        outcome, _, reqs = self.run_cell("import klbr\nawait klbr.host.request('t.op', {'s': {1, 2}})")
        self.assertEqual(outcome["error"]["type"], "TypeError")
        self.assertEqual(reqs, [])
        outcome, _, reqs = self.run_cell("await local.send('z' * (2 << 20))")
        self.assertEqual(outcome["status"], "error")
        self.assertIn("FrameLengthError", outcome["error"]["type"])
        self.assertEqual(reqs, [])


class WaitTest(WorkbenchCase):
    def test_argument_validation(self):
        code = ("import math\nbad = []\n"
                "for s in (-1, 0, 0.0, -0.5, math.nan, math.inf, -math.inf, 601, 1e9):\n"
                "    try:\n        await runtime.wait(s)\n    except ValueError:\n        bad.append(repr(s))\n"
                "types_ = []\n"
                "for s in ('10', True, [1]):\n"
                "    try:\n        await runtime.wait(s)\n    except TypeError:\n        types_.append(repr(s))\n"
                "(len(bad), len(types_))")
        outcome, _, reqs = self.run_cell(code)
        self.assertEqual(outcome["value"], "(9, 3)", outcome)
        self.assertEqual(reqs, [])

    def test_wait_is_a_terminal_yield(self):
        outcome, out, reqs = self.run_cell(
            "after_wait = False\nprint('before')\nawait runtime.wait(30, reason='waiting for the build')\n"
            "after_wait = True\nprint('after')", on_request=lambda f: ok_reply({"wait": "w1"}))
        self.assertEqual(outcome["status"], "yielded", outcome)
        self.assertEqual(reqs[0]["op"], "runtime.wait")
        self.assertEqual(reqs[0]["args"], {"seconds": 30, "reason": "waiting for the build"})
        self.assertEqual(outcome["yield"], {"op": "runtime.wait", "request": 1, "seconds": 30,
                                            "reason": "waiting for the build"})
        self.assertNotIn("error", outcome)
        self.assertEqual(text_of(out), "before\n")
        self.assertEqual(self.value("after_wait"), "False")

    def test_wait_without_seconds_and_swallowed_yield(self):
        outcome, _, reqs = self.run_cell(
            "try:\n    await runtime.wait()\nexcept BaseException:\n    pass\n'ran on'",
            on_request=lambda f: ok_reply())
        self.assertEqual(reqs[0]["args"], {"seconds": None, "reason": ""})
        self.assertEqual(outcome["status"], "yielded")  # the host accepted the wait

    def test_except_exception_does_not_swallow_the_yield(self):
        outcome, _, _ = self.run_cell("try:\n    await runtime.wait(1)\nexcept Exception:\n    swallowed = True",
                                      on_request=lambda f: ok_reply())
        self.assertEqual(outcome["status"], "yielded")
        self.assertEqual(self.value("'swallowed' in globals()"), "False")

    def test_refused_wait_is_an_error(self):
        outcome, _, _ = self.run_cell("await runtime.wait(5)",
                                      on_request=lambda f: {"ok": False, "error": {"code": "stale", "message": "gone"}})
        self.assertEqual(outcome["status"], "error")
        self.assertEqual(outcome["error"]["type"], "klbr.HostError")

    def test_wait_from_a_background_task_ends_the_cell(self):
        outcome, _, _ = self.run_cell(
            "import asyncio\nasync def waiter():\n    await runtime.wait(2, 'bg')\n"
            "asyncio.create_task(waiter())\nawait asyncio.sleep(5)\nnot_reached = True",
            on_request=lambda f: ok_reply(), timeout=4)
        self.assertEqual(outcome["status"], "yielded")
        self.assertEqual(outcome["yield"]["reason"], "bg")


class RunTest(WorkbenchCase):
    def test_run_request_and_result(self):
        os.makedirs(os.path.join(self.tmp, "sub"), exist_ok=True)

        def answer(f):
            return ok_reply({"exit_code": 3, "stdout_b64": base64.b64encode(b"out\xff").decode(),
                             "stderr_b64": base64.b64encode(b"err").decode(), "truncated": True, "timed_out": False})

        outcome, _, reqs = self.run_cell(
            "r = await run(['make', 'test'], cwd='sub', env={'A': 'b'}, timeout=12.5)\n"
            "(r.exit_code, r.stdout, r.stderr, r.truncated, r.timed_out, r.ok)", on_request=answer)
        self.assertEqual(outcome["value"], "(3, b'out\\xff', b'err', True, False, False)")
        self.assertEqual(reqs[0]["op"], "workspace.run")
        self.assertEqual(reqs[0]["args"], {"argv": ["make", "test"], "cwd": "sub", "env": {"A": "b"}, "timeout": 12.5})
        outcome, _, reqs = self.run_cell("(await run(('true',))).ok", on_request=lambda f: ok_reply(
            {"exit_code": 0, "stdout_b64": "", "stderr_b64": "", "truncated": False, "timed_out": False}))
        self.assertEqual(outcome["value"], "True")
        self.assertEqual(reqs[0]["args"], {"argv": ["true"], "cwd": ".", "env": {}, "timeout": 60})

    def test_run_validation_happens_before_the_request(self):
        outcome, _, reqs = self.run_cell(
            "errs = []\n"
            "for kw in ({'argv': 'ls -l'}, {'argv': []}, {'argv': ['ls'], 'cwd': '..'}, {'argv': ['ls'], 'timeout': 0},"
            " {'argv': ['ls'], 'timeout': float('inf')}, {'argv': ['ls'], 'env': {'A': 1}}):\n"
            "    try:\n        await run(**kw)\n    except Exception as e:\n        errs.append(type(e).__name__)\nerrs")
        self.assertEqual(outcome["value"],
                         "['TypeError', 'TypeError', 'WorkspaceEscape', 'ValueError', 'ValueError', 'TypeError']")
        self.assertEqual(reqs, [])


class LifecycleTest(unittest.TestCase):
    def start(self, **kw):
        w = peer.Worker(**kw).start()
        self.addCleanup(w.close)
        return w

    def test_shutdown_exits_zero(self):
        w = self.start()
        w.run_ok("x = 1")
        t0 = time.monotonic()
        w.send("shutdown")
        self.assertEqual(w.wait_exit(5), 0)
        self.assertLess(time.monotonic() - t0, 1.0)

    def test_shutdown_while_sync_code_blocks(self):
        w = self.start()
        w.send("execute", execution="blocked", code="while True: pass")
        time.sleep(0.2)
        t0 = time.monotonic()
        w.send("shutdown")
        self.assertEqual(w.wait_exit(5), 0)
        self.assertLess(time.monotonic() - t0, 1.0)

    def test_eof_ends_the_worker(self):
        w = self.start()
        w.run_ok("import asyncio\nasync def forever():\n    while True: await asyncio.sleep(1)\n"
                 "t = asyncio.create_task(forever())")
        w.host.close()
        self.assertEqual(w.wait_exit(5), 0)

    def test_eof_while_sync_code_blocks(self):
        w = self.start()
        w.send("execute", execution="blocked", code="while True: pass")
        time.sleep(0.2)
        w.host.close()
        self.assertEqual(w.wait_exit(5), 0)

    def test_protocol_socket_is_not_inherited_by_children(self):
        w = self.start()
        outcome, out = w.run_ok("import subprocess, os\nfd = int(os.environ['KLBR_PROTOCOL_FD'])\n"
                                "print(os.get_inheritable(fd))")
        self.assertEqual(text_of(out), "False\n")

    def test_cell_that_swallows_interrupts_does_not_break_the_reader(self):
        w = self.start()
        w.send("execute", execution="stubborn",
               code="import signal\nsignal.signal(signal.SIGINT, lambda *a: print('swallowed'))\n"
                    "while True:\n    try:\n        while True: pass\n    except BaseException:\n        pass")
        time.sleep(0.2)
        w.send("interrupt", execution="stubborn")
        with self.assertRaises(TimeoutError):
            w.collect("stubborn", timeout=2.5)  # it keeps looping: the host would kill it
        self.assertIsNone(w.proc.poll())
        w.send("interrupt", execution="stubborn")  # the reader still reads
        w.send("shutdown")
        self.assertEqual(w.wait_exit(5), 0)

    def test_one_keyboard_interrupt_per_interrupt(self):
        # A cell that catches the KeyboardInterrupt and goes on looping gets
        # no second one: killing it is the host's job, and the reader lives.
        w = self.start()
        w.send("execute", execution="catcher",
               code="caught = 0\nwhile True:\n    try:\n        n = 0\n        while True:\n            n += 1\n"
                    "    except KeyboardInterrupt:\n        caught += 1\n        print('caught', caught)")
        time.sleep(0.2)
        w.send("interrupt", execution="catcher")
        frames = []
        deadline = time.monotonic() + 2.5  # past every escalation retry
        while time.monotonic() < deadline:
            try:
                frames.append(w.recv(max(0.01, deadline - time.monotonic())))
            except TimeoutError:
                break
        self.assertEqual([f["type"] for f in frames], ["output"])  # no outcome
        self.assertEqual(frames[0]["data"], "caught 1\n")
        self.assertIsNone(w.proc.poll())
        w.send("shutdown")
        self.assertEqual(w.wait_exit(5), 0)

    def test_interrupts_work_after_a_cell_replaced_the_sigint_handler(self):
        w = self.start()
        w.run_ok("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)")
        outcome, _, _ = w.execute("while True: pass", interrupt_after=0.2, timeout=5)
        self.assertEqual(outcome["status"], "cancelled")

    def test_default_fd_3(self):
        w = self.start(fd3=True)
        self.assertEqual(w.hello["role"], "workbench")
        self.assertEqual(w.run_ok("6 * 7")[0]["value"], "42")

    def test_omitted_fields_are_zero_values(self):
        # The Go host omits empty fields (json omitempty): an empty cell has no "code".
        w = self.start()
        w.send("execute", execution="empty")
        outcome, _, _ = w.collect("empty")
        self.assertEqual(outcome["status"], "ok")
        self.assertIsNone(outcome["value"])

    def test_execute_while_busy_is_refused(self):
        w = self.start()
        w.send("execute", execution="first", code="import asyncio\nawait asyncio.sleep(0.3)\n'first done'")
        w.send("execute", execution="second", code="'second'")
        o2, _, _ = w.collect("second", timeout=5)
        self.assertEqual(o2["status"], "error")
        self.assertEqual(o2["error"]["type"], "ProtocolError")
        o1, _, _ = w.collect("first", timeout=5)
        self.assertEqual(o1["value"], "'first done'")

    def test_interrupt_right_after_execute(self):
        w = self.start()
        w.send("execute", execution="quick", code="import time\ntime.sleep(30)")
        w.send("interrupt", execution="quick")
        outcome, _, _ = w.collect("quick", timeout=5)
        self.assertEqual(outcome["status"], "cancelled")

    def test_frames_of_another_session_or_generation_abandon_the_connection(self):
        for bad in ({"session": "other"}, {"generation": peer.GENERATION + 1}, {"v": 2}):
            with self.subTest(bad=bad):
                w = self.start()
                f = {"v": 1, "type": "execute", "session": peer.SESSION, "generation": peer.GENERATION,
                     "execution": "e", "code": "1"}
                f.update(bad)
                w.send_raw(peer.encode(f))
                self.assertEqual(w.wait_exit(5), 2)
                self.assertIn("protocol error", w.diagnostics())

    def test_malformed_frames_abandon_the_connection(self):
        for data in (b"\x00\x00\x00\x00", b"\x00\x00\x00\x03[1]", b"\x00\x00\x00\x02\xff\xfe",
                     b"\x7f\xff\xff\xff", b"\x00\x00\x00\x05{"):
            with self.subTest(data=data):
                w = self.start()
                w.send_raw(data)
                if data == b"\x00\x00\x00\x05{":
                    w.host.shutdown(1)  # EOF inside the frame
                self.assertEqual(w.wait_exit(5), 2)

    def test_missing_environment_is_refused(self):
        w = peer.Worker(env={"KLBR_GENERATION": "zero"})
        self.addCleanup(w.close)
        self.assertEqual(w.wait_exit(10), 2)
        self.assertIn("KLBR_GENERATION", w.diagnostics())

    def test_round_trip_overhead(self):
        w = self.start()
        for _ in range(50):
            w.execute("x = 1")
        n = 500
        t0 = time.perf_counter()
        for _ in range(n):
            outcome, _, _ = w.execute("x = 1")
        per = (time.perf_counter() - t0) / n * 1000
        self.assertEqual(outcome["status"], "ok")
        sys.stderr.write(f"\n  [perf] x = 1 round trip through the test peer: {per:.3f} ms\n")
        self.assertLess(per, 5.0)


if __name__ == "__main__":
    unittest.main()


class ReattachTest(unittest.TestCase):
    """``reattach``: a restarted klbr-core takes a worker on a host over."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="klbr-wb-")
        self.worker = peer.Worker(workspace=self.tmp).start()

    def tearDown(self):
        self.worker.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def reattach(self, eid):
        """Send reattach; return (the new hello, the outcome of eid)."""
        w = self.worker
        w.send("reattach")
        hello, outcome = None, None
        deadline = time.monotonic() + 10
        while hello is None:
            f = w.recv(max(deadline - time.monotonic(), 0.001))
            if f["type"] == "hello":
                hello = f
            elif f["type"] == "outcome" and f["execution"] == eid:
                outcome = f
        self.assertIsNotNone(outcome, "the hello came before the cut cell ended")
        return hello, outcome

    def test_a_blocked_cell_is_interrupted_and_the_state_kept(self):
        w = self.worker
        w.run_ok("x = 41")
        eid = w.next_id()
        w.send("execute", execution=eid, code="import time\nprint('sleeping')\ntime.sleep(60)")
        time.sleep(0.3)
        hello, outcome = self.reattach(eid)
        self.assertEqual(hello["pid"], w.proc.pid)
        self.assertEqual(hello["role"], "workbench")
        self.assertEqual(outcome["status"], "cancelled", outcome)
        out, _ = w.run_ok("x + 1")
        self.assertEqual(out["value"], "42")

    def test_a_pending_request_ends_lost(self):
        w = self.worker
        eid = w.next_id()
        w.send("execute", execution=eid, code="r = await history.search('q')")
        deadline = time.monotonic() + 10
        while True:  # the request is out, and never answered
            f = w.recv(max(deadline - time.monotonic(), 0.001))
            if f["type"] == "host_request":
                break
        hello, outcome = self.reattach(eid)
        self.assertEqual(hello["type"], "hello")
        self.assertIn(outcome["status"], ("error", "cancelled"), outcome)
        w.run_ok("y = 1")

    def test_a_pending_sync_request_ends_lost(self):
        w = self.worker
        eid = w.next_id()
        w.send("execute", execution=eid, code=(
            "import klbr._sdk as sdk\ntry:\n    sdk._rt().request_sync('history.search', {'query': 'q'})\n"
            "except Exception as e:\n    print('ENDED', e)\n    raise"))
        deadline = time.monotonic() + 10
        while True:
            f = w.recv(max(deadline - time.monotonic(), 0.001))
            if f["type"] == "host_request":
                break
        hello, outcome = self.reattach(eid)
        self.assertEqual(hello["type"], "hello")
        self.assertNotEqual(outcome["status"], "ok", outcome)
        w.run_ok("y = 1")

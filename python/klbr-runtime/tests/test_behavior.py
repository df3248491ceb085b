"""klbr.behavior and klbr.hooks: the host requests end to end through the real
runner, and the draft helpers (paths, symlinks, hooks.bind) in-process."""

import asyncio
import os
import shutil
import stat
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # keep src/ free of __pycache__ (klbr-core embeds the tree)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import peer  # noqa: E402

import klbr  # noqa: E402
import klbr.behavior  # noqa: E402
import klbr.hooks  # noqa: E402
from klbr import DraftEscape, NoExecutionScope  # noqa: E402
from klbr.behavior import Draft, Record  # noqa: E402


def run(coro):
    return asyncio.run(coro)


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(data)


def ok_reply(result):
    return {"ok": True, "result": result}


HISTORY = [{"epoch": 3, "release": "sha256:bb", "kind": "hooks", "reason": "tighter review",
            "activated_at": 1700000100.5},
           {"epoch": 2, "release": "sha256:aa", "kind": "initial", "reason": "", "activated_at": 1700000000.0}]
ACTIVATED = {"epoch": 4, "release": "sha256:cc", "kind": "documents", "replaced": "sha256:bb",
             "workbench_reset_pending": False}


class HostOpsTest(unittest.TestCase):
    """Each op sends the right op and args and returns the host's result."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="klbr-beh-")
        cls.draft_dir = os.path.join(cls.tmp, "drafts", "d-7")
        write(os.path.join(cls.draft_dir, "instructions.md"), "# How you operate\nold line\n")
        cls.worker = peer.Worker(workspace=cls.tmp).start()

    @classmethod
    def tearDownClass(cls):
        cls.worker.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def cell(self, code, replies):
        """Run a cell answering its requests from ``replies`` (a list, in order);
        return (outcome, requests)."""
        replies = list(replies)
        outcome, _, reqs = self.worker.execute(code, on_request=lambda f: replies.pop(0))
        self.assertEqual(replies, [], "not every reply was asked for")
        return outcome, reqs

    def value(self, code, replies):
        outcome, reqs = self.cell(code, replies)
        self.assertEqual(outcome["status"], "ok", outcome)
        return outcome["value"], [(r["op"], r["args"]) for r in reqs]

    def test_prelude(self):
        v, _ = self.value("import klbr\n(behavior is klbr.behavior, hooks is klbr.hooks, skills is klbr.skills,"
                          " local is klbr.local, workspace is klbr.workspace, klbr.PRELUDE_MODULES)", [])
        self.assertEqual(v, "(True, True, True, True, True, "
                            "('local', 'runtime', 'workspace', 'behavior', 'hooks', 'skills', 'discord', 'history', 'jobs', 'code', 'agents'))")

    def test_status(self):
        reply = {"epoch": 3, "release": "sha256:bb", "history": HISTORY}
        v, reqs = self.value(
            "s = await behavior.status()\n"
            "(s.epoch, s.release, s['epoch'], s.history[1].kind, s.history[0]['reason'], type(s).__name__,"
            f" s == {reply!r})", [ok_reply(reply)])
        self.assertEqual(reqs, [("behavior.status", {})])
        self.assertEqual(v, "(3, 'sha256:bb', 3, 'initial', 'tighter review', 'Record', True)")

    def test_draft_publish_activate_rollback(self):
        draft_reply = {"draft": "d-7", "path": self.draft_dir, "parent_epoch": 3, "parent_release": "sha256:bb"}
        pub_reply = {"release": "sha256:cc", "kind": "documents", "files": 12, "skills": ["maintenance"]}
        v, reqs = self.value(
            "d = await behavior.draft()\n"
            "await d.replace('instructions.md', 'old line', 'new line')\n"
            "await d.write('skills/extra/SKILL.md', '# extra\\nBody.\\n')\n"
            "pub = await behavior.publish(d)\n"
            "pub2 = await behavior.publish('d-7')\n"
            "act = await behavior.activate(pub)\n"
            "act2 = await behavior.activate('sha256:cc', expected_epoch=3, reason='clearer instructions')\n"
            "rb = await behavior.rollback()\n"
            "(d.id, str(d.path), type(d.path).__name__, d.parent_epoch, d.parent_release, d.files(),"
            " pub.release, pub.files, act.epoch, act.workbench_reset_pending, act2.replaced, rb == act)",
            [ok_reply(draft_reply), ok_reply(pub_reply), ok_reply(pub_reply), ok_reply(ACTIVATED),
             ok_reply(ACTIVATED), ok_reply(ACTIVATED)])
        self.assertEqual(reqs, [
            ("behavior.draft", {}),
            ("behavior.publish", {"draft": "d-7"}),
            ("behavior.publish", {"draft": "d-7"}),
            ("behavior.activate", {"release": "sha256:cc", "reason": ""}),
            ("behavior.activate", {"release": "sha256:cc", "expected_epoch": 3, "reason": "clearer instructions"}),
            ("behavior.rollback", {}),
        ])
        self.assertEqual(v, repr((
            "d-7", self.draft_dir, "PosixPath", 3, "sha256:bb", ["instructions.md", "skills/extra/SKILL.md"],
            "sha256:cc", 12, 4, False, "sha256:bb", True)))
        with open(os.path.join(self.draft_dir, "instructions.md")) as f:
            self.assertEqual(f.read(), "# How you operate\nnew line\n")
        with open(os.path.join(self.draft_dir, "skills", "extra", "SKILL.md")) as f:
            self.assertEqual(f.read(), "# extra\nBody.\n")

    def test_hooks_ops(self):
        listed = {"release": "sha256:bb", "epoch": 3,
                  "slots": [{"slot": "attention.plan"}, {"slot": "delivery.review"}]}
        described = {"slot": "delivery.review", "doc": "Review a send.", "contract": {"input": {}, "output": {}}}
        tested = {"ok": True, "outcome": "ok", "result": {"decision": "hold", "reason": "empty"},
                  "latency_ms": 1.5}
        failed = {"ok": False, "outcome": "error", "error": {"type": "ValueError", "message": "bad input"},
                  "latency_ms": 0.7}
        trace = {"invocations": [{"slot": "delivery.review", "outcome": "ok", "fallback": False, "epoch": 3,
                                  "error": None, "at": 1700000200.0}]}
        v, reqs = self.value(
            "l = await hooks.list()\n"
            "d = await hooks.describe('delivery.review')\n"
            "t = await hooks.test('delivery.review', {'channel': 'local', 'text': ' '})\n"
            "t2 = await hooks.test('delivery.review', {'text': 1}, release={'release': 'sha256:cc'})\n"
            "t3 = await hooks.test('attention.plan', {'items': []}, release='sha256:dd')\n"
            "tr = await hooks.trace()\n"
            "tr5 = await hooks.trace(limit=5)\n"
            "(l.slots[1].slot, d.doc, t.result['decision'], t2.error['type'], tr.invocations[0].fallback,"
            " tr5 == tr, t3.ok)",
            [ok_reply(listed), ok_reply(described), ok_reply(tested), ok_reply(failed), ok_reply(tested),
             ok_reply(trace), ok_reply(trace)])
        self.assertEqual(reqs, [
            ("hooks.list", {}),
            ("hooks.describe", {"slot": "delivery.review"}),
            ("hooks.test", {"slot": "delivery.review", "input": {"channel": "local", "text": " "}}),
            ("hooks.test", {"slot": "delivery.review", "input": {"text": 1}, "release": "sha256:cc"}),
            ("hooks.test", {"slot": "attention.plan", "input": {"items": []}, "release": "sha256:dd"}),
            ("hooks.trace", {"limit": 20}),
            ("hooks.trace", {"limit": 5}),
        ])
        self.assertEqual(v, "('delivery.review', 'Review a send.', 'hold', 'ValueError', False, True, True)")

    def test_diff_rebase_and_trace_inputs(self):
        diffed = {"draft": "d-1", "parent_release": "aa", "diff": "+x\n", "truncated": False}
        rebased = {"draft": "d-1", "rebased": False, "conflicts": [{"path": "soul.md", "reason": "both",
                                                                    "merged": "<<<<<<< draft"}]}
        v, reqs = self.value(
            "df = await behavior.diff('d-1')\n"
            "rb = await behavior.rebase('d-1')\n"
            "tr = await hooks.trace(3, inputs=True)\n"
            "(df.diff, rb.rebased, rb.conflicts[0].path)",
            [ok_reply(diffed), ok_reply(rebased), ok_reply({"invocations": []})])
        self.assertEqual(reqs, [("behavior.diff", {"draft": "d-1"}), ("behavior.rebase", {"draft": "d-1"}),
                                ("hooks.trace", {"limit": 3, "inputs": True})])
        self.assertEqual(v, "('+x\\n', False, 'soul.md')")

    def test_host_refusals_are_host_errors(self):
        ops = ["behavior.status()", "behavior.draft()", "behavior.publish('d-1')", "behavior.activate('r')",
               "behavior.rollback()", "hooks.list()", "hooks.describe('s')", "hooks.test('s', {})",
               "hooks.trace()"]
        code = ("import klbr\ncodes = []\n"
                f"for expr in {ops!r}:\n"
                "    try:\n        await eval(expr)\n"
                "    except klbr.HostError as e:\n        codes.append((e.code, e.message))\ncodes")
        refusal = {"ok": False, "error": {"code": "conflict", "message": "epoch moved: 3 != 5"}}
        v, reqs = self.value(code, [refusal] * len(ops))
        self.assertEqual(v, repr([("conflict", "epoch moved: 3 != 5")] * len(ops)))
        self.assertEqual(len(reqs), len(ops))
        outcome, _ = self.cell("await behavior.activate('sha256:cc', reason='x')", [refusal])
        self.assertEqual(outcome["status"], "error")
        self.assertEqual(outcome["error"]["type"], "klbr.HostError")
        self.assertEqual(outcome["error"]["message"], "conflict: epoch moved: 3 != 5")

    def test_arguments_are_checked_before_anything_is_sent(self):
        bad = [
            ("behavior.publish(3)", "TypeError"),
            ("behavior.publish('')", "ValueError"),
            ("behavior.activate(None)", "TypeError"),
            ("behavior.activate({'kind': 'hooks'})", "TypeError"),
            ("behavior.activate('r', expected_epoch=True)", "TypeError"),
            ("behavior.activate('r', expected_epoch='3')", "TypeError"),
            ("behavior.activate('r', expected_epoch=-1)", "ValueError"),
            ("behavior.activate('r', reason=None)", "TypeError"),
            ("behavior.activate(klbr.behavior.Draft('d', '/tmp'))", "TypeError"),
            ("hooks.describe('')", "ValueError"),
            ("hooks.describe('a b')", "ValueError"),
            ("hooks.test('s', [1])", "TypeError"),
            ("hooks.test('s', {}, release=5)", "TypeError"),
            ("hooks.trace(0)", "ValueError"),
            ("hooks.trace(2.5)", "TypeError"),
        ]
        code = ("import klbr\nerrs = []\n"
                f"for expr in {[b[0] for b in bad]!r}:\n"
                "    try:\n        await eval(expr)\n"
                "    except Exception as e:\n        errs.append(type(e).__name__)\nerrs")
        v, reqs = self.value(code, [])
        self.assertEqual(v, repr([b[1] for b in bad]))
        self.assertEqual(reqs, [])

    def test_malformed_draft_reply(self):
        outcome, _ = self.cell("await behavior.draft()", [ok_reply({"draft": "d-1", "path": "relative/dir"})])
        self.assertEqual(outcome["status"], "error")
        self.assertEqual(outcome["error"]["type"], "ValueError")

    def test_help_is_readable(self):
        outcome, out, _ = self.worker.execute("help(behavior.activate)\nhelp(hooks.test)")
        self.assertEqual(outcome["status"], "ok", outcome)
        text = peer.text_of(out)
        self.assertIn("activate(release, expected_epoch=None, reason='')", text)
        self.assertIn("test(slot, input, release=None, handler=None)", text)


class NoScopeTest(unittest.TestCase):
    def test_outside_a_workbench(self):
        for coro in (klbr.behavior.status(), klbr.behavior.draft(), klbr.behavior.publish("d"),
                     klbr.behavior.activate("r"), klbr.behavior.rollback(), klbr.hooks.list(),
                     klbr.hooks.describe("s"), klbr.hooks.test("s", {}), klbr.hooks.trace()):
            with self.subTest(coro=coro.__qualname__):
                with self.assertRaises(NoExecutionScope):
                    run(coro)

    def test_facades(self):
        self.assertEqual(sorted(klbr.hooks.__all__), ["bind", "describe", "list", "test", "trace"])
        for name in klbr.hooks.__all__:
            f = getattr(klbr.hooks, name)
            self.assertEqual((f.__name__, f.__module__), (name, "klbr.hooks"))
            self.assertTrue(asyncio.iscoroutinefunction(f), name)
        for name in ("status", "draft", "publish", "activate", "rollback"):
            self.assertTrue(asyncio.iscoroutinefunction(getattr(klbr.behavior, name)), name)
        self.assertIn("activate", dir(klbr.behavior))
        with self.assertRaises(AttributeError):
            klbr.behavior.nope
        self.assertIs(klbr.behavior.DraftEscape, klbr.DraftEscape)
        self.assertTrue(issubclass(DraftEscape, PermissionError))

    def test_record(self):
        r = Record(epoch=3, release="r")
        self.assertEqual((r.epoch, r["release"], r), (3, "r", {"epoch": 3, "release": "r"}))
        with self.assertRaises(AttributeError) as cm:
            r.missing
        self.assertIn("epoch, release", str(cm.exception))
        self.assertIn("epoch", dir(r))
        self.assertEqual(repr(r), "{'epoch': 3, 'release': 'r'}")


class DraftCase(unittest.TestCase):
    def setUp(self):
        self.base = tempfile.mkdtemp(prefix="klbr-draft-")
        self.addCleanup(shutil.rmtree, self.base, True)
        self.root = os.path.join(self.base, "draft")
        self.outside = os.path.join(self.base, "outside")
        write(os.path.join(self.root, "soul.md"), "I am klbr.\n")
        write(os.path.join(self.outside, "secret.md"), "secret\n")
        self.d = Draft("d-1", self.root, 5, "sha256:ee")

    def p(self, *parts):
        return os.path.join(self.root, *parts)


class DraftFilesTest(DraftCase):
    def test_read_write_replace(self):
        d = self.d
        self.assertEqual(d.read("soul.md"), "I am klbr.\n")
        self.assertEqual(d.read("./soul.md"), "I am klbr.\n")
        run(d.write("skills/new/SKILL.md", "# new\r\nwindows line\r\n"))
        self.assertEqual(d.read("skills/new/SKILL.md"), "# new\r\nwindows line\r\n")
        run(d.replace("soul.md", "klbr", "klbr, still"))
        with open(self.p("soul.md")) as f:
            self.assertEqual(f.read(), "I am klbr, still.\n")
        with self.assertRaisesRegex(ValueError, "found 0"):
            run(d.replace("soul.md", "absent", "x"))
        run(d.write("twice.md", "a a"))
        with self.assertRaisesRegex(ValueError, "found 2"):
            run(d.replace("twice.md", "a", "b"))
        with self.assertRaises(ValueError):
            run(d.replace("soul.md", "", "x"))
        with self.assertRaises(TypeError):
            run(d.write("soul.md", b"bytes"))
        self.assertEqual(d.files(), ["skills/new/SKILL.md", "soul.md", "twice.md"])
        self.assertEqual(os.fspath(d), self.root)
        self.assertIn("d-1", repr(d))

    def test_write_keeps_permissions_and_leaves_no_temporary_files(self):
        os.chmod(self.p("soul.md"), 0o640)
        run(self.d.write("soul.md", "changed\n"))
        self.assertEqual(stat.S_IMODE(os.stat(self.p("soul.md")).st_mode), 0o640)
        self.assertEqual(os.listdir(self.root), ["soul.md"])

    def test_missing_and_wrong_kinds(self):
        with self.assertRaises(FileNotFoundError):
            self.d.read("nope.md")
        with self.assertRaises(FileNotFoundError):
            self.d.read("nodir/nope.md")
        os.makedirs(self.p("adir"))
        with self.assertRaises(IsADirectoryError):
            self.d.read("adir")
        with self.assertRaises(IsADirectoryError):
            run(self.d.write("adir", "x"))
        with self.assertRaises(IsADirectoryError):
            self.d.read(".")
        with self.assertRaises(NotADirectoryError):
            run(self.d.write("soul.md/inner.md", "x"))

    def test_fifo_is_refused_without_blocking(self):
        os.mkfifo(self.p("pipe.md"))
        with self.assertRaises(OSError):
            self.d.read("pipe.md")

    def test_escapes_are_refused(self):
        os.symlink(self.outside, self.p("linkdir"))
        os.symlink(os.path.join(self.outside, "secret.md"), self.p("link.md"))
        os.symlink("soul.md", self.p("inner-link.md"))  # inside, but still a symlink
        for path in ("../outside/secret.md", os.path.join(self.outside, "secret.md"), self.p("soul.md"),
                     "a/../../outside/secret.md", "linkdir/secret.md", "link.md", "inner-link.md"):
            with self.subTest(path=path):
                with self.assertRaises(DraftEscape):
                    self.d.read(path)
                with self.assertRaises(DraftEscape):
                    run(self.d.write(path, "pwned\n"))
                with self.assertRaises(DraftEscape):
                    run(self.d.replace(path, "secret", "pwned"))
        with self.assertRaises(DraftEscape):
            run(self.d.write("linkdir/new.md", "x"))
        with open(os.path.join(self.outside, "secret.md")) as f:
            self.assertEqual(f.read(), "secret\n")
        self.assertEqual(os.listdir(self.outside), ["secret.md"])
        self.assertTrue(os.path.islink(self.p("link.md")))
        # files() lists symlinks (publish refuses them) and does not follow them.
        self.assertEqual(self.d.files(), ["inner-link.md", "link.md", "linkdir", "soul.md"])


HOOKS_INIT = textwrap.dedent('''\
    """Policy hooks."""

    from .attention import plan
    from .delivery import review

    SLOTS = {
        "attention.plan": plan,
        "delivery.review": review,  # fails closed
    }

    __all__ = ["SLOTS"]
''')


class BindTest(DraftCase):
    def setUp(self):
        super().setUp()
        write(self.p("klbr_hooks", "__init__.py"), HOOKS_INIT)
        write(self.p("klbr_hooks", "attention.py"), "def plan(data):\n    return {}\n")
        write(self.p("klbr_hooks", "delivery.py"), "def review(data):\n    return {}\n")
        write(self.p("klbr_hooks", "strict.py"), "async def review(data):\n    return {}\n\nLIMIT = 3\n")

    def init(self):
        return self.d.read("klbr_hooks/__init__.py")

    def bind(self, slot, module, function):
        return run(klbr.hooks.bind(self.d, slot, module, function))

    def test_rebind_and_add(self):
        r = self.bind("delivery.review", "strict", "review")
        self.assertEqual(r, {"path": "klbr_hooks/__init__.py", "slot": "delivery.review", "value": "strict.review",
                             "previous": "review", "import_added": True})
        self.assertEqual(self.init(), HOOKS_INIT.replace(
            "from .delivery import review\n", "from .delivery import review\nfrom . import strict\n").replace(
            '"delivery.review": review,  # fails closed', '"delivery.review": strict.review,  # fails closed'))
        r = self.bind("attention.extra", "strict", "review")
        self.assertEqual((r.previous, r.import_added), (None, False))
        self.assertIn('    "delivery.review": strict.review,  # fails closed\n    "attention.extra": strict.review,\n}',
                      self.init())
        self.assertEqual(self.init().count("from . import strict"), 1)

    def test_one_line_and_empty_dicts(self):
        write(self.p("klbr_hooks", "__init__.py"), 'from .delivery import review\nSLOTS = {"delivery.review": review}\n')
        self.bind("attention.plan", "attention", "plan")
        self.assertEqual(self.init(), 'from .delivery import review\nfrom . import attention\n'
                                      'SLOTS = {"delivery.review": review, "attention.plan": attention.plan}\n')
        write(self.p("klbr_hooks", "__init__.py"), "SLOTS = {}")
        self.bind("attention.plan", "attention", "plan")
        self.assertEqual(self.init(), 'from . import attention\nSLOTS = {"attention.plan": attention.plan}')

    def test_refusals_change_nothing(self):
        cases = [
            ("delivery.review", "nomodule", "review", FileNotFoundError),
            ("delivery.review", "strict", "missing", ValueError),
            ("delivery.review", "strict", "not-an-identifier", ValueError),
            ("delivery.review", "../x", "review", ValueError),
            ("bad slot", "strict", "review", ValueError),
        ]
        for slot, module, function, exc in cases:
            with self.subTest(module=module, function=function, slot=slot):
                with self.assertRaises(exc):
                    self.bind(slot, module, function)
                self.assertEqual(self.init(), HOOKS_INIT)
        with self.assertRaises(TypeError):
            run(klbr.hooks.bind("d-1", "delivery.review", "strict", "review"))

    def test_unconventional_init_is_refused(self):
        for text in ('SLOTS = dict(a=1)\n', 'SLOTS = {**OTHER}\n', 'SLOTS = {}\nSLOTS = {}\n',
                     'from . import delivery as strict\nSLOTS = {}\n', 'strict = 1\nSLOTS = {}\n',
                     'SLOTS = {"delivery.review": a, "delivery.review": b}\n', 'SLOTS = {}\r'):
            with self.subTest(text=text):
                write(self.p("klbr_hooks", "__init__.py"), text)
                with self.assertRaises(ValueError):
                    self.bind("delivery.review", "strict", "review")
                self.assertEqual(self.init(), text)

    def test_existing_submodule_import_is_reused(self):
        write(self.p("klbr_hooks", "__init__.py"), "from . import strict\n\nSLOTS = {'delivery.review': strict.old}\n")
        r = self.bind("delivery.review", "strict", "review")
        self.assertEqual((r.previous, r.import_added), ("strict.old", False))
        self.assertEqual(self.init(), "from . import strict\n\nSLOTS = {'delivery.review': strict.review}\n")

    def test_import_goes_above_slots(self):
        write(self.p("klbr_hooks", "__init__.py"), "SLOTS = {'a.b': None}\n\nimport os\n")
        self.bind("a.b", "strict", "review")
        self.assertEqual(self.init(), "from . import strict\nSLOTS = {'a.b': strict.review}\n\nimport os\n")

    def test_bound_tree_imports(self):
        self.bind("delivery.review", "strict", "review")
        env = {k: v for k, v in os.environ.items()}
        import subprocess
        r = subprocess.run([sys.executable, "-B", "-c",
                            "import klbr_hooks, asyncio; print(sorted(klbr_hooks.SLOTS), "
                            "asyncio.iscoroutinefunction(klbr_hooks.SLOTS['delivery.review']))"],
                           cwd=self.root, env={**env, "PYTHONDONTWRITEBYTECODE": "1"}, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "['attention.plan', 'delivery.review'] True\n")


if __name__ == "__main__":
    unittest.main()

"""The klbr SDK in-process: workspace helpers and argument validation (no host)."""

import asyncio
import math
import os
import shutil
import stat
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # keep src/ free of __pycache__ (klbr-core embeds the tree)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

import klbr  # noqa: E402
import klbr.workspace  # noqa: E402
from klbr import NoExecutionScope, WorkspaceEscape  # noqa: E402
from klbr.workspace import Workspace  # noqa: E402


def run(coro):
    return asyncio.run(coro)


def write(path, data, mode="w"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, mode) as f:
        f.write(data)


class WorkspaceCase(unittest.TestCase):
    def setUp(self):
        self.base = tempfile.mkdtemp(prefix="klbr-ws-")
        self.addCleanup(shutil.rmtree, self.base, True)
        self.root = os.path.join(self.base, "root")
        self.outside = os.path.join(self.base, "outside")
        os.makedirs(self.root)
        os.makedirs(self.outside)
        write(os.path.join(self.outside, "secret.txt"), "secret\n")
        self.ws = Workspace(self.root)

    def p(self, *parts):
        return os.path.join(self.root, *parts)


class OpenFileTest(WorkspaceCase):
    def test_read_text_write(self):
        write(self.p("docs", "note.md"), "line one\r\nline two\n")
        f = run(self.ws.open_file("docs/note.md"))
        self.assertEqual(f.path, "docs/note.md")
        self.assertEqual(f.text, "line one\r\nline two\n")  # newlines kept as they are
        run(f.write("new ☃\n"))
        with open(self.p("docs", "note.md"), "rb") as fh:
            self.assertEqual(fh.read(), "new ☃\n".encode())
        self.assertEqual(f.text, "new ☃\n")
        write(self.p("docs", "note.md"), "changed on disk")
        self.assertEqual(f.read(), "changed on disk")
        self.assertEqual(f.text, "changed on disk")

    def test_new_file_and_parents(self):
        f = run(self.ws.open_file("a/b/c.txt"))
        self.assertFalse(f.exists)
        with self.assertRaises(FileNotFoundError):
            f.read()
        run(f.write("hi"))
        self.assertTrue(f.exists)
        with open(self.p("a", "b", "c.txt")) as fh:
            self.assertEqual(fh.read(), "hi")
        self.assertEqual([n for n in os.listdir(self.p("a", "b")) if n.endswith(".tmp")], [])

    def test_write_keeps_permissions(self):
        path = self.p("run.sh")
        write(path, "#!/bin/sh\n")
        os.chmod(path, 0o751)
        f = run(self.ws.open_file("run.sh"))
        run(f.write("#!/bin/sh\necho hi\n"))
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o751)

    def test_replace_exactly_once(self):
        write(self.p("code.py"), "a = 1\nb = 2\nb = 2\n")
        f = run(self.ws.open_file("code.py"))
        run(f.replace("a = 1", "a = 10"))
        with open(self.p("code.py")) as fh:
            self.assertEqual(fh.read(), "a = 10\nb = 2\nb = 2\n")
        with self.assertRaisesRegex(ValueError, "exactly one occurrence.*found 2"):
            run(f.replace("b = 2", "b = 3"))
        with self.assertRaisesRegex(ValueError, "found 0"):
            run(f.replace("zzz", "y"))
        with self.assertRaises(ValueError):
            run(f.replace("", "y"))
        with open(self.p("code.py")) as fh:
            self.assertEqual(fh.read(), "a = 10\nb = 2\nb = 2\n")  # failed replaces change nothing

    def test_replace_reads_the_current_content(self):
        write(self.p("x.txt"), "old")
        f = run(self.ws.open_file("x.txt"))
        write(self.p("x.txt"), "old old")
        with self.assertRaisesRegex(ValueError, "found 2"):
            run(f.replace("old", "new"))

    def test_directory_is_refused(self):
        os.makedirs(self.p("d"))
        with self.assertRaises(IsADirectoryError):
            run(self.ws.open_file("d"))

    def test_escapes_are_refused(self):
        os.symlink(self.outside, self.p("out_dir"))
        os.symlink(os.path.join(self.outside, "secret.txt"), self.p("out_file"))
        os.symlink(os.path.join(self.outside, "missing.txt"), self.p("dangling"))
        for path in ("../outside/secret.txt", os.path.join(self.outside, "secret.txt"), "out_dir/secret.txt",
                     "out_file", "dangling", "a/../../outside/secret.txt", "/etc/passwd", "out_dir"):
            with self.subTest(path=path):
                with self.assertRaises(WorkspaceEscape):
                    run(self.ws.open_file(path))
        self.assertTrue(issubclass(WorkspaceEscape, PermissionError))

    def test_symlinks_inside_are_followed(self):
        write(self.p("real", "f.txt"), "inside")
        os.symlink(self.p("real"), self.p("alias"))
        os.symlink("real/f.txt", self.p("link.txt"))
        self.assertEqual(run(self.ws.open_file("alias/f.txt")).text, "inside")
        f = run(self.ws.open_file("link.txt"))
        self.assertEqual(f.path, "real/f.txt")
        run(f.write("through the link"))
        self.assertTrue(os.path.islink(self.p("link.txt")))  # the link stays; its target changes
        with open(self.p("real", "f.txt")) as fh:
            self.assertEqual(fh.read(), "through the link")

    def test_absolute_path_inside(self):
        write(self.p("abs.txt"), "x")
        self.assertEqual(run(self.ws.open_file(self.p("abs.txt"))).path, "abs.txt")

    def test_swapped_symlink_is_caught_at_write(self):
        write(self.p("d", "f.txt"), "x")
        f = run(self.ws.open_file("d/f.txt"))
        shutil.rmtree(self.p("d"))
        os.symlink(self.outside, self.p("d"))
        with self.assertRaises(WorkspaceEscape):
            run(f.write("escaped?"))
        self.assertFalse(os.path.exists(os.path.join(self.outside, "f.txt")))


class LsTest(WorkspaceCase):
    def setUp(self):
        super().setUp()
        write(self.p("README.md"), "readme")
        write(self.p("src", "a.py"), "print(1)\n")
        write(self.p("src", "pkg", "b.py"), "x = 2\n")
        write(self.p("src", "pkg", "c.rs"), "fn main() {}\n")
        write(self.p(".git", "config"), "[core]\n")
        os.symlink(self.outside, self.p("out_link"))

    def test_one_level(self):
        entries = run(self.ws.ls())
        self.assertEqual([e.path for e in entries], [".git", "README.md", "out_link", "src"])
        kinds = {e.name: e.kind for e in entries}
        self.assertEqual(kinds, {".git": "dir", "README.md": "file", "out_link": "symlink", "src": "dir"})
        readme = entries[1]
        self.assertEqual(readme.size, 6)
        self.assertEqual(os.fspath(readme), self.p("README.md"))
        self.assertIn("README.md", repr(readme))
        self.assertEqual([e.path for e in run(self.ws.ls("src"))], ["src/a.py", "src/pkg"])

    def test_recursive_with_glob(self):
        self.assertEqual([e.path for e in run(self.ws.ls(".", recursive=True, match="*.py"))],
                         ["src/a.py", "src/pkg/b.py"])
        all_paths = [e.path for e in run(self.ws.ls(recursive=True))]
        self.assertNotIn(".git", all_paths)
        self.assertNotIn(".git/config", all_paths)
        self.assertIn("out_link", all_paths)
        self.assertFalse([p for p in all_paths if p.startswith("out_link/")])  # not followed
        self.assertEqual([e.path for e in run(self.ws.ls("src", True, "*.rs"))], ["src/pkg/c.rs"])

    def test_file_and_errors(self):
        self.assertEqual([e.path for e in run(self.ws.ls("README.md"))], ["README.md"])
        with self.assertRaises(FileNotFoundError):
            run(self.ws.ls("nope"))
        with self.assertRaises(WorkspaceEscape):
            run(self.ws.ls("out_link"))
        with self.assertRaises(WorkspaceEscape):
            run(self.ws.ls(".."))


class SearchTest(WorkspaceCase):
    def setUp(self):
        super().setUp()
        write(self.p("a.txt"), "alpha\nTODO: one\nbeta\n")
        write(self.p("sub", "b.py"), "# TODO two\nx = 1\n# TODO three\n")
        write(self.p("crlf.txt"), "first\r\nTODO crlf\r\n")
        write(self.p("bin.dat"), b"TODO\x00binary", "wb")
        write(self.p(".git", "HEAD"), "TODO in git\n")
        os.symlink(self.outside, self.p("out_link"))
        write(os.path.join(self.outside, "o.txt"), "TODO outside\n")
        os.symlink(os.path.join(self.outside, "o.txt"), self.p("out_file_link"))
        write(self.p("latin1.txt"), b"caf\xe9 TODO\n", "wb")

    def test_matches(self):
        r = run(self.ws.search("TODO"))
        got = [(m.path, m.line, m.text) for m in r.matches]
        self.assertEqual(got, [
            ("a.txt", 2, "TODO: one"),
            ("crlf.txt", 2, "TODO crlf"),
            ("latin1.txt", 1, "caf\ufffd TODO"),
            ("sub/b.py", 1, "# TODO two"),
            ("sub/b.py", 3, "# TODO three"),
        ])
        self.assertFalse(r.truncated)
        self.assertIn("a.txt:2: TODO: one", str(r))
        path, line, text = r.matches[0]
        self.assertEqual((path, line, text), ("a.txt", 2, "TODO: one"))
        self.assertEqual(r[0].line, 2)

    def test_truncated(self):
        r = run(self.ws.search("TODO", max_results=2))
        self.assertEqual(len(r.matches), 2)
        self.assertTrue(r.truncated)
        self.assertIn("truncated", str(r))
        r = run(self.ws.search("TODO", max_results=5))
        self.assertFalse(r.truncated)  # exactly five: complete
        with self.assertRaises(ValueError):
            run(self.ws.search("x", max_results=0))

    def test_path_and_regex(self):
        r = run(self.ws.search(r"^x = \d", "sub"))
        self.assertEqual([(m.path, m.line) for m in r], [("sub/b.py", 2)])
        r = run(self.ws.search(r"TODO(?!:)", "a.txt"))
        self.assertEqual(len(r), 0)
        r = run(self.ws.search(r"(?<=# )TODO t(?=wo$)"))
        self.assertEqual([(m.path, m.line) for m in r], [("sub/b.py", 1)])
        r = run(self.ws.search(r"crlf$"))
        self.assertEqual([(m.path, m.line) for m in r], [("crlf.txt", 2)])
        r = run(self.ws.search(r"TODO\s*\Z"))  # per line: no prefilter for \Z
        self.assertEqual([m.path for m in r], ["latin1.txt"])
        with self.assertRaises(WorkspaceEscape):
            run(self.ws.search("TODO", "out_link"))
        self.assertEqual(len(run(self.ws.search("nothing-matches-this"))), 0)
        self.assertIn("no matches", str(run(self.ws.search("nothing-matches-this"))))

    def test_long_lines_are_cut(self):
        write(self.p("long.txt"), "needle " + "x" * 5000 + "\n")
        (m,) = run(self.ws.search("needle", "long.txt"))
        self.assertLessEqual(len(m.text), 1001)


class DeleteTest(WorkspaceCase):
    def test_file_symlink_and_dirs(self):
        write(self.p("f.txt"), "x")
        run(self.ws.delete("f.txt"))
        self.assertFalse(os.path.exists(self.p("f.txt")))
        os.symlink(os.path.join(self.outside, "secret.txt"), self.p("link"))
        run(self.ws.delete("link"))  # the link goes, never its target
        self.assertFalse(os.path.lexists(self.p("link")))
        self.assertTrue(os.path.exists(os.path.join(self.outside, "secret.txt")))
        os.symlink(self.outside, self.p("dlink"))
        run(self.ws.delete("dlink/"))
        self.assertTrue(os.path.isdir(self.outside))
        os.makedirs(self.p("empty"))
        run(self.ws.delete("empty"))
        write(self.p("full", "x.txt"), "x")
        with self.assertRaisesRegex(OSError, "recursive=True"):
            run(self.ws.delete("full"))
        run(self.ws.delete("full", recursive=True))
        self.assertFalse(os.path.exists(self.p("full")))
        with self.assertRaises(FileNotFoundError):
            run(self.ws.delete("missing"))

    def test_refusals(self):
        for path in (".", "", "a/..", self.root):
            with self.subTest(path=path):
                with self.assertRaises(PermissionError):
                    run(self.ws.delete(path))
        os.symlink(self.outside, self.p("out"))
        for path in ("../outside/secret.txt", "out/secret.txt", os.path.join(self.outside, "secret.txt")):
            with self.subTest(path=path):
                with self.assertRaises(WorkspaceEscape):
                    run(self.ws.delete(path))
        self.assertTrue(os.path.exists(os.path.join(self.outside, "secret.txt")))


class ModuleLevelTest(unittest.TestCase):
    def test_prelude_names(self):
        self.assertEqual(klbr.workspace.PRELUDE_NAMES, ("open_file", "ls", "search", "delete", "run"))
        for name in klbr.workspace.PRELUDE_NAMES:
            self.assertTrue(asyncio.iscoroutinefunction(getattr(klbr.workspace, name)), name)

    def test_default_workspace_is_resolved_once(self):
        from klbr import _sdk
        old_env, old_default = os.environ.get("KLBR_WORKSPACE"), _sdk._default_workspace
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d, True)
        try:
            _sdk._default_workspace = None
            os.environ["KLBR_WORKSPACE"] = d
            ws = run(klbr.workspace.current())
            self.assertEqual(ws.root, os.path.realpath(d))
            os.environ["KLBR_WORKSPACE"] = "/"
            self.assertIs(run(klbr.workspace.current()), ws)
        finally:
            _sdk._default_workspace = old_default
            if old_env is None:
                os.environ.pop("KLBR_WORKSPACE", None)
            else:
                os.environ["KLBR_WORKSPACE"] = old_env

    def test_no_effect_scope_outside_a_worker(self):
        with self.assertRaises(NoExecutionScope):
            run(klbr.local.send("hi"))
        with self.assertRaises(NoExecutionScope):
            run(klbr.host.request("x.y", {}))
        with self.assertRaises(NoExecutionScope):
            run(klbr.runtime.wait(10))
        with self.assertRaises(NoExecutionScope):
            run(klbr.workspace.run(["true"]))

    def test_wait_validation_comes_first(self):
        for bad in (-1, 0, -0.0, math.nan, math.inf, -math.inf, 600.5, 10 ** 6):
            with self.subTest(seconds=bad):
                with self.assertRaises(ValueError):
                    run(klbr.runtime.wait(bad))
        for bad in ("5", True, None.__class__, [1]):
            with self.subTest(seconds=bad):
                with self.assertRaises(TypeError):
                    run(klbr.runtime.wait(bad))
        with self.assertRaises(TypeError):
            run(klbr.runtime.wait(5, reason=3))
        with self.assertRaises(TypeError):
            run(klbr.local.send(b"bytes"))
        with self.assertRaises(TypeError):
            run(klbr.host.request("", {}))
        with self.assertRaises(TypeError):
            run(klbr.host.request("op", [1]))

    def test_errors_are_exported(self):
        self.assertEqual(klbr.HostError("stale", "gone").code, "stale")
        self.assertEqual(str(klbr.HostError("stale", "gone")), "stale: gone")
        self.assertFalse(issubclass(klbr.Yielded, Exception))
        self.assertEqual(klbr.__version__, "0.1.0")

    def test_run_result_from_reply(self):
        from klbr.workspace import RunResult
        r = RunResult.from_reply({"exit_code": 0, "stdout_b64": "aGkK", "stderr_b64": "", "truncated": False,
                                  "timed_out": False})
        self.assertEqual((r.exit_code, r.stdout, r.stderr, r.ok), (0, b"hi\n", b"", True))
        self.assertIn("hi", repr(r))
        with self.assertRaises(ValueError):
            RunResult.from_reply({"stdout_b64": "***"})


if __name__ == "__main__":
    unittest.main()

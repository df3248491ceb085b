"""The tree as the host will publish it: only .md/.py/.toml/.json/.scm files, no
symlinks, no bytecode, nothing over 256 KiB, plain file names; every source
parses. The rules mirror klbr-core's publisher (internal/behavior), which
refuses a tree that breaks them."""

import json
import os
import re
import stat
import tomllib
import unittest

from tests import ROOT

ALLOWED = (".md", ".py", ".toml", ".json", ".scm")   # .scm: tree-sitter queries (queries/)
FILE_MAX = 256 * 1024
TREE_MAX = 8 << 20
INSTRUCTIONS_MAX = 8 * 1024   # read on every turn: keep it small
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def not_behavior(name):
    """Entries the publisher skips: the Go file that embeds this tree in
    klbr-core, VCS and editor litter. Everything else is published."""
    return name.endswith(".go") or name in (".git", ".gitignore") or name.endswith("~")


def walk():
    """Every published path below ROOT (relative), directories included;
    never follows links."""
    for dirpath, dirnames, filenames in os.walk(ROOT, followlinks=False):
        dirnames[:] = [d for d in dirnames if not not_behavior(d)]
        for name in sorted(dirnames + filenames):
            if not not_behavior(name):
                yield os.path.relpath(os.path.join(dirpath, name), ROOT)


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


class TreeTest(unittest.TestCase):
    def test_files_are_publishable(self):
        paths = list(walk())
        self.assertIn("soul.md", paths)
        total = 0
        for rel in paths:
            with self.subTest(path=rel):
                st = os.lstat(os.path.join(ROOT, rel))
                self.assertFalse(stat.S_ISLNK(st.st_mode), f"{rel} is a symlink")
                name = os.path.basename(rel)
                self.assertNotEqual(name, "__pycache__",
                                    f"{rel}: bytecode in the tree; delete it and run the tests "
                                    "with PYTHONDONTWRITEBYTECODE=1")
                self.assertTrue(NAME.fullmatch(name) and ".." not in name,
                                f"{rel}: not an allowed file name")
                if stat.S_ISDIR(st.st_mode):
                    continue
                self.assertTrue(stat.S_ISREG(st.st_mode), f"{rel} is not a regular file")
                self.assertTrue(name.endswith(ALLOWED), f"{rel}: only {ALLOWED} files are allowed")
                self.assertLessEqual(st.st_size, FILE_MAX, f"{rel} is over 256 KiB")
                total += st.st_size
        self.assertLessEqual(total, TREE_MAX, "the tree is over 8 MiB")

    def test_sources_parse(self):
        for rel in walk():
            path = os.path.join(ROOT, rel)
            if os.path.isdir(path) or not rel.endswith(ALLOWED):
                continue   # test_files_are_publishable reports anything else
            with self.subTest(path=rel):
                with open(path, "rb") as f:
                    data = f.read()
                text = data.decode("utf-8")   # every file is UTF-8 text
                if rel.endswith(".py"):
                    compile(text, rel, "exec", dont_inherit=True)   # compiles; writes nothing
                elif rel.endswith(".toml"):
                    tomllib.loads(text)
                elif rel.endswith(".json"):
                    json.loads(text)
                elif rel.endswith(".scm"):
                    self.assertTrue(rel.startswith("queries/") and rel.count("/") == 2,
                                    f"{rel}: a query lives at queries/<language>/<name>.scm")
                    self.assertEqual(text.count("(") - text.count("\\("), text.count(")") - text.count("\\)"),
                                     f"{rel}: unbalanced parentheses")

    def test_documents(self):
        for rel in ("soul.md", "instructions.md", "README.md"):
            with self.subTest(path=rel):
                self.assertTrue(read(rel).strip(), f"{rel} is empty")
        instructions = read("instructions.md")
        self.assertLessEqual(len(instructions.encode()), INSTRUCTIONS_MAX)
        for phrase in ("python(code)", "scratchpad", "local.send", "held", "print(",
                       "runtime.wait", "preempt", "silent",
                       "open_file", "ls(", "search(", "delete(", "run(", "klbr.skills",
                       "help(skills.", "rollback", "refused"):
            with self.subTest(phrase=phrase):
                self.assertIn(phrase, instructions)


if __name__ == "__main__":
    unittest.main()

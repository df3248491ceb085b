"""klbr.code in a real workbench runner, against the test host peer: what
code.open sends to the host, how it builds symbols from the host's query
matches, and patches on real files. (The host's real parser is exercised
end to end by internal/daemon/code_e2e_test.go.)"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peer  # noqa: E402

SRC = "class A:\n    def run(self):\n        return 1\n\ndef run():\n    return 'ü'\n"


def span(text, sub, nth=0):
    data = text.encode()
    start = -1
    for _ in range(nth + 1):
        start = data.index(sub.encode(), start + 1)
    end = start + len(sub.encode())
    row = data.count(b"\n", 0, start)
    col = start - (data.rfind(b"\n", 0, start) + 1)
    erow = data.count(b"\n", 0, end)
    ecol = end - (data.rfind(b"\n", 0, end) + 1)
    return {"start_byte": start, "end_byte": end, "start": [row, col], "end": [erow, ecol]}


def cap(name, node, text, sub, nth=0):
    return dict(span(text, sub, nth), name=name, node=node)


def parse_reply(text):
    cls = "class A:\n    def run(self):\n        return 1"
    meth = "def run(self):\n        return 1"
    fn = "def run():\n    return 'ü'"
    matches = [
        {"pattern": 2, "captures": [cap("definition.class", "class_definition", text, cls), cap("name", "identifier", text, "A"),
                                    cap("body", "block", text, "def run(self):\n        return 1")]},
        {"pattern": 0, "captures": [cap("definition.function", "function_definition", text, meth),
                                    cap("name", "identifier", text, "run"), cap("body", "block", text, "return 1")]},
        {"pattern": 0, "captures": [cap("definition.function", "function_definition", text, fn),
                                    cap("name", "identifier", text, "run", 1), cap("body", "block", text, "return 'ü'")]},
    ]
    names, nodes = [], []

    def idx(table, v):
        if v not in table:
            table.append(v)
        return table.index(v)
    compact = [[m["pattern"], [[idx(names, c["name"]), idx(nodes, c["node"]), c["start_byte"], c["end_byte"],
                                c["start"][0], c["start"][1], c["end"][0], c["end"][1]] for c in m["captures"]]]
               for m in matches]
    return {"ok": True, "result": {"language": "python", "grammar": "tree-sitter-python v0.25.0", "detected_by": "extension .py",
                                   "errors": [], "root_node": "module", "bytes": len(text.encode()),
                                   "queries": [{"name": "symbols", "from": "queries/python/symbols.scm",
                                                "pattern_lines": [3, 9, 14], "capture_names": names,
                                                "node_kinds": nodes, "matches": compact}]}}


class CodeTest(peer.HostRequestsTest):
    def write(self, name, text, mode=0o644):
        path = os.path.join(self.tmp, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(path, mode)
        return path

    def test_prelude_binds_code_and_help_is_useful(self):
        v, _ = self.value("import klbr\n(code is klbr.code, 'replace_declaration' in code.__doc__, "
                          "'symlink' in code.SYMLINK_POLICY)", [])
        self.assertEqual(v, "(True, True, True)")

    def test_open_sends_the_source_and_builds_symbols(self):
        self.write("a.py", SRC)
        v, reqs = self.value(
            "src = await code.open('a.py')\n"
            "m = src.symbols.exact('A.run').one()\n"
            "(src.symbols.names(), m.kind, m.container, m.query, m.line, m.end_line, m.body, repr(src)[:40])",
            [parse_reply(SRC)])
        self.assertEqual(reqs, [("code.parse", {"path": "a.py", "text": SRC, "queries": ["symbols"]})])
        self.assertEqual(v, "(['A', 'A.run', 'run'], 'method', 'A', 'queries/python/symbols.scm:3', 2, 3, "
                            "'return 1', '<Source a.py python (extension .py) 73 b')")

    def test_ambiguous_and_missing_are_different_errors(self):
        self.write("a.py", SRC)
        v, _ = self.value(
            "src = await code.open('a.py')\n"
            "out = []\n"
            "for name in ('run', 'rnu'):\n"
            "    try:\n"
            "        src.symbols.exact(name).one()\n"
            "    except code.CodeError as e:\n"
            "        out.append((type(e).__name__, getattr(e, 'suggestions', None), len(getattr(e, 'candidates', []))))\n"
            "out", [parse_reply(SRC)])
        self.assertEqual(v, "[('AmbiguousSymbol', None, 2), ('SymbolNotFound', ['run'], 0)]")

    def test_patch_diff_apply_and_stale(self):
        path = self.write("a.py", SRC, 0o640)
        v, _ = self.value(
            "src = await code.open('a.py')\n"
            "fn = src.symbols.exact('run').kind('function').one()\n"
            "p = fn.replace_body(\"return 'é'\")\n"
            "stale = fn.replace_declaration('def run(): pass')\n"
            "d = p.diff\n"
            "a = await p.apply()\n"
            "try:\n"
            "    await stale.apply()\n"
            "    err = None\n"
            "except code.StalePatch as e:\n"
            "    err = e.path\n"
            "(\"-    return 'ü'\" in d, \"+    return 'é'\" in d, a.written, err)", [parse_reply(SRC)])
        self.assertEqual(v, "(True, True, ['a.py'], 'a.py')")
        with open(path, encoding="utf-8") as f:
            self.assertEqual(f.read(), SRC.replace("return 'ü'", "return 'é'"))
        self.assertEqual(os.stat(path).st_mode & 0o7777, 0o640)

    def test_host_errors_map_to_their_own_classes(self):
        self.write("a.py", SRC)
        outcome, _ = self.cell(
            "src = await code.open('a.py')\nawait src.query('(function_declaration) @f')",
            [parse_reply(SRC), {"ok": False, "error": {"code": "query_error", "message": "python query (raw) at 1:2: "
                                                      "the grammar has no node type \"function_declaration\""}}])
        self.assertEqual(outcome["error"]["type"], "klbr.code.QueryError")
        self.write("x.txt", "hi\n")
        outcome, _ = self.cell("await code.open('x.txt')",
                               [{"ok": False, "error": {"code": "unsupported_language", "message": "cannot tell"}}])
        self.assertEqual(outcome["error"]["type"], "klbr.code.UnsupportedLanguage")
        msg = ("code.parse: parsing 778245 bytes needed over 128 MiB of the host's memory and was stopped; "
               "the source is pathological: read it with open_file instead")
        outcome, _ = self.cell("await code.open('a.py')", [{"ok": False, "error": {"code": "parse_limit", "message": msg}}])
        self.assertEqual(outcome["error"]["type"], "klbr.code.ParseLimit")
        self.assertIn("open_file", outcome["error"]["message"])

    def test_a_language_without_a_grammar_is_text_only(self):
        nix = "{ a = 1;\n  b = \"é\";\n  c = 1;\n}\n"
        path = self.write("flake.nix", nix)
        no_grammar = {"ok": False, "error": {"code": "no_grammar", "message": "no grammar: nix files are text only"}}
        text = {"ok": True, "result": {"language": "nix", "grammar": "no grammar", "detected_by": "extension .nix",
                                       "errors": [], "queries": [], "bytes": len(nix.encode())}}
        v, reqs = self.value(
            "src = await code.open('flake.nix')\n"
            "try:\n"
            "    src.symbols\n"
            "    sym = 'symbols!'\n"
            "except code.NoGrammar as e:\n"
            "    sym = str(e)\n"
            "try:\n"
            "    src.replace('= 1;', '= 2;')\n"
            "    amb = None\n"
            "except code.TextNotFound as e:\n"
            "    amb = (e.found, e.lines)\n"
            "try:\n"
            "    src.replace('nope', 'x')\n"
            "    none = None\n"
            "except code.TextNotFound as e:\n"
            "    none = e.found\n"
            "p = src.replace('\"é\"', '\"ü\"')\n"
            "await p.apply()\n"
            "(src.text_only, sym, amb, none, 'text only' in repr(src), isinstance(code.NoGrammar('x'), code.UnsupportedLanguage))",
            [no_grammar, text])
        self.assertEqual(v, "(True, 'no grammar: nix files are text only', (2, [1, 3]), 0, True, True)")
        self.assertEqual(reqs[0][1]["queries"], ["symbols"])
        self.assertNotIn("queries", reqs[1][1])
        with open(path, encoding="utf-8") as f:
            self.assertEqual(f.read(), nix.replace("é", "ü"))

    def test_invalid_utf8_goes_as_b64_and_paths_stay_in_the_workspace(self):
        with open(os.path.join(self.tmp, "bin.sh"), "wb") as f:
            f.write(b"echo \xff\n")
        reply = {"ok": True, "result": {"language": "bash", "grammar": "g", "errors": [], "queries": []}}
        outcome, reqs = self.cell("await code.open('bin.sh')", [{"ok": False, "error": {"code": "missing_query", "message": "m"}}, reply])
        self.assertEqual(outcome["status"], "ok", outcome)
        self.assertEqual(reqs[0][1]["b64"], "ZWNobyD/Cg==")
        outcome, reqs = self.cell("await code.open('../etc/passwd')", [])
        self.assertEqual(outcome["error"]["type"], "klbr.WorkspaceEscape")
        self.assertEqual(reqs, [])


if __name__ == "__main__":
    unittest.main()

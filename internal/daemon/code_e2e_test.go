package daemon

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/localclient"
)

// codeLab is a klbr-core child whose workspace holds the fixture
// repositories of internal/code/testdata/repos; cells run through the
// control socket, as the operator's `klbr-core exec` does.
type codeLab struct {
	t  testing.TB
	c  *localclient.Client
	ws string
	d  *child
}

func startCodeLab(t testing.TB) *codeLab {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		citest.SkipOrFail(t, "python3 is missing")
	}
	data, env := instance(t)
	ws := filepath.Join(filepath.Dir(data), "ws")
	if err := os.CopyFS(ws, os.DirFS("../code/testdata/repos")); err != nil {
		t.Fatal(err)
	}
	env = append(env, "KLBR_WORKSPACE="+ws, "PATH="+kernelDir(t)+":"+os.Getenv("PATH"))
	l := &codeLab{t: t, ws: ws, d: startChildWithoutCgroups(t, nil, env...)}
	l.c = localclient.New(filepath.Join(data, "control.sock"))
	t.Cleanup(l.c.Close)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := l.c.Status(t.Context()); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon does not answer:\n%s", l.d)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return l
}

// cell runs code and returns its value; a cell that fails fails the test.
func (l *codeLab) cell(code string) string {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(l.t.Context(), 6*time.Minute)
	defer cancel()
	res, err := l.c.Exec(ctx, "default", api.ExecRequest{Code: code, TimeoutSeconds: 300})
	if err != nil {
		l.t.Fatalf("exec: %v", err)
	}
	o := res.Outcome
	if o.Status != "ok" {
		msg := ""
		if o.Error != nil {
			msg = o.Error.Type + ": " + o.Error.Message + "\n" + o.Error.Traceback
		}
		var out strings.Builder
		for _, c := range o.Output.Preview {
			out.WriteString(c.Data)
		}
		l.t.Fatalf("cell %s: %s\noutput:\n%s\ncode:\n%s", o.Status, msg, out.String(), code)
	}
	if o.Value == nil {
		return ""
	}
	return *o.Value
}

func tool(t *testing.T, name string, more ...string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, p := range more {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	citest.SkipOrFail(t, name+" is not installed")
	return ""
}

// Realistic edits on four fixture repositories, end to end from cells:
// find the buggy symbol, replace its declaration, show the diff, apply it,
// and run the repository's own tests through `run`, failing before and
// passing after.
func TestCodeEditsFixtureRepositories(t *testing.T) {
	l := startCodeLab(t)
	python := tool(t, "python3")
	t.Run("python", func(t *testing.T) {
		l.t = t
		got := l.cell(fmt.Sprintf(`
src = await code.open("python/calc/stats.py")
sym = src.symbols.exact("mean").one()
before = await run([%[1]q, "-m", "unittest", "-q"], cwd="python", env={"PYTHONDONTWRITEBYTECODE": "1"})
patch = sym.replace_declaration('''def mean(values):
    """The arithmetic mean of values."""
    if not values:
        raise ValueError("mean of nothing")
    return sum(values) / len(values)''')
print(patch.diff)
applied = await patch.apply()
after = await run([%[1]q, "-m", "unittest", "-q"], cwd="python", env={"PYTHONDONTWRITEBYTECODE": "1"})
refs = await code.references("mean", path="python")
kinds = sorted({(r.path, r.kind) for r in refs})
(before.exit_code, after.exit_code, applied.written, sym.kind, sym.line, sym.end_line,
 "-    return sum(values) / (len(values) - 1)" in patch.diff, "best-effort" in repr(refs), kinds)`, python))
		want := "(1, 0, ['python/calc/stats.py'], 'function', 4, 8, True, True, " +
			"[('python/calc/stats.py', 'call'), ('python/calc/stats.py', 'definition:function'), ('python/calc/stats.py', 'text'), " +
			"('python/tests/test_stats.py', 'call'), ('python/tests/test_stats.py', 'name'), ('python/tests/test_stats.py', 'text')])"
		if got != want {
			t.Fatalf("python edit:\n got %s\nwant %s", got, want)
		}
	})
	t.Run("go", func(t *testing.T) {
		l.t = t
		goTool := tool(t, "go", "/usr/local/go/bin/go")
		got := l.cell(fmt.Sprintf(`
env = {"GOFLAGS": "-count=1", "GOTOOLCHAIN": "local", "GOPROXY": "off", "GOWORK": "off", "CGO_ENABLED": "0"}
src = await code.open("go/shapes.go")
sym = src.symbols.exact("Rect.Area").one()
before = await run([%[1]q, "test", "./..."], cwd="go", env=env, timeout=300)
patch = sym.replace_declaration("func (r Rect) Area() int {\n\treturn r.W * r.H\n}")
print(patch.diff)
applied = await patch.apply()
after = await run([%[1]q, "test", "./..."], cwd="go", env=env, timeout=300)
assert after.exit_code == 0, after
(before.exit_code, after.exit_code, applied.written, sym.kind, sym.container, sym.query.startswith("queries/go/symbols.scm:"))`,
			goTool))
		if want := "(1, 0, ['go/shapes.go'], 'method', 'Rect', True)"; got != want {
			t.Fatalf("go edit:\n got %s\nwant %s", got, want)
		}
	})
	t.Run("rust", func(t *testing.T) {
		l.t = t
		home, _ := os.UserHomeDir()
		cargo := tool(t, "cargo", filepath.Join(home, ".cargo", "bin", "cargo"))
		got := l.cell(fmt.Sprintf(`
env = {"CARGO_TARGET_DIR": %[2]q, "CARGO_NET_OFFLINE": "true", "PATH": %[3]q}
src = await code.open("rust/src/lib.rs")
sym = src.symbols.exact("Agent.run_turn").one()
before = await run([%[1]q, "test", "--offline", "-q"], cwd="rust", env=env, timeout=300)
patch = sym.replace_declaration("pub fn run_turn(&mut self) -> u32 {\n    self.turns += 1;\n    self.turns\n}", dedented=True)
print(patch.diff)
applied = await patch.apply()
after = await run([%[1]q, "test", "--offline", "-q"], cwd="rust", env=env, timeout=300)
assert after.exit_code == 0, after
(before.exit_code, after.exit_code, applied.written, sym.kind, sym.qualname, "+        self.turns += 1;" in patch.diff)`,
			cargo, filepath.Join(l.ws, ".cargo-target"), filepath.Dir(cargo)+":"+os.Getenv("PATH")))
		if want := "(101, 0, ['rust/src/lib.rs'], 'method', 'Agent.run_turn', True)"; got != want {
			t.Fatalf("rust edit:\n got %s\nwant %s", got, want)
		}
	})
	t.Run("typescript", func(t *testing.T) {
		l.t = t
		tsc := tool(t, "tsc")
		node := tool(t, "node")
		got := l.cell(fmt.Sprintf(`
src = await code.open("typescript/src/cart.ts")
try:
    src.symbols.exact("total").one()
    ambiguous = None
except code.AmbiguousSymbol as e:
    ambiguous = sorted(s.qualname for s in e.candidates)
sym = src.symbols.exact("total").kind("function").one()
build = await run([%[1]q, "-p", "."], cwd="typescript", timeout=300)
assert build.exit_code == 0, build
before = await run([%[2]q, "out/cart.test.js"], cwd="typescript")
patch = sym.replace_declaration("export function total(items: Item[]): number {\n  return items.reduce((sum, item) => sum + item.cents, 0);\n}")
print(patch.diff)
applied = await patch.apply()
build = await run([%[1]q, "-p", "."], cwd="typescript", timeout=300)
assert build.exit_code == 0, build
after = await run([%[2]q, "out/cart.test.js"], cwd="typescript")
(ambiguous, before.exit_code, after.exit_code, applied.written, sym.text.startswith("export function total"))`, tsc, node))
		if want := "(['Cart.total', 'total'], 1, 0, ['typescript/src/cart.ts'], True)"; got != want {
			t.Fatalf("typescript edit:\n got %s\nwant %s", got, want)
		}
	})
}

// Unicode ranges, and each failure its own clear error.
func TestCodeRangesAndErrors(t *testing.T) {
	l := startCodeLab(t)
	check := func(name, code string) {
		t.Run(name, func(t *testing.T) {
			l.t = t
			if got := l.cell(code + "\n'ok'"); got != "'ok'" {
				t.Fatalf("%s: %s", name, got)
			}
		})
	}
	check("unicode", `
text = "# 日本語 — ünïcödé 🎉\nS = 'Größe'\n\ndef größe(x):\n    return 'ü' * x\n\ndef after():\n    return '🎉'\n"
await (await open_file("u/uni.py")).write(text)
src = await code.open("u/uni.py")
data = text.encode()
s = src.symbols.exact("after").one()
assert s.start_byte == data.index(b"def after") and s.start_byte != text.index("def after"), s
assert s.text == "def after():\n    return '🎉'", repr(s.text)
assert (s.line, s.end_line) == (7, 8), (s.line, s.end_line)
g = src.symbols.exact("größe").one()
n = "größe".encode()
assert g.name_range == (data.index(n), data.index(n) + len(n)), g.name_range
await s.replace_body("return 'ü🎉'").apply()
assert open("u/uni.py", encoding="utf-8").read() == text.replace("return '🎉'", "return 'ü🎉'")
src = await code.open("u/uni.py")
await src.symbols.exact("größe").one().replace_declaration("def größe(x):\n    return 'ß' * x").apply()
want = text.replace("return '🎉'", "return 'ü🎉'").replace("'ü' * x", "'ß' * x")
assert open("u/uni.py", encoding="utf-8").read() == want`)
	check("ambiguous and missing", `
await (await open_file("u/dup.py")).write("class A:\n    def run(self):\n        pass\n\nclass B:\n    def run(self):\n        pass\n")
src = await code.open("u/dup.py")
try:
    src.symbols.exact("run").one()
    raise AssertionError("no error for an ambiguous name")
except code.AmbiguousSymbol as e:
    assert sorted(c.qualname for c in e.candidates) == ["A.run", "B.run"], e.candidates
    assert "A.run" in str(e) and "B.run" in str(e), str(e)
    assert not isinstance(e, code.SymbolNotFound)
assert src.symbols.exact("B.run").one().qualname == "B.run"
try:
    src.symbols.exact("runn").one()
    raise AssertionError("no error for a missing name")
except code.SymbolNotFound as e:
    assert "run" in e.suggestions and not isinstance(e, code.AmbiguousSymbol), e
assert len(src.symbols.match("^[ab]\\.")) == 2`)
	check("stale patch", `
f = await open_file("u/stale.py")
await f.write("def f():\n    return 1\n")
src = await code.open("u/stale.py")
patch = src.symbols.exact("f").one().replace_body("return 2")
await f.write("def f():\n    return 10\n")
try:
    await patch.apply()
    raise AssertionError("a stale patch applied")
except code.StalePatch as e:
    assert e.expected == src.sha256 and e.actual != src.sha256, e
assert f.read() == "def f():\n    return 10\n"`)
	check("overlapping edits and snapshots", `
await (await open_file("u/ov.py")).write("def f():\n    return 1\n\ndef g():\n    return 2\n")
src = await code.open("u/ov.py")
f = src.symbols.exact("f").one()
try:
    f.replace_body("return 3") + f.replace_declaration("def f(): return 4")
    raise AssertionError("overlapping edits combined")
except code.OverlappingEdits as e:
    assert "overlap" in str(e)
both = f.replace_body("return 3") + src.symbols.exact("g").one().replace_body("return 4")
await both.apply()
assert open("u/ov.py").read() == "def f():\n    return 3\n\ndef g():\n    return 4\n"
src2 = await code.open("u/ov.py")
try:
    f.replace_body("return 5") + src2.symbols.exact("g").one().replace_body("return 6")
    raise AssertionError("patches of two snapshots combined")
except code.ConflictingSnapshots:
    pass`)
	check("queries a language lacks", `
src = await code.open("u/q.py", ) if False else None
await (await open_file("u/q.py")).write("def f():\n    g()\n")
src = await code.open("u/q.py")
r = await src.query("(call function: (identifier) @fn)")
assert [c.text for c in r.captures("fn")] == ["g"], r
try:
    await src.query("(function_declaration) @f")
    raise AssertionError("a node type python lacks gave a result")
except code.QueryError as e:
    assert "function_declaration" in str(e), e
try:
    await src.query("tests")
    raise AssertionError("a query the release lacks gave a result")
except code.MissingQuery as e:
    assert "queries/python/tests.scm" in str(e), e
await (await open_file("u/x.nix")).write("{ a = 1; f = x: x; }\n")
nix = await code.open("u/x.nix")
assert nix.language == "nix" and nix.text_only and not nix.errors, nix
for ask in (lambda: nix.symbols, lambda: nix.query("references")):
    try:
        r = ask()
        if hasattr(r, "__await__"):
            await r
        raise AssertionError("a text-only language answered a structural request")
    except code.NoGrammar as e:
        assert "text only" in str(e) and "src.replace" in str(e), e
await nix.replace("a = 1;", "a = 2;").apply()
assert open("u/x.nix").read() == "{ a = 2; f = x: x; }\n"
langs = {l["name"]: l for l in (await code.languages())["languages"]}
assert langs["nix"]["text_only"] and not langs["nix"]["queries"], langs["nix"]
await (await open_file("u/notes.txt")).write("hello\n")
try:
    await code.open("u/notes.txt")
    raise AssertionError("a text file parsed")
except code.UnsupportedLanguage:
    pass
sh = await code.open("u/notes.txt", language="bash")
assert sh.language == "bash" and sh.detected_by == "argument"`)
	check("partially invalid source", `
await (await open_file("u/bad.py")).write("def ok():\n    return 1\n\ndef broken(:\n    pass\n\nclass Fine:\n    def m(self):\n        return 2\n")
src = await code.open("u/bad.py")
assert src.errors and src.errors[0].line == 4, src.errors
names = src.symbols.names()
assert "ok" in names and "Fine" in names and "Fine.m" in names, names
assert "parse errors" in repr(src)`)
	check("permissions, symlinks, partial multi-file apply", `
import os
await (await open_file("u/tool.py")).write("#!/usr/bin/env python3\ndef main():\n    return 0\n")
os.chmod("u/tool.py", 0o751)
os.symlink("tool.py", "u/link.py")
src = await code.open("u/link.py")
assert src.abspath.endswith("/u/tool.py") and src.provenance["via_symlink"], src.provenance
await src.symbols.exact("main").one().replace_body("return 1").apply()
assert os.path.islink("u/link.py") and os.stat("u/tool.py").st_mode & 0o7777 == 0o751
assert open("u/tool.py").read().endswith("return 1\n")
src = await code.open("u/link.py")
p = src.symbols.exact("main").one().replace_body("return 2")
await (await open_file("u/other.py")).write(open("u/tool.py").read())
os.remove("u/link.py"); os.symlink("other.py", "u/link.py")
try:
    await p.apply()
    raise AssertionError("applied through a repointed link")
except code.UnrelatedFile:
    pass
assert "symlink" in code.SYMLINK_POLICY
await (await open_file("u/a.py")).write("def a():\n    return 1\n")
await (await open_file("u/b.py")).write("def b():\n    return 1\n")
pa = (await code.open("u/a.py")).symbols.exact("a").one().replace_body("return 2")
pb = (await code.open("u/b.py")).symbols.exact("b").one().replace_body("return 2")
import klbr._sdk as sdk
real = sdk._atomic_write
def failing(path, data):
    if path.endswith("/b.py"):
        raise OSError(28, "No space left on device")
    return real(path, data)
sdk._atomic_write = failing
try:
    await (pa + pb).apply()
    raise AssertionError("no error")
except code.PartialApply as e:
    assert (e.written, e.failed, e.not_written) == (["u/a.py"], "u/b.py", []), e
finally:
    sdk._atomic_write = real
assert open("u/a.py").read().endswith("return 2\n") and open("u/b.py").read().endswith("return 1\n")`)
}

// A query file added in a draft release changes what symbols finds once
// the release is active: no host rebuild, no host change.
func TestCodeQueryFromDraftRelease(t *testing.T) {
	l := startCodeLab(t)
	prep := `
await (await open_file("u/attrs.py")).write("class Config:\n    retries = 3\n    def load(self):\n        pass\n")
src = await code.open("u/attrs.py")
`
	if got := l.cell(prep + `(src.symbols.names(), len(src.symbols.exact("Config.retries")))`); got != "(['Config', 'Config.load'], 0)" {
		t.Fatalf("before: %s", got)
	}
	got := l.cell(`
d = await behavior.draft()
q = d.read("queries/python/symbols.scm")
await d.write("queries/python/symbols.scm", q + "\n; Class attributes.\n(class_definition\n  body: (block\n    (expression_statement\n      (assignment left: (identifier) @name)) @definition.attribute))\n")
r = await behavior.publish(d)
a = await behavior.activate(r.release, reason="class attributes as symbols")
(r.kind, a.kind)`)
	if got != "('workbench', 'workbench')" {
		t.Fatalf("publish and activate: %s", got)
	}
	got = l.cell(prep + `s = src.symbols.exact("Config.retries").one()
(src.symbols.names(), s.kind, s.query)`)
	if !strings.HasPrefix(got, "(['Config', 'Config.retries', 'Config.load'], 'attribute', 'queries/python/symbols.scm:") {
		t.Fatalf("after activation: %s", got)
	}
}

// BenchmarkCodeOpen10kLines measures code.open (read, hash, the host's
// parse and symbols query, the symbol table in Python) on a 10,000-line
// file from a cell, against open_file (read and decode only) of the same
// file, side by side. Each op is one call inside one cell: the cell's own
// round trip is amortized over b.N calls.
func BenchmarkCodeOpen10kLines(b *testing.B) {
	l := startCodeLab(b)
	l.cell(`
blocks = []
for i in range(1000):
    blocks.append(f"class C{i}:\n    \"\"\"Doc {i}.\"\"\"\n\n    def m{i}(self, x):\n        y = x * {i}\n        return y + 1\n\ndef f{i}(a, b):\n    return C{i}().m{i}(a) - b\n\n")
await (await open_file("big/big.py")).write("".join(blocks))
blocks = []
for i in range(1000):
    blocks.append(f"type T{i} struct{{ A int }}\n\nfunc (t T{i}) M{i}(x int) int {{\n\ty := x * {i}\n\treturn y + t.A\n}}\n\nfunc F{i}(a, b int) int {{\n\treturn T{i}{{A: a}}.M{i}(b)\n}}\n")
await (await open_file("big/big.go")).write("package big\n\n" + "".join(blocks))
`)
	for _, file := range []string{"big/big.py", "big/big.go"} {
		for _, op := range []string{"code.open", "open_file"} {
			b.Run(file+"/"+op, func(b *testing.B) {
				call := "(await code.open(%q)).symbols"
				if op == "open_file" {
					call = "(await open_file(%q)).text"
				}
				got := l.cell(fmt.Sprintf("n = 0\nfor _ in range(%d):\n    n = len("+call+")\n"+
					"src = await code.open(%q)\n(n, src.bytes.count(b'\\n'), len(src.bytes), src.provenance['parse_us'], src.provenance['query_us'])",
					b.N, file, file))
				b.StopTimer()
				var n, lines, size, parseUS, queryUS int
				fmt.Sscanf(got, "(%d, %d, %d, %d, %d)", &n, &lines, &size, &parseUS, &queryUS)
				if lines < 10000 {
					b.Fatalf("%s has %d lines: %s", file, lines, got)
				}
				b.ReportMetric(float64(lines), "lines")
				b.ReportMetric(float64(size)/1024, "KiB")
				if op == "code.open" {
					b.ReportMetric(float64(n), "symbols")
					b.ReportMetric(float64(parseUS)/1000, "host-parse-ms")
					b.ReportMetric(float64(queryUS)/1000, "host-query-ms")
				}
			})
		}
	}
}

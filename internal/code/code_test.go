package code

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var behaviorTree = os.DirFS("../../behavior")

// defs lists "kind name" for every match of the symbols query.
func defs(t *testing.T, file string) ([]string, *Result, []byte) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("testdata", "src", file))
	if err != nil {
		t.Fatal(err)
	}
	l, how := Detect(file, src)
	if l == nil {
		t.Fatalf("%s: no language detected", file)
	}
	if !strings.HasPrefix(how, "extension ") {
		t.Fatalf("%s: detected by %q", file, how)
	}
	var c cache
	q, err := c.load(behaviorTree, "test", l, "symbols")
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	res, err := Parse(context.Background(), l, src, []*Query{q})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range res.Queries[0].Matches {
		kind, name := "", ""
		for _, c := range m.Captures {
			if k, ok := strings.CutPrefix(c.Name, "definition."); ok {
				kind = k
			}
			if c.Name == "name" {
				name = string(src[c.StartByte:c.EndByte])
			}
		}
		if kind == "" || name == "" {
			t.Errorf("%s: pattern %d matched without a definition or a name: %+v", file, m.Pattern, m.Captures)
		}
		out = append(out, kind+" "+name)
	}
	return out, res, src
}

func TestSymbolQueriesOfEveryLanguage(t *testing.T) {
	cases := map[string][]string{
		"sample.py":  {"variable LIMIT", "function greet", "class Greeter", "function shout"},
		"sample.go":  {"constant Größe", "variable registry", "struct Greeter", "interface Speaker", "type ID", "function New", "method Speak"},
		"sample.rs":  {"constant LIMIT", "struct Config", "enum Mode", "trait Speak", "function speak", "impl Config", "function new", "function fmt", "function run_turn", "macro twice", "module inner", "function helper"},
		"sample.ts":  {"interface Shape", "method area", "type Id", "enum Color", "class Circle", "function total", "function double", "variable VERSION", "module Geo", "function origin"},
		"sample.tsx": {"function Hello", "function Button", "class Panel", "method render"},
		"sample.js":  {"function add", "class Counter", "method inc", "function square", "variable legacy"},
		"sample.sh":  {"variable NAME", "variable LEVEL", "function greet", "function main"},
	}
	for file, want := range cases {
		t.Run(file, func(t *testing.T) {
			got, res, _ := defs(t, file)
			for _, w := range want {
				if !slices.Contains(got, w) {
					t.Errorf("%s: no %q among %q", file, w, got)
				}
			}
			if len(res.Errors) != 0 {
				t.Errorf("%s: a valid file has parse errors: %+v", file, res.Errors)
			}
		})
	}
}

func TestEveryLanguageHasASymbolsQuery(t *testing.T) {
	for _, l := range Languages() {
		if l.TextOnly {
			if qs := Available(behaviorTree, l.Name); len(qs) != 0 {
				t.Errorf("%s has no grammar, yet behavior/ has queries for it: %v", l.Name, qs)
			}
			continue
		}
		if !slices.Contains(Available(behaviorTree, l.Name), "symbols") {
			t.Errorf("%s has no %s in behavior/", l.Name, QueryFile(l.Name, "symbols"))
		}
		for _, name := range Available(behaviorTree, l.Name) {
			var c cache
			if _, err := c.load(behaviorTree, "test", l, name); err != nil {
				t.Errorf("%s/%s: %v", l.Name, name, err)
			}
		}
	}
}

func TestMultiByteRangesAreUTF8Bytes(t *testing.T) {
	_, res, src := defs(t, "sample.py")
	for _, m := range res.Queries[0].Matches {
		for _, c := range m.Captures {
			if c.Name == "name" && string(src[c.StartByte:c.EndByte]) == "greet" {
				// Row and byte column agree with the byte offset.
				lineStart := strings.LastIndexByte(string(src[:c.StartByte]), '\n') + 1
				if uint(c.StartByte)-uint(lineStart) != c.Start[1] {
					t.Fatalf("column %d, want %d", c.Start[1], c.StartByte-uint(lineStart))
				}
				if want := uint(strings.Count(string(src[:c.StartByte]), "\n")); c.Start[0] != want {
					t.Fatalf("row %d, want %d", c.Start[0], want)
				}
				return
			}
		}
	}
	t.Fatal("greet not found")
}

func TestPartiallyInvalidSourceKeepsValidSymbols(t *testing.T) {
	l, _ := Lookup("python")
	src := []byte("def ok():\n    return 1\n\ndef broken(:\n    pass\n\nclass Fine:\n    def m(self):\n        return 2\n")
	var c cache
	q, err := c.load(behaviorTree, "test", l, "symbols")
	if err != nil {
		t.Fatal(err)
	}
	res, err := Parse(context.Background(), l, src, []*Query{q})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Errors) == 0 {
		t.Fatal("no parse errors reported for invalid source")
	}
	var names []string
	for _, m := range res.Queries[0].Matches {
		for _, c := range m.Captures {
			if c.Name == "name" {
				names = append(names, string(src[c.StartByte:c.EndByte]))
			}
		}
	}
	for _, w := range []string{"ok", "Fine", "m"} {
		if !slices.Contains(names, w) {
			t.Errorf("valid symbol %q lost in partially invalid source; got %q", w, names)
		}
	}
	e := res.Errors[0]
	if e.Start[0] != 3 {
		t.Errorf("the first error is on row %d, want row 3 (def broken): %+v", e.Start[0], res.Errors)
	}
}

func TestQueryErrors(t *testing.T) {
	goLang, _ := Lookup("go")
	_, err := Compile(goLang, "raw", "raw", "(function_definition) @f")
	var qe *QueryError
	if !errors.As(err, &qe) || qe.Kind != "the grammar has no node type" || !strings.Contains(qe.Message, "function_definition") {
		t.Fatalf("a node type Go lacks: %v", err)
	}
	if _, err := Compile(goLang, "raw", "raw", "(function_declaration"); !errors.As(err, &qe) || qe.Kind != "invalid syntax" {
		t.Fatalf("bad syntax: %v", err)
	}
	bashLang, _ := Lookup("bash")
	var c cache
	_, err = c.load(behaviorTree, "test", bashLang, "references")
	if !errors.Is(err, ErrMissingQuery) || !strings.Contains(err.Error(), "queries/bash/references.scm") {
		t.Fatalf("a query bash lacks: %v", err)
	}
	if _, err := c.load(behaviorTree, "test", bashLang, "../x"); err == nil {
		t.Fatal("a query name with a path was accepted")
	}
}

// Queries that crash tree-sitter's C query parser are refused before it
// sees them; their harmless look-alikes still compile.
func TestQueriesThatCrashTheCParserAreRefused(t *testing.T) {
	l, _ := Lookup("python")
	for _, q := range []string{"name:(#0)", "name: (#eq? @a \"b\")", "(function_definition name: ; c\n ( #eq? @n \"x\"))",
		"(identifier)*+", "(M)*+0", "(identifier) ? *"} {
		var qe *QueryError
		if _, err := Compile(l, "raw", "raw", q); !errors.As(err, &qe) || qe.Kind != "refused" {
			t.Errorf("%q: %v", q, err)
		}
	}
	for _, q := range []string{`((identifier) @a (#eq? @a "name: (#x"))`, "; name: (#x)\n(identifier) @i", "(block (_)* @s)",
		"((identifier)+ @i (#eq? @i \"*+\"))", "(call arguments: (argument_list (_)? @first))",
		`(function_definition name: (identifier) @n (#match? @n "^t"))`} {
		q, err := Compile(l, "raw", "raw", q)
		if err != nil {
			t.Errorf("a valid query refused: %v", err)
			continue
		}
		q.Close()
	}
}

func TestDetect(t *testing.T) {
	for _, c := range []struct{ path, src, want, how string }{
		{"x.py", "", "python", "extension .py"},
		{"tool", "#!/usr/bin/env python3\nprint(1)\n", "python", "shebang python3"},
		{"tool", "#!/usr/bin/python3.12\n", "python", "shebang python3"},
		{"run", "#!/bin/bash\necho\n", "bash", "shebang bash"},
		{"run", "#!/usr/bin/env -S bash -e\n", "bash", "shebang bash"},
		{"App.TSX", "", "tsx", "extension .tsx"},
		{"README", "hello", "", ""},
	} {
		l, how := Detect(c.path, []byte(c.src))
		got := ""
		if l != nil {
			got = l.Name
		}
		if got != c.want || how != c.how {
			t.Errorf("Detect(%q) = %q, %q; want %q, %q", c.path, got, how, c.want, c.how)
		}
	}
}

func TestDecodeParseArgsBounds(t *testing.T) {
	big := strings.Repeat("x", MaxSourceBytes+1)
	for _, raw := range []string{
		`{}`, `{"text":"a","b64":"YQ=="}`, `{"b64":"!!"}`, `{"text":"` + big + `"}`,
		`{"text":"a","queries":["a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a"]}`,
		`{"text":"a","unknown":1}`,
	} {
		if _, _, err := DecodeParseArgs([]byte(raw)); err == nil {
			t.Errorf("accepted %.60s", raw)
		}
	}
	a, src, err := DecodeParseArgs([]byte(`{"path":"a.py","b64":"/w=="}`))
	if err != nil || a.Path != "a.py" || string(src) != "\xff" {
		t.Fatalf("b64 source: %v %q", err, src)
	}
}

// A .nix file is detected but has no grammar: it opens as text (no parse
// tree, no errors), and asking it for symbols or a query says why and what
// to use instead, never an empty result.
func TestNixIsTextOnly(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("testdata", "src", "sample.nix"))
	if err != nil {
		t.Fatal(err)
	}
	l, how := Detect("flake.nix", src)
	if l == nil || l.Name != "nix" || !l.TextOnly || how != "extension .nix" {
		t.Fatalf("detected %+v by %q", l, how)
	}
	res, err := Parse(context.Background(), l, src, nil)
	if err != nil || res.Language != "nix" || res.RootNode != "" || len(res.Errors) != 0 || res.Bytes != len(src) {
		t.Fatalf("text-only parse: %+v, %v", res, err)
	}
	var c cache
	_, err = c.load(behaviorTree, "test", l, "symbols")
	if !errors.Is(err, ErrNoGrammar) || !strings.Contains(err.Error(), "src.replace(old, new)") {
		t.Fatalf("symbols of nix: %v", err)
	}
	if _, err := Compile(l, "raw", "raw", "(identifier) @id"); !errors.Is(err, ErrNoGrammar) {
		t.Fatalf("a raw query of nix: %v", err)
	}
}

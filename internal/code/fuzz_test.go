package code

import (
	"context"
	"encoding/json"
	"testing"
)

// FuzzParseRequest feeds code.parse arguments from a cell through the
// decoder and, when they decode, through the parser and a raw query: no
// input may crash the host, and every range stays inside the source.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"path":"a.py","text":"def f(:\n  pass\n","raw":"(identifier) @id"}`,
		`{"language":"go","text":"package p\nfunc F() {","raw":"(function_declaration name: (identifier) @n)"}`,
		`{"language":"rust","b64":"Zm4gbWFpbigpIHsg8J+OiSB9","raw":"(ERROR) @e"}`,
		`{"language":"nix","text":"{ a = 1; b = x: x; }","raw":"((binding) @b (#eq? @b \"a\"))"}`,
		`{"path":"flake.nix","text":"{ a = 1; b = x: x; }"}`,
		`{"language":"bash","text":"f() { echo; }","raw":"(((("}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		a, src, err := DecodeParseArgs(json.RawMessage(raw))
		if err != nil {
			return
		}
		l, ok := Lookup(a.Language)
		if !ok {
			if l, _ = Detect(a.Path, src); l == nil {
				return
			}
		}
		var qs []*Query
		if a.Raw != "" {
			q, err := Compile(l, "raw", "raw", a.Raw)
			if err != nil {
				return
			}
			defer q.Close()
			qs = append(qs, q)
		}
		res, err := Parse(context.Background(), l, src, qs)
		if err != nil {
			return
		}
		for _, d := range res.Errors {
			if d.StartByte > d.EndByte || d.EndByte > uint(len(src)) {
				t.Fatalf("diagnostic out of range: %+v (%d bytes)", d, len(src))
			}
		}
		for _, qr := range res.Queries {
			for _, m := range qr.Matches {
				for _, c := range m.Captures {
					if c.StartByte > c.EndByte || c.EndByte > uint(len(src)) {
						t.Fatalf("capture out of range: %+v (%d bytes)", c, len(src))
					}
				}
			}
		}
	})
}

// FuzzQuery compiles query text for every language and runs it over a small
// source: a query from a cell or a draft may be refused, never crash the
// host (tree-sitter's C query parser has crashed on malformed ones).
func FuzzQuery(f *testing.F) {
	for _, s := range []string{
		"(identifier) @id", "name:(#0)", `((identifier) @a (#eq? @a "x"))`, "(function_definition name: (identifier) @n body: (_) @b) @d",
		"[(string) (comment)] @x", "(call (_)* @args)", "((_) @a . (_) @b)", "(ERROR) @e (MISSING) @m", "!name",
	} {
		f.Add(s)
	}
	src := []byte("def f(x):\n    return g(x, 'ü')\n")
	f.Fuzz(func(t *testing.T, text string) {
		for _, l := range Languages() {
			q, err := Compile(l, "raw", "raw", text)
			if err != nil {
				continue
			}
			if _, err := Parse(context.Background(), l, src, []*Query{q}); err != nil {
				t.Fatal(err)
			}
			q.Close()
		}
	})
}

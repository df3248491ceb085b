package code

import (
	"bytes"
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"
	"unsafe"

	sitter "github.com/tree-sitter/go-tree-sitter"
	tsbash "github.com/tree-sitter/tree-sitter-bash/bindings/go"
	tsgo "github.com/tree-sitter/tree-sitter-go/bindings/go"
	tsjs "github.com/tree-sitter/tree-sitter-javascript/bindings/go"
	tspython "github.com/tree-sitter/tree-sitter-python/bindings/go"
	tsrust "github.com/tree-sitter/tree-sitter-rust/bindings/go"
	tsts "github.com/tree-sitter/tree-sitter-typescript/bindings/go"
)

// Language is a language klbr-core knows: its grammar, provisioned at
// build time from a Go module (never downloaded), or none at all.
//
// A language without a grammar (TextOnly) is still detected, so a cell
// learns what the file is and that only the text operations apply to it:
// search, exact replace, checked patch. Symbols and queries need a grammar,
// and asking for them is an ErrNoGrammar, never an empty result.
type Language struct {
	Name       string   `json:"name"`
	Grammar    string   `json:"grammar"` // where the parser comes from, with its version
	Extensions []string `json:"extensions"`
	Shebangs   []string `json:"shebangs"` // interpreter names of a #! line
	TextOnly   bool     `json:"text_only,omitempty"`
	ts         *sitter.Language
}

// ErrNoGrammar marks a request for structure (a parse tree, symbols, a
// query) in a language klbr-core has no grammar for.
var ErrNoGrammar = errors.New("no grammar")

// NoGrammar is the error for a structural request in a text-only language:
// what is missing, and what works instead.
func NoGrammar(l *Language) error {
	return fmt.Errorf("%w: %s files are text only in this klbr-core (%s), so they have no symbols and no queries; "+
		"use the text operations instead: search, src.replace(old, new) (an exact replace) and a checked patch",
		ErrNoGrammar, l.Name, l.Grammar)
}

// textOnly is a language klbr-core detects but cannot parse.
func textOnly(name, why string, exts, shebangs []string) *Language {
	return &Language{Name: name, Grammar: why, Extensions: exts, Shebangs: shebangs, TextOnly: true}
}

func lang(name, grammar string, ptr unsafe.Pointer, exts, shebangs []string) *Language {
	return &Language{Name: name, Grammar: grammar, Extensions: exts, Shebangs: shebangs, ts: sitter.NewLanguage(ptr)}
}

// The grammar versions are those of go.mod.
var languages = map[string]*Language{}

func init() {
	for _, l := range []*Language{
		lang("python", "tree-sitter-python v0.25.0", tspython.Language(), []string{".py", ".pyi"}, []string{"python", "python3"}),
		lang("go", "tree-sitter-go v0.25.0", tsgo.Language(), []string{".go"}, nil),
		lang("rust", "tree-sitter-rust v0.24.0", tsrust.Language(), []string{".rs"}, nil),
		lang("typescript", "tree-sitter-typescript v0.23.2 (typescript)", tsts.LanguageTypescript(), []string{".ts", ".mts", ".cts"}, []string{"ts-node", "tsx", "deno"}),
		lang("tsx", "tree-sitter-typescript v0.23.2 (tsx)", tsts.LanguageTSX(), []string{".tsx"}, nil),
		lang("javascript", "tree-sitter-javascript v0.25.0", tsjs.Language(), []string{".js", ".mjs", ".cjs", ".jsx"}, []string{"node", "nodejs"}),
		// No Go module serves a Nix grammar, and we copy no other project's parser in.
		textOnly("nix", "no grammar: no Go module serves one", []string{".nix"}, []string{"nix-shell"}),
		lang("bash", "tree-sitter-bash v0.25.0", tsbash.Language(), []string{".sh", ".bash"}, []string{"sh", "bash"}),
	} {
		languages[l.Name] = l
	}
}

// Languages lists every language, by name.
func Languages() []*Language {
	out := make([]*Language, 0, len(languages))
	for _, l := range languages {
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Lookup returns the language named name.
func Lookup(name string) (*Language, bool) {
	l, ok := languages[name]
	return l, ok
}

// Names is the sorted list of language names.
func Names() []string {
	var out []string
	for _, l := range Languages() {
		out = append(out, l.Name)
	}
	return out
}

// Detect picks a language for a file: by its extension, else by the
// interpreter of its #! line. It says how it decided ("" when it did not).
func Detect(p string, src []byte) (*Language, string) {
	ext := strings.ToLower(path.Ext(p))
	for _, l := range Languages() {
		for _, e := range l.Extensions {
			if e == ext {
				return l, "extension " + ext
			}
		}
	}
	if interp := shebang(src); interp != "" {
		for _, l := range Languages() {
			for _, s := range l.Shebangs {
				if s == interp {
					return l, "shebang " + interp
				}
			}
		}
	}
	return nil, ""
}

// shebang returns the interpreter's base name of a leading #! line
// (through /usr/bin/env, its first non-option argument), without a version
// suffix such as "3.12".
func shebang(src []byte) string {
	if !bytes.HasPrefix(src, []byte("#!")) {
		return ""
	}
	line := src[2:]
	if i := bytes.IndexByte(line, '\n'); i >= 0 {
		line = line[:i]
	}
	if len(line) > 256 {
		return ""
	}
	f := strings.Fields(string(line))
	if len(f) == 0 {
		return ""
	}
	name := path.Base(f[0])
	if name == "env" {
		name = ""
		for _, a := range f[1:] {
			if !strings.HasPrefix(a, "-") && !strings.Contains(a, "=") {
				name = path.Base(a)
				break
			}
		}
	}
	if i := strings.IndexFunc(name, func(r rune) bool { return r >= '0' && r <= '9' || r == '.' }); i > 0 && name != "python3" {
		name = strings.TrimRight(name[:i], ".")
		if name == "python" {
			return "python3"
		}
	}
	return name
}

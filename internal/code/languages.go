package code

import (
	"bytes"
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

	"github.com/klbr-dev/klbr/internal/code/grammar/nix"
)

// Language is one grammar klbr-core is built with: provisioned at build
// time (Go modules, and the vendored Nix grammar), never downloaded.
type Language struct {
	Name       string   `json:"name"`
	Grammar    string   `json:"grammar"` // where the parser comes from, with its version
	Extensions []string `json:"extensions"`
	Shebangs   []string `json:"shebangs"` // interpreter names of a #! line
	ts         *sitter.Language
}

func lang(name, grammar string, ptr unsafe.Pointer, exts, shebangs []string) *Language {
	return &Language{Name: name, Grammar: grammar, Extensions: exts, Shebangs: shebangs, ts: sitter.NewLanguage(ptr)}
}

// The grammar versions are those of go.mod (and grammar/nix/README.md).
var languages = map[string]*Language{}

func init() {
	for _, l := range []*Language{
		lang("python", "tree-sitter-python v0.25.0", tspython.Language(), []string{".py", ".pyi"}, []string{"python", "python3"}),
		lang("go", "tree-sitter-go v0.25.0", tsgo.Language(), []string{".go"}, nil),
		lang("rust", "tree-sitter-rust v0.24.0", tsrust.Language(), []string{".rs"}, nil),
		lang("typescript", "tree-sitter-typescript v0.23.2 (typescript)", tsts.LanguageTypescript(), []string{".ts", ".mts", ".cts"}, []string{"ts-node", "tsx", "deno"}),
		lang("tsx", "tree-sitter-typescript v0.23.2 (tsx)", tsts.LanguageTSX(), []string{".tsx"}, nil),
		lang("javascript", "tree-sitter-javascript v0.25.0", tsjs.Language(), []string{".js", ".mjs", ".cjs", ".jsx"}, []string{"node", "nodejs"}),
		lang("nix", "tree-sitter-nix v0.3.0 (vendored)", nix.Language(), []string{".nix"}, []string{"nix-shell"}),
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

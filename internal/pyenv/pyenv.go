// Package pyenv stages the Python dependencies a behavior release declares
// (dependencies.json) into an environment of its own: a directory made
// once, before activation, with pip from a local wheel directory only
// (--no-index, wheels only: nothing is resolved from the network, nothing
// is built, nothing runs at install), under the pinned interpreter, and
// never the live kernel's environment. A workbench generation of the
// release puts it on its import path; it is never resolved at launch.
package pyenv

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// File is where a release declares its dependencies:
// {"requires": ["name==version", ...]}.
const File = "dependencies.json"

// Bounds.
const (
	MaxRequires  = 64
	StageTimeout = 5 * time.Minute
)

// ErrNotStaged reports a release whose environment is not (yet) staged.
var ErrNotStaged = errors.New("the release's Python environment is not staged")

// Declared reads and checks tree's declared dependencies, sorted: each a
// pinned name==version. A tree without the file declares none.
func Declared(tree string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(tree, File))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return Parse(b)
}

// Parse decodes a dependencies.json.
func Parse(b []byte) ([]string, error) {
	var d struct {
		Requires []string `json:"requires"`
	}
	if len(b) > 64<<10 {
		return nil, fmt.Errorf("%s is over 64 KiB", File)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("%s: %v (want {\"requires\": [\"name==version\", ...]})", File, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: trailing data", File)
	}
	if len(d.Requires) > MaxRequires {
		return nil, fmt.Errorf("%s: %d requirements, at most %d", File, len(d.Requires), MaxRequires)
	}
	seen := map[string]bool{}
	for _, r := range d.Requires {
		name, ver, ok := strings.Cut(r, "==")
		if !ok || !distName(name) || !version(ver) {
			return nil, fmt.Errorf("%s: %q is not a pinned requirement name==version", File, r)
		}
		key := strings.ToLower(strings.NewReplacer("_", "-", ".", "-").Replace(name))
		if seen[key] {
			return nil, fmt.Errorf("%s: %s is required twice", File, name)
		}
		seen[key] = true
	}
	out := append([]string{}, d.Requires...)
	sort.Strings(out)
	return out, nil
}

func distName(s string) bool {
	if s == "" || len(s) > 100 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

func version(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '.' || c == '+' || c == '-' || c == '!') {
			return false
		}
	}
	return true
}

// Hash is the identity of a requirement list ("" for none).
func Hash(reqs []string) string {
	if len(reqs) == 0 {
		return ""
	}
	sum := sha256.Sum256([]byte(strings.Join(reqs, "\n")))
	return hex.EncodeToString(sum[:])
}

// Envs is where staged environments live (<data>/runtime/envs) and where
// their wheels come from (<data>/wheels).
type Envs struct {
	Root   string
	Wheels string
	Python string // the pinned interpreter (resolved)
}

// Dir is the environment of reqs under e's interpreter: one per
// requirement list and interpreter.
func (e Envs) Dir(reqs []string) string {
	sum := sha256.Sum256([]byte(e.Python + "\n" + Hash(reqs)))
	return filepath.Join(e.Root, hex.EncodeToString(sum[:16]))
}

// Path is the staged environment of reqs to put on a generation's import
// path: "" when reqs is empty, ErrNotStaged when it was not staged.
func (e Envs) Path(reqs []string) (string, error) {
	if len(reqs) == 0 {
		return "", nil
	}
	dir := e.Dir(reqs)
	if _, err := os.Stat(filepath.Join(dir, "STAGED")); err != nil {
		return "", fmt.Errorf("%w (%s): activate the release again to stage it", ErrNotStaged, strings.Join(reqs, ", "))
	}
	return filepath.Join(dir, "site"), nil
}

// Stage makes the environment of reqs if it does not exist yet: pip
// installs exactly them from e.Wheels into a new directory, which is then
// renamed into place, read-only. It returns the import path.
func (e Envs) Stage(ctx context.Context, reqs []string) (string, error) {
	if len(reqs) == 0 {
		return "", nil
	}
	if p, err := e.Path(reqs); err == nil {
		return p, nil
	}
	if fi, err := os.Stat(e.Wheels); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("the release requires %s, but there is no wheel directory %s: put the wheels there (nothing is fetched from the network)",
			strings.Join(reqs, ", "), e.Wheels)
	}
	if err := os.MkdirAll(e.Root, 0o711); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(e.Root, ".stage-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(ctx, StageTimeout)
	defer cancel()
	args := []string{"-s", "-m", "pip", "install", "--no-index", "--find-links", e.Wheels, "--only-binary", ":all:",
		"--no-compile", "--disable-pip-version-check", "--no-input", "--quiet", "--target", filepath.Join(tmp, "site")}
	cmd := exec.CommandContext(ctx, e.Python, append(args, reqs...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + tmp, "LANG=C.UTF-8", "PIP_NO_CACHE_DIR=1",
		"PIP_CONFIG_FILE=/dev/null", "PYTHONDONTWRITEBYTECODE=1"}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		tail := out.String()
		if len(tail) > 2000 {
			tail = "…" + tail[len(tail)-2000:]
		}
		return "", fmt.Errorf("staging %s from %s failed: %v: %s", strings.Join(reqs, ", "), e.Wheels, err, strings.TrimSpace(tail))
	}
	manifest, _ := json.Marshal(map[string]any{"requires": reqs, "python": e.Python, "wheels": e.Wheels})
	if err := os.WriteFile(filepath.Join(tmp, "STAGED"), manifest, 0o444); err != nil {
		return "", err
	}
	filepath.Walk(tmp, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.IsDir() {
			os.Chmod(p, 0o755)
		}
		return nil
	})
	final := e.Dir(reqs)
	if err := os.Rename(tmp, final); err != nil {
		if p, perr := e.Path(reqs); perr == nil {
			return p, nil // staged meanwhile
		}
		return "", err
	}
	return filepath.Join(final, "site"), nil
}

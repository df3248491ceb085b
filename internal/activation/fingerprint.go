package activation

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// Fingerprint is the environment a release is validated and run under:
// the interpreter, the runtime shipped with klbr-core, and the Python
// dependencies the release declares (dependencies.json).
type Fingerprint struct {
	Python        string   `json:"python"`         // the interpreter's path (resolved)
	PythonVersion string   `json:"python_version"` // sys.version of it
	Runtime       string   `json:"runtime"`        // SHA-256 over the runtime's files
	Dependencies  string   `json:"dependencies"`   // SHA-256 of the declared requirements, sorted; "" when none
	Requires      []string `json:"requires,omitempty"`
}

// DependenciesFile is where a release declares its Python dependencies:
// {"requires": ["name==version", ...]}.
const DependenciesFile = "dependencies.json"

// maxRequires bounds the declared requirements.
const maxRequires = 64

// readDependencies reads and checks a tree's declared dependencies: each a
// pinned "name==version" (nothing is resolved at launch).
func readDependencies(tree string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(tree, DependenciesFile))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var d struct {
		Requires []string `json:"requires"`
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("%s: %v (want {\"requires\": [\"name==version\", ...]})", DependenciesFile, err)
	}
	if len(d.Requires) > maxRequires {
		return nil, fmt.Errorf("%s: %d requirements, at most %d", DependenciesFile, len(d.Requires), maxRequires)
	}
	for _, r := range d.Requires {
		name, ver, ok := strings.Cut(r, "==")
		if !ok || !validDistName(name) || !validVersion(ver) {
			return nil, fmt.Errorf("%s: %q is not a pinned requirement name==version", DependenciesFile, r)
		}
	}
	out := append([]string(nil), d.Requires...)
	sort.Strings(out)
	return out, nil
}

func validDistName(s string) bool {
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

func validVersion(s string) bool {
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

// envFacts are the interpreter's version and the runtime's hash, read once.
type envFacts struct {
	once    sync.Once
	version string
	runtime string
	err     error
}

func (s *Service) facts() (string, string, error) {
	f := &s.env
	f.once.Do(func() {
		cfg := s.hooks.Config()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, cfg.Python, "-S", "-c", "import sys; print(sys.version.split()[0])").Output()
		if err != nil {
			f.err = fmt.Errorf("%s: %v", cfg.Python, err)
			return
		}
		f.version = strings.TrimSpace(string(out))
		f.runtime, f.err = hashTree(cfg.RuntimeSrc)
	})
	return f.version, f.runtime, f.err
}

// hashTree is a SHA-256 over the paths and contents of dir's regular files
// (bytecode aside).
func hashTree(dir string) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "__pycache__" {
			return fs.SkipDir
		}
		if !d.Type().IsRegular() || strings.HasSuffix(p, ".pyc") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		sum := sha256.Sum256(b)
		fmt.Fprintf(h, "%s %x\n", filepath.ToSlash(rel), sum)
		return nil
	})
	return hex.EncodeToString(h.Sum(nil)), err
}

// fingerprint is release's environment fingerprint.
func (s *Service) fingerprint(release string) (Fingerprint, error) {
	ver, rt, err := s.facts()
	if err != nil {
		return Fingerprint{}, err
	}
	fp := Fingerprint{Python: s.hooks.Config().Python, PythonVersion: ver, Runtime: rt}
	reqs, err := readDependencies(s.releases.Tree(release))
	if err != nil {
		return fp, err
	}
	if len(reqs) > 0 {
		sum := sha256.Sum256([]byte(strings.Join(reqs, "\n")))
		fp.Dependencies, fp.Requires = hex.EncodeToString(sum[:]), reqs
	}
	return fp, nil
}

package activation

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/klbr-dev/klbr/internal/pyenv"
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
	// Site is the release's own staged environment (see pyenv), put on its
	// generations' import path; "" when it declares no dependencies.
	Site string `json:"site,omitempty"`
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
	reqs, err := pyenv.Declared(s.releases.Tree(release))
	if err != nil {
		return fp, err
	}
	fp.Dependencies, fp.Requires = pyenv.Hash(reqs), reqs
	return fp, nil
}

// SetEnvironments says where releases' dependency environments are staged
// and where their wheels come from.
func (s *Service) SetEnvironments(e pyenv.Envs) { s.envs = &e }

// stageEnv stages release's declared dependencies (if any) and returns the
// import path of its environment ("" for none).
func (s *Service) stageEnv(ctx context.Context, release string) (string, error) {
	reqs, err := pyenv.Declared(s.releases.Tree(release))
	if err != nil || len(reqs) == 0 {
		return "", err
	}
	if s.envs == nil {
		return "", fmt.Errorf("the release requires %s, and this host stages no Python environments", strings.Join(reqs, ", "))
	}
	return s.envs.Stage(ctx, reqs)
}

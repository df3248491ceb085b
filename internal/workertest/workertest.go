// Package workertest gives tests what real workers need, built once per
// test binary: the klbr-kernel binary, the materialized and byte-compiled
// Python runtime, the resolved interpreter, and the detected placer.
package workertest

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/placement"
	"github.com/klbr-dev/klbr/python"
)

// Env is a ready worker environment.
type Env struct {
	Kernel  string
	Runtime string
	Python  string
	Placer  placement.Placer
}

var shared struct {
	once sync.Once
	env  Env
	err  error
}

// Setup returns the shared environment, building it on first use.
func Setup(t testing.TB) Env {
	t.Helper()
	shared.once.Do(func() { shared.env, shared.err = build() })
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.env
}

// The environment a Share'd child takes instead of building.
const (
	envKernel  = "KLBR_WORKERTEST_KERNEL"
	envRuntime = "KLBR_WORKERTEST_RUNTIME"
)

// Share returns the shared environment as variables for a child test
// process of another uid (see internal/uidtest), whose Setup then uses
// this process's kernel and runtime instead of building its own (it could
// not: the Go toolchain's caches are this uid's). It makes their
// directories searchable by every uid. The child resolves python3 on its
// own PATH.
func Share(t testing.TB) []string {
	t.Helper()
	e := Setup(t)
	err := filepath.WalkDir(filepath.Dir(e.Kernel), func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		return os.Chmod(p, info.Mode().Perm()|0o055)
	})
	if err != nil {
		t.Fatalf("workertest: share: %v", err)
	}
	return []string{envKernel + "=" + e.Kernel, envRuntime + "=" + e.Runtime}
}

func build() (Env, error) {
	var e Env
	if k := os.Getenv(envKernel); k != "" {
		e.Kernel, e.Runtime = k, os.Getenv(envRuntime)
		var err error
		if e.Python, _, err = config.ResolvePython(context.Background(), "python3"); err != nil {
			return e, err
		}
		e.Placer, err = placement.Detect(context.Background(), placement.Options{})
		return e, err
	}
	dir, err := os.MkdirTemp("", "klbr-workertest-")
	if err != nil {
		return e, err
	}
	e.Kernel = filepath.Join(dir, "klbr-kernel")
	if out, err := exec.Command("go", "build", "-o", e.Kernel, "github.com/klbr-dev/klbr/cmd/klbr-kernel").CombinedOutput(); err != nil {
		return e, fmt.Errorf("build klbr-kernel: %v: %s", err, out)
	}
	if e.Runtime, _, err = python.Materialize(filepath.Join(dir, "runtime")); err != nil {
		return e, err
	}
	if e.Python, _, err = config.ResolvePython(context.Background(), "python3"); err != nil {
		return e, err
	}
	if err := python.Compile(context.Background(), e.Runtime, e.Python); err != nil {
		return e, err
	}
	e.Placer, err = placement.Detect(context.Background(), placement.Options{})
	return e, err
}

// Package workertest gives tests what real workers need, built once per
// test binary: the klbr-kernel binary, the materialized and byte-compiled
// Python runtime, the resolved interpreter, and the detected placer.
package workertest

import (
	"context"
	"fmt"
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

func build() (Env, error) {
	var e Env
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

package doctor

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/python"
)

// runtimeModules are what a worker imports as it starts (python -m
// klbr_runtime), and the SDK cells import.
const runtimeModules = "import klbr_runtime.runner, klbr_runtime.workbench, klbr_runtime.hooks, klbr"

// checkRuntime checks that the workers' interpreter imports klbr's runtime
// as a worker does: the tree KLBR_RUNTIME_DIR names, or the embedded one
// (written to a temporary directory, so doctor changes nothing).
func checkRuntime(ctx context.Context, paths config.Paths, bin string, add func(Check)) {
	src, from := "", "the embedded runtime"
	if paths.RuntimeDir != "" {
		src, from = filepath.Join(paths.RuntimeDir, "src"), paths.RuntimeDir
	} else {
		tmp, err := os.MkdirTemp("", "klbr-doctor-runtime-")
		if err != nil {
			add(Check{Name: "runtime", Detail: err.Error(), Fix: "check TMPDIR"})
			return
		}
		defer os.RemoveAll(tmp)
		if src, _, err = python.Materialize(tmp); err != nil {
			add(Check{Name: "runtime", Detail: err.Error(), Fix: "check TMPDIR"})
			return
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-s", "-c", runtimeModules)
	cmd.Dir = os.TempDir()
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "PYTHONPATH=" + src, "PYTHONSAFEPATH=1", "PYTHONDONTWRITEBYTECODE=1"}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		last := strings.TrimSpace(out.String())
		if i := strings.LastIndex(last, "\n"); i >= 0 {
			last = last[i+1:]
		}
		if last == "" {
			last = err.Error()
		}
		add(Check{Name: "runtime", Detail: fmt.Sprintf("%s cannot import %s: %s", bin, from, last),
			Fix: "point KLBR_PYTHON at a Python 3.11 or newer with its standard library, or fix KLBR_RUNTIME_DIR"})
		return
	}
	add(Check{Name: "runtime", OK: true, Detail: fmt.Sprintf("%s imports %s as a worker does", bin, from)})
}

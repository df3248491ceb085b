package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/diskuse"
	"github.com/klbr-dev/klbr/internal/hostgit"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/kernel"
	"github.com/klbr-dev/klbr/internal/placement"
	"github.com/klbr-dev/klbr/internal/sandbox"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
	"github.com/klbr-dev/klbr/internal/workspace"
	"github.com/klbr-dev/klbr/python"
)

// Runtime returns the Python runtime's src directory and hash: the tree
// KLBR_RUNTIME_DIR names, or the embedded one materialized under <data>/runtime.
func Runtime(paths config.Paths) (src, hash string, err error) {
	if paths.RuntimeDir != "" {
		src = filepath.Join(paths.RuntimeDir, "src")
		if _, err := os.Stat(filepath.Join(src, "klbr_runtime", "__main__.py")); err != nil {
			return "", "", fmt.Errorf("KLBR_RUNTIME_DIR %s holds no src/klbr_runtime: %w", paths.RuntimeDir, err)
		}
		hash, err = python.Hash(os.DirFS(src))
		return src, hash, err
	}
	return python.Materialize(filepath.Join(paths.DataDir, "runtime"))
}

// newWorkbench assembles the workbench manager, or says why cells cannot run.
// The daemon serves either way: admission and the operator path need no Python.
func newWorkbench(ctx context.Context, cfg *config.Config, st *store.Store, sessions *session.Manager, meter *diskuse.Meter,
	log *slog.Logger, remote *workbench.Remote, hs *hosts.Engine, observe func(string)) (*workbench.Manager, placement.Placer, error) {
	placer, err := placement.Detect(ctx, placement.Options{
		SystemdBus: os.Getenv(EnvSystemdBus), // unset: the system bus
		Logger:     log.With("component", "placement"),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("placement: %w", err)
	}
	kernel, err := worker.FindKernel()
	if err != nil {
		return nil, placer, err
	}
	py, _, err := config.ResolvePython(ctx, cfg.Paths.Python)
	if err != nil {
		return nil, placer, err
	}
	src, hash, err := Runtime(cfg.Paths)
	if err != nil {
		return nil, placer, err
	}
	if cfg.Paths.RuntimeDir == "" {
		if err := python.Compile(ctx, src, py); err != nil {
			log.Warn("could not byte-compile the runtime; workers will compile it at each start", "error", err)
		}
	}
	arts, err := artifacts.New(filepath.Join(cfg.Paths.DataDir, "artifacts"))
	if err != nil {
		return nil, placer, err
	}
	arts.WithBudget(meter)
	// Nothing spools yet: what a previous run left half written (a kill, a
	// full disk) is removed.
	if n, err := arts.CleanSpools(); err != nil {
		return nil, placer, err
	} else if n > 0 {
		log.Info("removed the artifact spools a previous run left", "spools", n)
	}
	sb, note := sandbox.ForWorkers(cfg, py, src)
	if sb.DropUser {
		if err := sandbox.OpenDataDir(cfg.Paths.DataDir); err != nil {
			return nil, placer, err
		}
	}
	if err := sandbox.PrepareTempDir(sb); err != nil {
		return nil, placer, err
	}
	if note != "" {
		log.Warn("worker sandbox is weaker than it could be", "why", note)
	}
	summary := sandbox.Describe(sb, note)
	log.Info("worker sandbox", "enforced", summary)
	l := cfg.File.Limits
	mem, _ := l.MemoryMaxBytes() // validated when the file was parsed
	cpu, _ := l.CPUQuotaPercent()
	return workbench.New(workbench.Config{
		Store: st, Sessions: sessions, Kernel: kernel, Python: py, RuntimeSrc: src, RuntimeHash: hash,
		Workspace: cfg.Paths.Workspace, Workspaces: newWorkspaces(cfg, st, sb, hs, arts, log.With("component", "workspace")),
		Placer: placer, Sandbox: sb, SandboxSummary: summary, SandboxBrief: sandbox.Brief(sb, note), Artifacts: arts,
		Limits:  placement.Limits{MemoryMaxBytes: int64(mem), TasksMax: l.TasksMax, CPUQuotaPercent: cpu},
		Log:     log.With("component", "workbench"),
		Observe: observe,
		Remote:  remote,
		Hosts:   hs,
	}), placer, nil
}

// newWorkspaces says where each session works: a root in the workspace,
// a child where its spawn recorded (its job's spec), with worktrees and
// copies under <data>/worktrees.
func newWorkspaces(cfg *config.Config, st *store.Store, sb kernel.Sandbox, hs *hosts.Engine, arts *artifacts.Store, log *slog.Logger) *workspace.Workspaces {
	// git's state lies in the data directory, outside every sandbox grant;
	// without git (nil) a repository gets no worktree, and says why.
	g, _ := hostgit.New(filepath.Join(cfg.Paths.DataDir, "hostgit"))
	return &workspace.Workspaces{
		Root: cfg.Paths.Workspace, Dir: filepath.Join(cfg.Paths.DataDir, "worktrees"), Sandbox: sb, Git: g, Log: log,
		Exclude: []string{cfg.Paths.DataDir}, Hosts: hs, Artifacts: arts,
		Lookup: func(ctx context.Context, session string) (*workspace.Place, error) {
			if !strings.HasPrefix(session, "child-") {
				return nil, nil
			}
			j, err := st.ChildJobOf(ctx, session)
			if errors.Is(err, store.ErrNoJob) {
				return nil, nil
			}
			if err != nil {
				return nil, err
			}
			spec, err := store.ChildSpecOf(j)
			if err != nil {
				return nil, err
			}
			return spec.Workspace, nil
		},
	}
}

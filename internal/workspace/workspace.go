// Package workspace decides where a session's cells, commands and jobs
// work: the workspace itself (KLBR_WORKSPACE), a child agent's worktree of
// its own (a git repository the host makes from the workspace's HEAD, or a
// bounded copy of a directory that is no repository) under the data
// directory, or the parent's workspace made
// read-only to the child; and what the worker sandbox grants there.
//
// A root session works in the workspace. A child works where its spawn
// recorded (store.ChildWorkspace in its job's spec): "shared" is its
// parent's place as its parent has it, "worktree" a new place of its own,
// "read_only" its parent's directory without the right to write it.
package workspace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/hostgit"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/kernel"
	"github.com/klbr-dev/klbr/internal/store"
)

// Place is where a session works: a store.ChildWorkspace (a root's is
// the workspace, mode shared).
type Place = store.ChildWorkspace

// Lookup returns the place recorded for session; nil when none is (a
// root session, or a child spawned before places were recorded).
type Lookup func(ctx context.Context, session string) (*Place, error)

// Workspaces is the daemon's view of every session's place.
type Workspaces struct {
	// Root is the workspace (KLBR_WORKSPACE).
	Root string
	// Dir holds the worktrees and copies (<data>/worktrees).
	Dir string
	// Sandbox is what every worker runs without (sandbox.ForWorkers); its
	// grant on Root is replaced by each place's.
	Sandbox kernel.Sandbox
	// Limits bound a copy; zero fields mean DefaultLimits'.
	Limits Limits
	// Exclude lists directories a copy leaves out (the data directory when
	// it lies in the workspace).
	Exclude []string
	// Lookup finds a session's recorded place; nil: every session works in Root.
	Lookup Lookup
	// Git runs every git of the worktrees (hostgit.New of <data>/hostgit);
	// nil: git is missing, and a repository gets no worktree.
	Git *hostgit.Git
	// Log notes what a copy left out; nil: nothing is logged.
	Log *slog.Logger
	// Hosts reaches the worker hosts (a child's copy on a host: MakeOnHost,
	// Patch); nil: klbr.toml has none.
	Hosts *hosts.Engine
	// Artifacts keeps the patches of children on hosts.
	Artifacts *artifacts.Store
}

// Shared is the root's place.
func (w *Workspaces) Shared() Place {
	return Place{Mode: store.WorkspaceShared, Dir: w.Root}
}

// For returns where session works. An error (the store cannot be read)
// must refuse the work: falling back to the root could let a read-only
// child write it.
func (w *Workspaces) For(ctx context.Context, session string) (Place, error) {
	if w == nil {
		return Place{}, errors.New("workspace: no workspaces configured")
	}
	if w.Lookup == nil {
		return w.Shared(), nil
	}
	p, err := w.Lookup(ctx, session)
	if err != nil {
		return Place{}, fmt.Errorf("the workspace of %s: %w", session, err)
	}
	if p == nil || p.Dir == "" {
		return w.Shared(), nil
	}
	return *p, nil
}

// SandboxFor is the worker sandbox of a session working in p: the base
// sandbox with its write grant on the workspace replaced by p's (its
// directory, its own repository within; and for a git worktree recorded
// before children got repositories of their own, the shared git
// directory), or by none when p is read-only. A base
// sandbox that takes nothing away (tests, no Landlock policy) stays so.
func (w *Workspaces) SandboxFor(p Place) kernel.Sandbox {
	sb := w.Sandbox
	if !sb.Active() || p.Dir == "" || (samePath(p.Dir, w.Root) && !p.ReadOnly) {
		return sb
	}
	rw := make([]string, 0, len(sb.ReadWrite)+2)
	for _, d := range sb.ReadWrite {
		if !samePath(d, w.Root) {
			rw = append(rw, d)
		}
	}
	if !p.ReadOnly {
		rw = append(rw, p.Dir)
		if p.GitDir != "" {
			rw = append(rw, p.GitDir)
		}
	}
	sb.ReadWrite = rw
	// A deny list shared with other places is copied, not aliased.
	sb.Deny, sb.ReadOnly = slices.Clone(sb.Deny), slices.Clone(sb.ReadOnly)
	if p.ReadOnly {
		// Readable even beneath a denied path (a worktree in the data directory).
		sb.ReadOnly = append(sb.ReadOnly, p.Dir)
	}
	return sb
}

// ReadOnly is from's directory made read-only to a child, with what the
// operating system enforces of that here, measured now.
func (w *Workspaces) ReadOnly(from Place) Place {
	p := Place{Mode: store.WorkspaceReadOnly, Dir: from.Dir, ReadOnly: true}
	p.Enforced = w.Enforcement(p)
	return p
}

// Inherit is a shared child's place: its parent's, read-only if that is.
func (w *Workspaces) Inherit(from Place) Place {
	p := Place{Mode: store.WorkspaceShared, Dir: from.Dir, ReadOnly: from.ReadOnly, Kind: from.Kind,
		Branch: from.Branch, Base: from.Base, GitDir: from.GitDir, Root: from.Root, Host: from.Host}
	if p.ReadOnly {
		p.Enforced = w.Enforcement(p)
	}
	return p
}

// Enforcement says what the operating system enforces of read-only p
// here: Landlock keeps a worker from writing beneath a directory only when
// the sandbox is on, the running kernel has Landlock, and no grant the
// kernel always makes (/dev, the temporary directory) or the sandbox makes
// (the drafts, the workers' TMPDIR) covers the directory. No systemd bind
// is made: cells run in transient scopes, which cannot carry
// ReadOnlyPaths= (a scope adopts processes already running).
func (w *Workspaces) Enforcement(p Place) string {
	const noBind = "; no read-only bind (cells run in transient systemd scopes, which cannot carry ReadOnlyPaths=)"
	if !w.Sandbox.Active() {
		return "NOT enforced: workers run without a sandbox here" + noBind
	}
	abi, err := kernel.LandlockABI()
	if err != nil {
		return "NOT enforced: " + err.Error() + noBind
	}
	sb := w.SandboxFor(p)
	for _, g := range append([]string{"/dev", "/tmp", os.TempDir(), sb.TempDir}, sb.ReadWrite...) {
		if g != "" && (within(p.Dir, g) || within(resolve(p.Dir), resolve(g))) {
			return fmt.Sprintf("NOT enforced: %s lies in %s, which workers may write", p.Dir, g) + noBind
		}
	}
	return fmt.Sprintf("Landlock (ABI %d) enforces read-only: writes beneath %s fail with EACCES (permission denied)", abi, p.Dir) + noBind
}

func resolve(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return filepath.Clean(p)
}

func samePath(a, b string) bool {
	return filepath.Clean(a) == filepath.Clean(b) || resolve(a) == resolve(b)
}

// within reports whether p is dir or lies beneath it.
func within(p, dir string) bool {
	p, dir = filepath.Clean(p), filepath.Clean(dir)
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+string(filepath.Separator))
}

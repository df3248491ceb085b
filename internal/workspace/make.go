package workspace

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"github.com/klbr-dev/klbr/internal/celltree"
	"github.com/klbr-dev/klbr/internal/hostgit"
	"github.com/klbr-dev/klbr/internal/store"
)

// Limits bound the copy of a workspace that is no git repository.
type Limits struct {
	MaxFiles int   // entries copied (files, directories, links)
	MaxBytes int64 // bytes of regular files
}

// DefaultLimits are a copy's bounds unless set.
var DefaultLimits = Limits{MaxFiles: 20000, MaxBytes: 256 << 20}

// ErrTooLarge refuses a copy over its limits.
var ErrTooLarge = errors.New("the workspace is too large to copy")

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9-]+`)

// Make makes a place of its own from from: when from.Dir is in a git work
// tree, a repository of the child's own, made by the host, holding from's
// HEAD on a new branch klbr/<name> and checked out there; a copy of
// from.Dir otherwise, refused over w.Limits. Its directory is
// <w.Dir>/<name>, name from hint and a random suffix. Uncommitted changes
// of from are not in it (it starts at HEAD). Nothing is left behind when
// it fails.
//
// The child's repository shares nothing writable with the workspace's: a
// git worktree would (its hooks, config and refs live in the workspace's
// .git), so what a child wrote there would run when the owner later ran
// git in the workspace. The host brings the child's branch back (Collect)
// with a fetch, which runs nothing of the child's repository.
func (w *Workspaces) Make(ctx context.Context, from Place, hint string) (Place, error) {
	if from.ReadOnly {
		return Place{}, errors.New("a read-only workspace gets no worktree: making one writes the repository it lies in")
	}
	if err := os.MkdirAll(w.Dir, 0o711); err != nil {
		return Place{}, fmt.Errorf("worktrees directory: %w", err)
	}
	if err := os.Chmod(w.Dir, 0o711); err != nil {
		return Place{}, fmt.Errorf("worktrees directory: %w", err)
	}
	name, top, err := w.reserve(hint)
	if err != nil {
		return Place{}, err
	}
	var p Place
	inRepo, err := w.inRepository(ctx, from.Dir)
	if err != nil {
		return Place{}, err
	}
	if inRepo {
		p, err = w.worktree(ctx, from, name, top)
	} else {
		p, err = w.copy(from, top)
	}
	if err != nil {
		os.RemoveAll(top)
		return Place{}, err
	}
	if w.Sandbox.DropUser {
		if err := chownTree(top, w.Sandbox.UID, w.Sandbox.GID); err != nil {
			w.Remove(context.WithoutCancel(ctx), p)
			return Place{}, fmt.Errorf("hand the worktree to the workers' uid %d: %w", w.Sandbox.UID, err)
		}
	}
	return p, nil
}

// reserve picks a new name and makes its directory's parent sure.
func (w *Workspaces) reserve(hint string) (name, top string, err error) {
	hint = strings.Trim(unsafeName.ReplaceAllString(hint, "-"), "-")
	if len(hint) > 40 {
		hint = hint[:40]
	}
	if hint == "" {
		hint = "child"
	}
	for range 8 {
		var b [3]byte
		rand.Read(b[:])
		name = hint + "-" + hex.EncodeToString(b[:])
		top = filepath.Join(w.Dir, name)
		if _, err := os.Lstat(top); errors.Is(err, fs.ErrNotExist) {
			return name, top, nil
		}
	}
	return "", "", errors.New("no free worktree name")
}

// inRepository reports whether dir lies in a git work tree. Without git
// on the PATH, a directory with a .git on its way up is refused rather
// than copied as if it were no repository.
func (w *Workspaces) inRepository(ctx context.Context, dir string) (bool, error) {
	if w.Git == nil {
		for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
			if _, err := os.Lstat(filepath.Join(d, ".git")); err == nil {
				return false, fmt.Errorf("%s lies in a git repository (%s), but git is not on klbr-core's PATH: install it, or spawn with workspace=\"shared\" or \"read_only\"", dir, filepath.Join(d, ".git"))
			}
			if d == filepath.Dir(d) {
				return false, nil
			}
		}
	}
	out, err := w.inWorkspace(ctx, dir, "rev-parse", "--is-inside-work-tree")
	return err == nil && out == "true", nil
}

func (w *Workspaces) worktree(ctx context.Context, from Place, name, top string) (Place, error) {
	prefix, err := w.inWorkspace(ctx, from.Dir, "rev-parse", "--show-prefix")
	if err != nil {
		return Place{}, err
	}
	source, err := w.inWorkspace(ctx, from.Dir, "rev-parse", "--show-toplevel")
	if err != nil {
		return Place{}, err
	}
	if _, err := w.inWorkspace(ctx, from.Dir, "rev-parse", "--verify", "--quiet", "HEAD^{commit}"); err != nil {
		return Place{}, fmt.Errorf("the repository of %s has no commit yet (HEAD is unborn): commit once, or spawn with workspace=\"shared\"", from.Dir)
	}
	branch := "klbr/" + name
	// A repository the host makes: its config is git init's, in the host's
	// environment; no hook, filter or monitor of the workspace's comes with
	// the objects. The fetch runs upload-pack in the workspace's repository,
	// which runs nothing of it (see hostgit).
	if _, err := w.Git.Run(ctx, hostgit.Cmd{Dir: w.Dir, Discover: true}, "init", "--quiet", "--template=", "-b", branch, top); err != nil {
		return Place{}, err
	}
	gd := filepath.Join(top, ".git")
	if _, err := w.Git.Run(ctx, hostgit.Cmd{GitDir: gd}, "fetch", "--quiet", "--no-tags", "--no-recurse-submodules", "--no-write-fetch-head",
		"--update-head-ok", source, "HEAD:refs/heads/"+branch); err != nil {
		return Place{}, fmt.Errorf("bring the workspace's HEAD into the child's repository: %w", err)
	}
	base, err := w.Git.Run(ctx, hostgit.Cmd{GitDir: gd}, "rev-parse", "--verify", "refs/heads/"+branch)
	if err != nil {
		return Place{}, err
	}
	// The files come from the host's repository: a .gitattributes among
	// them names drivers its config does not define, so none runs.
	if _, err := w.Git.Run(ctx, hostgit.Cmd{GitDir: gd, WorkTree: top, Dir: top}, "reset", "--quiet", "--hard"); err != nil {
		return Place{}, err
	}
	return Place{Mode: store.WorkspaceWorktree, Kind: "git", Dir: filepath.Join(top, filepath.FromSlash(prefix)),
		Branch: branch, Base: strings.TrimSpace(string(base)), Root: from.Dir}, nil
}

// Collect brings the branch of p, a child's repository, into the
// repository of the workspace p was made from, as refs/heads/<branch>
// (forced: the child may have rewritten it): the parent merges it from
// there. The fetch runs upload-pack in the child's repository, which
// honours no hook and no program from a repository's own config, and
// fetches into the workspace's without checking anything out.
func (w *Workspaces) Collect(ctx context.Context, p Place) error {
	if p.Mode != store.WorkspaceWorktree || p.Kind != "git" || p.Root == "" || p.Branch == "" {
		return fmt.Errorf("%s is no git repository of a child's: nothing to collect", p.Dir)
	}
	if p.GitDir != "" {
		return nil // a git worktree (made before children got repositories of their own): its branch is the root's already
	}
	top, err := w.topOf(p.Dir)
	if err != nil {
		return err
	}
	if w.Git == nil {
		return hostgit.ErrNoGit
	}
	ref := "refs/heads/" + p.Branch
	_, err = w.Git.Run(ctx, hostgit.Cmd{Dir: p.Root, Discover: true}, "fetch", "--quiet", "--no-tags", "--no-recurse-submodules",
		"--no-write-fetch-head", filepath.Join(top, ".git"), "+"+ref+":"+ref)
	if err != nil {
		return fmt.Errorf("bring branch %s back into %s: %w", p.Branch, p.Root, err)
	}
	return nil
}

// inWorkspace runs git in dir, a directory of the workspace (whose
// repository the host does not own: rev-parse only), and returns its
// trimmed stdout.
func (w *Workspaces) inWorkspace(ctx context.Context, dir string, args ...string) (string, error) {
	out, err := w.Git.Run(ctx, hostgit.Cmd{Dir: dir, Discover: true}, args...)
	return strings.TrimSpace(string(out)), err
}

// copy copies from.Dir to top within w.Limits with celltree, which
// follows no link of the tree (a cell may write it while it is copied):
// regular files (with their permission bits), directories, and links
// whose target stays inside the tree (as links); links out of it, FIFOs,
// sockets, devices and w.Exclude are left out (and logged), and a file
// with other hard links refuses the copy. A from.Dir under w.Dir (a
// child's own worktree, which the child may have rebuilt with links) is
// reached from w.Dir with no link followed on the way either.
func (w *Workspaces) copy(from Place, top string) (Place, error) {
	lim := w.Limits
	if lim.MaxFiles <= 0 {
		lim.MaxFiles = DefaultLimits.MaxFiles
	}
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = DefaultLimits.MaxBytes
	}
	src, err := w.openSource(from.Dir)
	if err != nil {
		return Place{}, fmt.Errorf("copy the workspace: %w", err)
	}
	defer src.Close()
	res, err := src.Copy(top, celltree.Options{MaxEntries: lim.MaxFiles, MaxBytes: lim.MaxBytes,
		Exclude: append([]string{w.Dir}, w.Exclude...)})
	switch {
	case errors.Is(err, celltree.ErrTooLarge):
		return Place{}, fmt.Errorf("%w: %w (copy limit: %d entries, %d bytes); make it a git repository (a worktree is made by git) or spawn with workspace=\"shared\" or \"read_only\"",
			ErrTooLarge, err, lim.MaxFiles, lim.MaxBytes)
	case errors.Is(err, celltree.ErrHardLink):
		return Place{}, fmt.Errorf("copy the workspace: %w; klbr copies no file with other hard links (it cannot tell who made them): replace it by a copy of its own, or spawn with workspace=\"shared\" or \"read_only\"", err)
	case err != nil:
		return Place{}, fmt.Errorf("copy the workspace: %w", err)
	}
	if res.SkippedCount > 0 && w.Log != nil {
		w.Log.Info("workspace copy left entries out", "from", from.Dir, "to", top, "count", res.SkippedCount, "first", res.Skipped[0].Path, "why", res.Skipped[0].Why)
	}
	return Place{Mode: store.WorkspaceWorktree, Kind: "copy", Dir: top, Root: from.Dir}, nil
}

// openSource opens dir for a copy: beneath w.Dir with no link followed
// when it lies there, else as the path the operator configured.
func (w *Workspaces) openSource(dir string) (*celltree.Root, error) {
	rel, err := filepath.Rel(filepath.Clean(w.Dir), filepath.Clean(dir))
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return celltree.Open(dir)
	}
	base, err := celltree.Open(w.Dir)
	if err != nil {
		return nil, err
	}
	defer base.Close()
	return base.OpenRoot(filepath.ToSlash(rel))
}

// Remove removes a worktree or copy Make made (its directory under w.Dir;
// anything else is refused). A child's git repository's branch is first
// brought back into the workspace's repository (Collect): the work
// committed there is the parent's to merge or delete (git branch -D);
// when that fails nothing is removed.
func (w *Workspaces) Remove(ctx context.Context, p Place) error {
	if p.Mode != store.WorkspaceWorktree {
		return fmt.Errorf("a %s workspace is not the child's own: nothing to remove", p.Mode)
	}
	if p.Host != "" {
		return w.removeOnHost(ctx, p)
	}
	top, err := w.topOf(p.Dir)
	if err != nil {
		return err
	}
	legacy := p.Kind == "git" && p.Root != "" && p.GitDir != ""
	if p.Kind == "git" && p.Root != "" && !legacy {
		if _, err := os.Lstat(top); err == nil {
			if err := w.Collect(ctx, p); err != nil {
				return fmt.Errorf("%w; the child's repository %s is kept", err, top)
			}
		}
	}
	if legacy {
		if _, err := w.Git.Run(ctx, hostgit.Cmd{Dir: p.Root, Discover: true}, "worktree", "remove", "--force", "--force", top); err == nil {
			return nil
		}
	}
	if err := os.RemoveAll(top); err != nil {
		return err
	}
	if legacy {
		w.Git.Run(ctx, hostgit.Cmd{Dir: p.Root, Discover: true}, "worktree", "prune")
	}
	return nil
}

// topOf is the directory under w.Dir that dir lies in.
func (w *Workspaces) topOf(dir string) (string, error) {
	rel, err := filepath.Rel(filepath.Clean(w.Dir), filepath.Clean(dir))
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("%s is not a worktree of klbr's (under %s)", dir, w.Dir)
	}
	first, _, _ := strings.Cut(rel, string(filepath.Separator))
	return filepath.Join(w.Dir, first), nil
}

// chownTree hands every entry beneath top to uid:gid.
func chownTree(top string, uid, gid int) error {
	return filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := os.Lchown(p, uid, gid); err != nil && !errors.Is(err, syscall.EPERM) {
			return err
		}
		return nil
	})
}

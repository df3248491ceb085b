package workspace

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/klbr-dev/klbr/internal/celltree"
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

// gitTimeout bounds each git command of a worktree's making.
const gitTimeout = 2 * time.Minute

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9-]+`)

// Make makes a place of its own from from: a git worktree of the
// repository from.Dir lies in, on a new branch klbr/<name> at from's HEAD,
// when from.Dir is in a git work tree; a copy of from.Dir otherwise,
// refused over w.Limits. Its directory is <w.Dir>/<name>, name from hint
// and a random suffix. Uncommitted changes of from are not in a worktree
// (it starts at HEAD). Nothing is left behind when it fails.
//
// git runs here, outside the worker sandbox, on a repository cells may
// write: so hooks and the file-system monitor are switched off, and a
// repository that configures a checkout filter (filter.<driver>.smudge,
// .process) is refused rather than have klbr-core run the filter.
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
	if _, err := exec.LookPath("git"); err != nil {
		for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
			if _, err := os.Lstat(filepath.Join(d, ".git")); err == nil {
				return false, fmt.Errorf("%s lies in a git repository (%s), but git is not on klbr-core's PATH: install it, or spawn with workspace=\"shared\" or \"read_only\"", dir, filepath.Join(d, ".git"))
			}
			if d == filepath.Dir(d) {
				return false, nil
			}
		}
	}
	out, err := git(ctx, dir, "rev-parse", "--is-inside-work-tree")
	return err == nil && strings.TrimSpace(out) == "true", nil
}

func (w *Workspaces) worktree(ctx context.Context, from Place, name, top string) (Place, error) {
	prefix, err := git(ctx, from.Dir, "rev-parse", "--show-prefix")
	if err != nil {
		return Place{}, err
	}
	common, err := git(ctx, from.Dir, "rev-parse", "--path-format=absolute", "--git-common-dir")
	if err != nil {
		return Place{}, err
	}
	base, err := git(ctx, from.Dir, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
	if err != nil {
		return Place{}, fmt.Errorf("the repository of %s has no commit yet (HEAD is unborn): commit once, or spawn with workspace=\"shared\"", from.Dir)
	}
	// A checkout filter would run in klbr-core, outside the sandbox.
	if out, _ := git(ctx, from.Dir, "config", "--get-regexp", `^filter\..*\.(smudge|process)$`); strings.TrimSpace(out) != "" {
		return Place{}, fmt.Errorf("the repository of %s configures a checkout filter (%s): klbr does not run it outside the sandbox; spawn with workspace=\"shared\" or \"read_only\"",
			from.Dir, strings.Fields(out)[0])
	}
	base, branch := strings.TrimSpace(base), "klbr/"+name
	if _, err := git(ctx, from.Dir, "worktree", "add", "--quiet", "-b", branch, top, base); err != nil {
		return Place{}, err
	}
	return Place{Mode: store.WorkspaceWorktree, Kind: "git", Dir: filepath.Join(top, filepath.FromSlash(strings.TrimSpace(prefix))),
		Branch: branch, Base: base, GitDir: filepath.Clean(strings.TrimSpace(common)), Root: from.Dir}, nil
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
// anything else is refused). A git worktree's branch stays: the work
// committed there is the parent's to merge or delete (git branch -D).
func (w *Workspaces) Remove(ctx context.Context, p Place) error {
	if p.Mode != store.WorkspaceWorktree {
		return fmt.Errorf("a %s workspace is not the child's own: nothing to remove", p.Mode)
	}
	top, err := w.topOf(p.Dir)
	if err != nil {
		return err
	}
	if p.Kind == "git" && p.Root != "" {
		if _, err := git(ctx, p.Root, "worktree", "remove", "--force", "--force", top); err == nil {
			return nil
		}
	}
	if err := os.RemoveAll(top); err != nil {
		return err
	}
	if p.Kind == "git" && p.Root != "" {
		git(ctx, p.Root, "worktree", "prune")
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

// git runs git in dir with hooks, the file-system monitor and the user's
// and system's configuration off; it returns stdout.
func git(ctx context.Context, dir string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, gitTimeout)
	defer cancel()
	full := append([]string{"-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "safe.directory=*", "-C", dir}, args...)
	cmd := exec.CommandContext(ctx, "git", full...)
	env := []string{"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0", "LC_ALL=C"}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "GIT_") && !strings.HasPrefix(e, "LC_ALL=") {
			env = append(env, e)
		}
	}
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 500 {
			msg = msg[:500] + "…"
		}
		if msg == "" {
			msg = err.Error()
		}
		return stdout.String(), fmt.Errorf("git %s: %s", args[0], msg)
	}
	return stdout.String(), nil
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

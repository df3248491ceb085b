package workspace

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/klbr-dev/klbr/internal/hostgit"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/store"
)

// MaxPatchBytes bounds the patch of a child on a host.
const MaxPatchBytes = 64 << 20

// MakeOnHost makes a child's place on host: a copy of from.Dir there. The
// tree is read here with celltree (see packTree), sent content-addressed
// (hosts.PutTree: once per content, checked on the host) and copied into a
// new workspace directory of the host's (hosts.MakeWorkspace). The archive
// is kept here, under w.Dir, as the base its patch is made against (Patch).
// Nothing on the host ever writes from.Dir. Nothing is left behind when it
// fails: a host that cannot be reached refuses the place, with why.
func (w *Workspaces) MakeOnHost(ctx context.Context, from Place, host, hint string) (Place, error) {
	if w.Hosts == nil {
		return Place{}, errors.New("klbr.toml defines no [hosts.NAME]")
	}
	if from.Host != "" {
		return Place{}, fmt.Errorf("this session works on host %s already; its children there share its copy (workspace=\"shared\", no host=)", from.Host)
	}
	lim := w.limits()
	if err := os.MkdirAll(w.Dir, 0o711); err != nil {
		return Place{}, fmt.Errorf("worktrees directory: %w", err)
	}
	name, err := hostWorkspaceName(hint)
	if err != nil {
		return Place{}, err
	}
	// A spawner's own copy under w.Dir is reached with no link followed,
	// as a local copy reaches it (openSource).
	src, err := w.openSource(from.Dir)
	if err != nil {
		return Place{}, fmt.Errorf("copy the workspace for host %s: %w", host, err)
	}
	tree, skipped, err := packRoot(src, lim, append([]string{w.Dir}, w.Exclude...))
	src.Close()
	if err != nil {
		return Place{}, fmt.Errorf("copy the workspace for host %s: %w", host, err)
	}
	if skipped > 0 && w.Log != nil {
		w.Log.Info("the copy for a host left links and special files out", "from", from.Dir, "host", host, "count", skipped)
	}
	base := w.baseFile(name)
	if err := os.WriteFile(base, tree.Tar, 0o600); err != nil {
		return Place{}, fmt.Errorf("keep the base of the copy: %w", err)
	}
	if _, _, err := w.Hosts.PutTree(ctx, host, tree); err != nil {
		os.Remove(base)
		return Place{}, err
	}
	dir, err := w.Hosts.MakeWorkspace(ctx, host, name, tree.Hash)
	if err != nil {
		os.Remove(base)
		return Place{}, err
	}
	return Place{Mode: store.WorkspaceWorktree, Kind: "copy", Host: host, Dir: dir, Root: from.Dir, Base: tree.Hash}, nil
}

// hostWorkspaceName is a new workspace name for the host: klbr-ws-<hint>-<6 hex>.
func hostWorkspaceName(hint string) (string, error) {
	hint = strings.Trim(unsafeName.ReplaceAllString(strings.ToLower(hint), "-"), "-")
	if len(hint) > 40 {
		hint = hint[:40]
	}
	if hint == "" {
		hint = "child"
	}
	var b [3]byte
	rand.Read(b[:])
	name := "klbr-ws-" + hint + "-" + hex.EncodeToString(b[:])
	return name, hosts.CheckWorkspaceName(name)
}

// baseFile is where the base of host workspace name is kept: in w.Dir,
// beside the local worktrees, which no worker may write.
func (w *Workspaces) baseFile(name string) string {
	return filepath.Join(w.Dir, name+".base.tar")
}

func (w *Workspaces) limits() Limits {
	lim := w.Limits
	if lim.MaxFiles <= 0 {
		lim.MaxFiles = DefaultLimits.MaxFiles
	}
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = DefaultLimits.MaxBytes
	}
	return lim
}

// Patch is the changes of a child on a host against the copy it was given.
type Patch struct {
	Ref   string // the artifact (a<sha256>); "" when nothing changed
	Size  int64
	Files int // paths added, changed or removed
}

// Patch reads the workspace of p, a child's place on a host, back from the
// host and stores its changes against the base as a git patch (git diff
// --binary, paths relative to p.Root) in the artifact store: the parent
// applies it or not. The host's archive is read bounded and its names
// checked (readTree); the diff runs in a scratch repository of the host's
// (hostgit) on contents read here, so git never opens a tree of the
// child's. Regular files count with their executable bit, and symbolic
// links as git links (their target text, never followed: not here, where
// only the archive's header is read, nor on the host, whose tar stores a
// link as a link); other kinds are left out.
func (w *Workspaces) Patch(ctx context.Context, p Place) (Patch, error) {
	if p.Host == "" || p.Mode != store.WorkspaceWorktree {
		return Patch{}, fmt.Errorf("%s is no copy on a host: no patch", p.Dir)
	}
	if w.Hosts == nil || w.Artifacts == nil {
		return Patch{}, errors.New("no hosts or no artifact store here")
	}
	name := path.Base(p.Dir)
	lim := w.limits()
	baseTar, err := os.ReadFile(w.baseFile(name))
	if err != nil {
		return Patch{}, fmt.Errorf("the base of %s: %w", name, err)
	}
	baseSum := map[string]entrySum{}
	if _, err := readEntries(bytes.NewReader(baseTar), lim, func(e treeEntry) error {
		baseSum[e.Name] = sumOf(e)
		return nil
	}); err != nil {
		return Patch{}, fmt.Errorf("the base of %s: %w", name, err)
	}
	// The host's archive streams into readTree, which ends the transfer
	// (closing the pipe) at the first thing it refuses.
	pr, pw := io.Pipe()
	readErr := make(chan error, 1)
	go func() {
		err := w.Hosts.ReadWorkspace(ctx, p.Host, name, pw)
		pw.CloseWithError(err)
		readErr <- err
	}()
	var work []hostgit.File
	seen := map[string]bool{}
	_, terr := readEntries(pr, lim, func(e treeEntry) error {
		seen[e.Name] = true
		if s, ok := baseSum[e.Name]; !ok || s != sumOf(e) {
			work = append(work, hostgit.File{Path: e.Name, Data: e.Data, Exec: e.Exec, Link: e.Link})
		}
		return nil
	})
	if terr == nil {
		// tar pads its archive past the end marker (to 10 KiB records):
		// read what a tar may pad, no more.
		if n, _ := io.Copy(io.Discard, io.LimitReader(pr, 1<<20)); n >= 1<<20 {
			terr = errors.New("read tree: data past the archive's end")
		}
	}
	pr.CloseWithError(errors.New("read tree: stopped"))
	rerr := <-readErr
	if terr != nil {
		return Patch{}, fmt.Errorf("the workspace on host %s: %w", p.Host, terr)
	}
	if rerr != nil {
		return Patch{}, rerr
	}
	changed := map[string]bool{}
	for _, f := range work {
		changed[f.Path] = true
	}
	for n := range baseSum {
		if !seen[n] {
			changed[n] = true
		}
	}
	if len(changed) == 0 {
		return Patch{}, nil
	}
	var base []hostgit.File
	if _, err := readEntries(bytes.NewReader(baseTar), lim, func(e treeEntry) error {
		if changed[e.Name] {
			base = append(base, hostgit.File{Path: e.Name, Data: e.Data, Exec: e.Exec, Link: e.Link})
		}
		return nil
	}); err != nil {
		return Patch{}, err
	}
	slices.SortFunc(work, func(a, b hostgit.File) int { return strings.Compare(a.Path, b.Path) })
	slices.SortFunc(base, func(a, b hostgit.File) int { return strings.Compare(a.Path, b.Path) })
	repo, done, err := w.Git.Scratch(ctx)
	if err != nil {
		return Patch{}, err
	}
	defer done()
	commits, err := w.Git.Commit(ctx, repo, map[string][]hostgit.File{"base": base, "work": work})
	if err != nil {
		return Patch{}, err
	}
	diff, err := w.Git.Run(ctx, hostgit.Cmd{GitDir: repo, MaxOut: MaxPatchBytes + 1}, "diff", "--binary", "--full-index", commits["base"], commits["work"])
	if err != nil {
		return Patch{}, err
	}
	if len(diff) > MaxPatchBytes {
		return Patch{}, fmt.Errorf("the patch is larger than %d bytes", MaxPatchBytes)
	}
	sp, err := w.Artifacts.NewSpool()
	if err != nil {
		return Patch{}, err
	}
	if _, err := sp.Write(diff); err != nil {
		sp.Discard()
		return Patch{}, err
	}
	ref, err := sp.Commit()
	if err != nil {
		return Patch{}, err
	}
	return Patch{Ref: "a" + ref.SHA256, Size: ref.Size, Files: len(changed)}, nil
}

// entrySum is what a patch compares of a file: its kind, mode and content.
type entrySum struct {
	sum        [sha256.Size]byte
	exec, link bool
}

func sumOf(e treeEntry) entrySum {
	return entrySum{sum: sha256.Sum256(e.Data), exec: e.Exec && !e.Link, link: e.Link}
}

// removeOnHost removes p's workspace on its host, and its base here.
func (w *Workspaces) removeOnHost(ctx context.Context, p Place) error {
	if w.Hosts == nil {
		return errors.New("klbr.toml defines no [hosts.NAME]")
	}
	name := path.Base(p.Dir)
	if err := w.Hosts.RemoveWorkspace(ctx, p.Host, name); err != nil {
		return err
	}
	if err := os.Remove(w.baseFile(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

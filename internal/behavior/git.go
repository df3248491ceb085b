package behavior

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/klbr-dev/klbr/internal/hostgit"
)

// A draft's diff and rebase are git's, but git never runs in the draft: a
// draft is cell-writable (its .git/config, hooks, .gitattributes, links),
// so the host reads the draft's files itself through an os.Root (nothing
// beneath it leads outside) and hands their contents to git in a scratch
// repository of its own (hostgit.Scratch, hostgit.Commit), next to the
// release tree the draft is based on. Nothing in the draft, a .git there
// included, reaches git.

// MaxDiffBytes bounds a diff the host returns.
const MaxDiffBytes = 256 << 10

// ErrNoGit reports that git cannot be found.
var ErrNoGit = hostgit.ErrNoGit

// DraftDiff is the diff of the files of draft (the draft's tree) against
// those of base (the release tree it is based on), new files included,
// bounded by MaxDiffBytes.
func DraftDiff(ctx context.Context, g *hostgit.Git, draft *os.Root, base string) (diff string, truncated bool, err error) {
	ours, err := readRoot(draft)
	if err != nil {
		return "", false, fmt.Errorf("read the draft: %w", err)
	}
	theirs, err := readDir(base)
	if err != nil {
		return "", false, err
	}
	repo, done, err := g.Scratch(ctx)
	if err != nil {
		return "", false, err
	}
	defer done()
	c, err := g.Commit(ctx, repo, map[string][]hostgit.File{"base": files(theirs), "draft": files(ours)})
	if err != nil {
		return "", false, err
	}
	out, err := g.Run(ctx, hostgit.Cmd{GitDir: repo, MaxOut: MaxDiffBytes + 1}, "diff", "--no-color", "--no-ext-diff", "--no-textconv",
		"--src-prefix=a/", "--dst-prefix=b/", c["base"], c["draft"])
	if err != nil {
		return "", false, err
	}
	diff, truncated = bound(string(out))
	return diff, truncated, nil
}

func files(m map[string][]byte) []hostgit.File {
	out := make([]hostgit.File, 0, len(m))
	for p, b := range m {
		out = append(out, hostgit.File{Path: p, Data: b})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

func bound(s string) (string, bool) {
	if len(s) <= MaxDiffBytes {
		return s, false
	}
	return strings.ToValidUTF8(s[:MaxDiffBytes], ""), true
}

// Diff is the diff from release a's tree to release b's, with paths
// relative to the trees, bounded by MaxDiffBytes. The trees are the
// host's (immutable releases); git runs in no repository of theirs, with
// its state in <data>/hostgit.
func (r *Releases) Diff(ctx context.Context, a, b string) (string, bool, error) {
	for _, id := range []string{a, b} {
		if _, err := r.Verify(id); err != nil {
			return "", false, err
		}
	}
	g, err := hostgit.New(filepath.Join(filepath.Dir(r.dir), "hostgit"))
	if err != nil {
		return "", false, err
	}
	out, err := g.Run(ctx, hostgit.Cmd{Dir: r.dir, MaxOut: MaxDiffBytes + 1}, "diff", "--no-index", "--no-color", "--no-ext-diff", "--no-textconv",
		"--src-prefix=a/", "--dst-prefix=b/", filepath.Join(a, "tree"), filepath.Join(b, "tree"))
	if err != nil && hostgit.ExitCode(err) != 1 { // 1: the trees differ
		return "", false, err
	}
	s := strings.ReplaceAll(string(out), "a/"+a+"/tree/", "a/")
	s = strings.ReplaceAll(s, "b/"+b+"/tree/", "b/")
	d, trunc := bound(s)
	return d, trunc, nil
}

// Conflict is a path a rebase cannot merge by itself.
type Conflict struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
	Merged string `json:"merged,omitempty"` // git merge-file's output, with conflict markers
}

// RebaseResult is a rebase's outcome: the paths taken from the new release,
// the paths merged, and the conflicts (then nothing was changed).
type RebaseResult struct {
	Taken     []string   `json:"taken"`
	Merged    []string   `json:"merged"`
	Conflicts []Conflict `json:"conflicts"`
}

// Rebase brings the draft, based on the release tree base, onto the
// release tree onto, three-way, file by file: a file only the new release
// changed is taken, one only the draft changed is kept, one both changed is
// merged by git merge-file. When any file conflicts, nothing is written and
// every conflict is reported. The draft is read and written through its
// os.Root only; the caller records onto as the draft's new base.
func Rebase(ctx context.Context, g *hostgit.Git, draft *os.Root, base, onto string) (RebaseResult, error) {
	res := RebaseResult{Taken: []string{}, Merged: []string{}, Conflicts: []Conflict{}}
	files := map[string]bool{}
	read := map[string]map[string][]byte{}
	for name, dir := range map[string]string{"base": base, "theirs": onto} {
		m, err := readDir(dir)
		if err != nil {
			return res, err
		}
		read[name] = m
	}
	ours, err := readRoot(draft)
	if err != nil {
		return res, fmt.Errorf("read the draft: %w", err)
	}
	read["ours"] = ours
	for _, m := range read {
		for p := range m {
			files[p] = true
		}
	}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	writes := map[string][]byte{} // nil: delete
	for _, p := range paths {
		b, bok := read["base"][p]
		o, ook := read["ours"][p]
		t, tok := read["theirs"][p]
		same := func(x []byte, xok bool, y []byte, yok bool) bool { return xok == yok && bytes.Equal(x, y) }
		switch {
		case same(o, ook, b, bok): // only the release changed it (or nobody)
			if !same(t, tok, b, bok) {
				writes[p] = t
				if !tok {
					writes[p] = nil
				}
				res.Taken = append(res.Taken, p)
			}
		case same(t, tok, b, bok), same(o, ook, t, tok): // only the draft changed it, or both alike
		case !bok || !ook || !tok:
			res.Conflicts = append(res.Conflicts, Conflict{Path: p, Reason: presence(bok, ook, tok)})
		default:
			merged, clean, err := mergeFile(ctx, g, o, b, t)
			if err != nil {
				return res, err
			}
			if !clean {
				res.Conflicts = append(res.Conflicts, Conflict{Path: p, Reason: "both changed the same lines", Merged: merged})
				continue
			}
			writes[p] = []byte(merged)
			res.Merged = append(res.Merged, p)
		}
	}
	if len(res.Conflicts) > 0 {
		return res, nil
	}
	for p, b := range writes {
		name := filepath.FromSlash(p)
		if b == nil {
			if err := draft.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return res, err
			}
			continue
		}
		mode := os.FileMode(0o644)
		if fi, err := draft.Lstat(name); err == nil && fi.Mode().IsRegular() {
			mode = fi.Mode().Perm()
		}
		if err := draft.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			return res, err
		}
		// Replace, never write through: a link the cell put there is
		// removed, not followed.
		if err := draft.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return res, err
		}
		if err := writeNew(draft, name, b, mode); err != nil {
			return res, err
		}
	}
	return res, nil
}

// writeNew creates name beneath root (it must not exist) with b.
func writeNew(root *os.Root, name string, b []byte, mode os.FileMode) error {
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func presence(base, ours, theirs bool) string {
	switch {
	case !base:
		return "added by both the draft and the new release, differently"
	case !ours:
		return "deleted by the draft, changed by the new release"
	default:
		return "changed by the draft, deleted by the new release"
	}
}

// mergeFile merges ours and theirs over base with git merge-file, on
// copies in the host's own directory.
func mergeFile(ctx context.Context, g *hostgit.Git, ours, base, theirs []byte) (string, bool, error) {
	dir, done, err := g.TempDir()
	if err != nil {
		return "", false, err
	}
	defer done()
	for name, b := range map[string][]byte{"draft": ours, "base": base, "release": theirs} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return "", false, err
		}
	}
	out, err := g.Run(ctx, hostgit.Cmd{Dir: dir}, "merge-file", "-p", "-L", "draft", "-L", "base", "-L", "release", "draft", "base", "release")
	switch code := hostgit.ExitCode(err); {
	case err == nil:
		return string(out), true, nil
	case code > 0 && code < 128: // the number of conflicts
		return string(out), false, nil
	default:
		return "", false, err
	}
}

// readDir reads a host-owned tree (a release's) as readRoot does.
func readDir(dir string) (map[string][]byte, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return readRoot(root)
}

// readRoot reads a tree's regular files by slash path (not .git, not
// bytecode), bounded as a release, through root: an entry that is a link
// is skipped, and one swapped for a link while it is read cannot lead
// outside root.
func readRoot(root *os.Root) (map[string][]byte, error) {
	out := map[string][]byte{}
	var total int
	fsys := root.FS()
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "__pycache__") {
			return fs.SkipDir
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := readRootFile(root, p)
		if err != nil {
			return err
		}
		total += len(b)
		if total > MaxTreeBytes || len(out) >= MaxTreeFiles {
			return fmt.Errorf("%w: the tree is over %d bytes or %d files", ErrInvalidTree, MaxTreeBytes, MaxTreeFiles)
		}
		out[p] = b
		return nil
	})
	return out, err
}

func readRootFile(root *os.Root, p string) ([]byte, error) {
	// Non-blocking: an entry swapped for a FIFO must not hold the host.
	f, err := root.OpenFile(filepath.FromSlash(p), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrInvalidTree, p)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("%w: %s is over %d bytes", ErrInvalidTree, p, MaxFileBytes)
	}
	return b, nil
}

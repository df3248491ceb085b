package behavior

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Drafts are git working trees: a draft's repository (.git in its tree,
// which publication skips) has one commit per release it was based on, and
// its HEAD is the release it is drafted from, so a diff or a three-way
// rebase is git's. The host runs git; the model never needs to.

// MaxDiffBytes bounds a diff the host returns.
const MaxDiffBytes = 256 << 10

const gitTimeout = 30 * time.Second

// ErrNoGit reports that git cannot be found.
var ErrNoGit = errors.New("git is not on PATH (drafts are git working trees; install git or, under Nix, use the packaged klbr-core)")

func git(ctx context.Context, dir string, env []string, args ...string) ([]byte, error) {
	bin, err := exec.LookPath("git")
	if err != nil {
		return nil, ErrNoGit
	}
	ctx, cancel := context.WithTimeout(ctx, gitTimeout)
	defer cancel()
	// The tree may belong to the workers' uid: the host reads it anyway.
	cmd := exec.CommandContext(ctx, bin, append([]string{"-c", "safe.directory=*", "-c", "core.autocrlf=false",
		"-c", "core.quotepath=false", "-c", "diff.noprefix=false"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append([]string{"HOME=" + os.TempDir(), "LANG=C.UTF-8", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=klbr", "GIT_AUTHOR_EMAIL=klbr@localhost", "GIT_COMMITTER_NAME=klbr", "GIT_COMMITTER_EMAIL=klbr@localhost",
		"PATH=" + os.Getenv("PATH")}, env...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &limited{b: &out, n: MaxDiffBytes + 1}, &limited{b: &stderr, n: 8 << 10}
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.Bytes(), &gitError{op: args[0], code: ee.ExitCode(), stderr: strings.TrimSpace(stderr.String())}
	}
	if err != nil {
		return out.Bytes(), fmt.Errorf("git %s: %w", args[0], err)
	}
	return out.Bytes(), nil
}

// gitError is git exiting with a status other than 0.
type gitError struct {
	op     string
	code   int
	stderr string
}

func (e *gitError) Error() string {
	return fmt.Sprintf("git %s: exit status %d: %s", e.op, e.code, e.stderr)
}

// exitCode is err's git exit status, or -1.
func exitCode(err error) int {
	var ge *gitError
	if errors.As(err, &ge) {
		return ge.code
	}
	return -1
}

// limited keeps the first n bytes written to it and drops the rest.
type limited struct {
	b *bytes.Buffer
	n int
}

func (l *limited) Write(p []byte) (int, error) {
	if room := l.n - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// withIndex runs fn with a scratch index file, so the draft's own index is
// never touched by the host.
func withIndex(fn func(env []string) error) error {
	f, err := os.CreateTemp("", "klbr-index-")
	if err != nil {
		return err
	}
	name := f.Name()
	f.Close()
	os.Remove(name) // git wants to create it
	defer os.Remove(name)
	return fn([]string{"GIT_INDEX_FILE=" + name})
}

// commitTree commits the files of dir (a release tree) into the repository
// of repo as a child of parent ("" for none) and returns the commit.
func commitTree(ctx context.Context, repo, dir, parent, message string) (string, error) {
	var commit string
	err := withIndex(func(env []string) error {
		gd := []string{"--git-dir=" + filepath.Join(repo, ".git"), "--work-tree=" + dir}
		if _, err := git(ctx, repo, env, append(gd, "add", "-A")...); err != nil {
			return err
		}
		tree, err := git(ctx, repo, env, append(gd, "write-tree")...)
		if err != nil {
			return err
		}
		args := []string{"commit-tree", strings.TrimSpace(string(tree)), "-m", message}
		if parent != "" {
			args = append(args, "-p", parent)
		}
		out, err := git(ctx, repo, env, append(gd, args...)...)
		commit = strings.TrimSpace(string(out))
		return err
	})
	return commit, err
}

// InitDraft makes tree (a fresh copy of release's files) a git working tree
// whose HEAD commit is release.
func InitDraft(ctx context.Context, tree, release string) error {
	if _, err := git(ctx, tree, nil, "init", "-q", "-b", "draft"); err != nil {
		return err
	}
	commit, err := commitTree(ctx, tree, tree, "", "release "+release)
	if err != nil {
		return err
	}
	if _, err := git(ctx, tree, nil, "update-ref", "HEAD", commit); err != nil {
		return err
	}
	_, err = git(ctx, tree, nil, "read-tree", "HEAD")
	return err
}

// DraftDiff is the diff of a draft's files against its HEAD (the release
// it is based on), new files included, bounded by MaxDiffBytes.
func DraftDiff(ctx context.Context, tree string) (diff string, truncated bool, err error) {
	err = withIndex(func(env []string) error {
		if _, err := git(ctx, tree, env, "read-tree", "HEAD"); err != nil {
			return err
		}
		if _, err := git(ctx, tree, env, "add", "-A"); err != nil {
			return err
		}
		out, err := git(ctx, tree, env, "diff", "--cached", "--no-color", "--no-ext-diff", "HEAD")
		diff = string(out)
		return err
	})
	diff, truncated = bound(diff)
	return diff, truncated, err
}

func bound(s string) (string, bool) {
	if len(s) <= MaxDiffBytes {
		return s, false
	}
	return strings.ToValidUTF8(s[:MaxDiffBytes], ""), true
}

// Diff is the diff from release a's tree to release b's, with paths
// relative to the trees, bounded by MaxDiffBytes.
func (r *Releases) Diff(ctx context.Context, a, b string) (string, bool, error) {
	for _, id := range []string{a, b} {
		if _, err := r.Verify(id); err != nil {
			return "", false, err
		}
	}
	out, err := git(ctx, r.dir, nil, "diff", "--no-index", "--no-color", "--no-ext-diff",
		"--src-prefix=a/", "--dst-prefix=b/", filepath.Join(a, "tree"), filepath.Join(b, "tree"))
	if err != nil && exitCode(err) != 1 { // 1: the trees differ
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

// Rebase brings the draft tree, based on the release tree base, onto the
// release tree onto, three-way, file by file: a file only the new release
// changed is taken, one only the draft changed is kept, one both changed is
// merged by git merge-file. When any file conflicts, nothing is written and
// every conflict is reported. On success the draft's HEAD becomes a commit
// of onto (child of the old HEAD), labelled newRelease.
func Rebase(ctx context.Context, tree, base, onto, newRelease string) (RebaseResult, error) {
	res := RebaseResult{Taken: []string{}, Merged: []string{}, Conflicts: []Conflict{}}
	files := map[string]bool{}
	read := map[string]map[string][]byte{}
	for name, dir := range map[string]string{"base": base, "ours": tree, "theirs": onto} {
		m, err := readFiles(dir)
		if err != nil {
			return res, err
		}
		read[name] = m
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
			merged, clean, err := mergeFile(ctx, o, b, t)
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
		dst := filepath.Join(tree, filepath.FromSlash(p))
		if b == nil {
			if err := os.Remove(dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return res, err
			}
			continue
		}
		mode := os.FileMode(0o644)
		if fi, err := os.Stat(dst); err == nil {
			mode = fi.Mode().Perm()
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return res, err
		}
		if err := os.WriteFile(dst, b, mode); err != nil {
			return res, err
		}
	}
	head, err := git(ctx, tree, nil, "rev-parse", "HEAD")
	if err != nil {
		return res, err
	}
	commit, err := commitTree(ctx, tree, onto, strings.TrimSpace(string(head)), "release "+newRelease)
	if err != nil {
		return res, err
	}
	if _, err := git(ctx, tree, nil, "update-ref", "HEAD", commit); err != nil {
		return res, err
	}
	_, err = git(ctx, tree, nil, "read-tree", "HEAD")
	return res, err
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

// mergeFile merges ours and theirs over base with git merge-file.
func mergeFile(ctx context.Context, ours, base, theirs []byte) (string, bool, error) {
	dir, err := os.MkdirTemp("", "klbr-merge-")
	if err != nil {
		return "", false, err
	}
	defer os.RemoveAll(dir)
	for name, b := range map[string][]byte{"draft": ours, "base": base, "release": theirs} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return "", false, err
		}
	}
	out, err := git(ctx, dir, nil, "merge-file", "-p", "-L", "draft", "-L", "base", "-L", "release", "draft", "base", "release")
	switch code := exitCode(err); {
	case err == nil:
		return string(out), true, nil
	case code > 0 && code < 128: // the number of conflicts
		return string(out), false, nil
	default:
		return "", false, err
	}
}

// readFiles reads a tree's regular files by slash path (not .git, not
// bytecode), bounded as a release.
func readFiles(dir string) (map[string][]byte, error) {
	out := map[string][]byte{}
	var total int
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "__pycache__") {
			return fs.SkipDir
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := readBounded(p)
		if err != nil {
			return err
		}
		total += len(b)
		if total > MaxTreeBytes || len(out) >= MaxTreeFiles {
			return fmt.Errorf("%w: the tree is over %d bytes or %d files", ErrInvalidTree, MaxTreeBytes, MaxTreeFiles)
		}
		rel, _ := filepath.Rel(dir, p)
		out[filepath.ToSlash(rel)] = b
		return nil
	})
	return out, err
}

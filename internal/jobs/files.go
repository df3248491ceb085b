package jobs

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/klbr-dev/klbr/internal/celltree"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/kernel"
	"github.com/klbr-dev/klbr/internal/store"
)

// Bounds of a command's inputs= and outputs=.
const (
	MaxInputPaths   = 64       // paths named in inputs=
	MaxInputFiles   = 10_000   // files and directories copied in
	MaxInputsBytes  = 64 << 20 // bytes of the files copied in
	MaxOutputGlobs  = 64       // globs in outputs=
	MaxOutputFiles  = 100      // files brought back as artifacts
	MaxOutputsBytes = 1 << 30  // bytes of those files, together
	maxFilePathLen  = 1024
	maxSkipsListed  = 20 // what was left out, listed in a result
)

// reserved names a job's directory holds of klbr's own: its output (stdout
// and stderr) and its temporary directory. No input lands on them, and no
// output glob matches them.
var reserved = []string{"output", "tmp"}

// checkInputs refuses input paths that are not clean relative paths of
// the workspace, or that would land on a reserved name.
func checkInputs(paths []string) error {
	if len(paths) > MaxInputPaths {
		return fmt.Errorf("inputs: at most %d paths", MaxInputPaths)
	}
	for _, p := range paths {
		if !cleanPath(p) {
			return fmt.Errorf("inputs: %q is not a clean path relative to the workspace (no leading /, no ..)", p)
		}
		if first, _, _ := strings.Cut(p, "/"); slices.Contains(reserved, first) {
			return fmt.Errorf("inputs: %q would land on the job's own %q; rename it", p, first)
		}
	}
	return nil
}

// checkGlobs refuses output globs that are not relative patterns inside
// the job's directory: no leading /, no "..", a valid pattern in each part.
func checkGlobs(globs []string) error {
	if len(globs) > MaxOutputGlobs {
		return fmt.Errorf("outputs: at most %d globs", MaxOutputGlobs)
	}
	for _, g := range globs {
		if !cleanPath(g) {
			return fmt.Errorf("outputs: %q leaves the job's directory or is not clean (a glob is relative, without ..)", g)
		}
		for _, part := range strings.Split(g, "/") {
			if part == "**" {
				continue
			}
			if _, err := path.Match(part, ""); err != nil {
				return fmt.Errorf("outputs: %q: %w", g, err)
			}
		}
	}
	return nil
}

func cleanPath(p string) bool {
	return p != "" && p != "." && len(p) <= maxFilePathLen && !path.IsAbs(p) && path.Clean(p) == p &&
		p != ".." && !strings.HasPrefix(p, "../") && !strings.ContainsRune(p, 0)
}

// matchGlob says whether the slash path name matches glob: path.Match for
// each part, and a part "**" for any number of parts (none too).
func matchGlob(glob, name string) bool {
	return matchParts(strings.Split(glob, "/"), strings.Split(name, "/"))
}

func matchParts(g, n []string) bool {
	for len(g) > 0 {
		if g[0] == "**" {
			for i := 0; i <= len(n); i++ {
				if matchParts(g[1:], n[i:]) {
					return true
				}
			}
			return false
		}
		if len(n) == 0 {
			return false
		}
		if ok, _ := path.Match(g[0], n[0]); !ok {
			return false
		}
		g, n = g[1:], n[1:]
	}
	return len(n) == 0
}

// selectOutputs picks the files that match any glob, in path order, and
// says what was left out by the bounds.
func selectOutputs(files []hosts.File, globs []string) (picked []hosts.File, skipped []string) {
	slices.SortFunc(files, func(a, b hosts.File) int { return strings.Compare(a.Path, b.Path) })
	var total int64
	for _, f := range files {
		if first, _, _ := strings.Cut(f.Path, "/"); slices.Contains(reserved, first) {
			continue
		}
		if !slices.ContainsFunc(globs, func(g string) bool { return matchGlob(g, f.Path) }) {
			continue
		}
		switch {
		case len(f.Path) > maxFilePathLen:
			skipped = append(skipped, fmt.Sprintf("%s…: a path longer than %d bytes", f.Path[:64], maxFilePathLen))
		case len(picked) == MaxOutputFiles:
			skipped = append(skipped, f.Path+": more than "+fmt.Sprint(MaxOutputFiles)+" files matched")
		case total+f.Size > MaxOutputsBytes:
			skipped = append(skipped, fmt.Sprintf("%s: %d bytes, over the %d bytes all outputs may hold", f.Path, f.Size, MaxOutputsBytes))
		default:
			picked = append(picked, f)
			total += f.Size
		}
	}
	if len(skipped) > maxSkipsListed {
		skipped = append(skipped[:maxSkipsListed], fmt.Sprintf("and %d more", len(skipped)-maxSkipsListed))
	}
	return picked, skipped
}

// packInputs packs the named paths of the workspace (files, and
// directories with what is beneath them) as one tree with their paths
// relative to the workspace, read through celltree: no link is followed.
// A named path that is a link, or not a file or directory, is refused; a
// link or special file inside a named directory is left out and reported.
// The same files give the same bytes, hence the same hash.
func packInputs(workspace string, paths []string) (t hosts.Tree, skipped []string, err error) {
	root, err := celltree.Open(workspace)
	if err != nil {
		return t, nil, fmt.Errorf("inputs: %w", err)
	}
	defer root.Close()
	type entry struct {
		path string
		dir  bool
	}
	seen := map[string]bool{}
	var entries []entry
	skips := 0
	skip := func(why string) {
		skips++
		if len(skipped) < maxSkipsListed {
			skipped = append(skipped, why)
		}
	}
	add := func(p string, dir bool) error {
		if seen[p] {
			return nil
		}
		seen[p] = true
		// The directories on the way, so that a file's parents exist.
		for d := path.Dir(p); d != "." && !seen[d]; d = path.Dir(d) {
			seen[d] = true
			entries = append(entries, entry{d, true})
		}
		entries = append(entries, entry{p, dir})
		if len(entries)+skips > MaxInputFiles {
			return fmt.Errorf("inputs: more than %d files and directories", MaxInputFiles)
		}
		return nil
	}
	for _, p := range paths {
		fi, err := root.Lstat(p)
		if err != nil {
			return t, nil, fmt.Errorf("inputs: %w", err)
		}
		switch {
		case fi.Mode().IsRegular():
			if err := add(p, false); err != nil {
				return t, nil, err
			}
		case fi.IsDir():
			sub, err := root.OpenRoot(p)
			if err != nil {
				return t, nil, fmt.Errorf("inputs: %w", err)
			}
			if err := add(p, true); err != nil {
				sub.Close()
				return t, nil, err
			}
			err = sub.Walk(func(e *celltree.Entry) error {
				full := path.Join(p, e.Path)
				switch {
				case e.Type.IsDir():
					return add(full, true)
				case e.Type.IsRegular():
					return add(full, false)
				}
				skip(full + ": not a regular file or directory (links are not followed)")
				return nil
			})
			sub.Close()
			if err != nil {
				return t, nil, fmt.Errorf("inputs: %w", err)
			}
		default:
			return t, nil, fmt.Errorf("inputs: %s: %w", p, celltree.ErrNotRegular)
		}
	}
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.path, b.path) })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	var total int64
	for _, e := range entries {
		if e.dir {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: e.path + "/", Mode: 0o755, Format: tar.FormatPAX}); err != nil {
				return t, nil, err
			}
			continue
		}
		if err := writeInput(tw, root, e.path, &total); err != nil {
			if errors.Is(err, celltree.ErrLink) || errors.Is(err, celltree.ErrNotRegular) || errors.Is(err, celltree.ErrHardLink) || errors.Is(err, fs.ErrNotExist) {
				skip(e.path + ": " + err.Error())
				continue
			}
			return t, nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return t, nil, err
	}
	if skips > len(skipped) {
		skipped = append(skipped, fmt.Sprintf("and %d more", skips-len(skipped)))
	}
	sum := sha256.Sum256(buf.Bytes())
	return hosts.Tree{Hash: hex.EncodeToString(sum[:]), Tar: buf.Bytes()}, skipped, nil
}

func writeInput(tw *tar.Writer, root *celltree.Root, rel string, total *int64) error {
	f, err := root.OpenFile(rel)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if *total+fi.Size() > MaxInputsBytes {
		return fmt.Errorf("inputs: more than %d bytes (at %s)", MaxInputsBytes, rel)
	}
	*total += fi.Size()
	mode := int64(0o644)
	if fi.Mode().Perm()&0o100 != 0 {
		mode = 0o755
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: mode, Size: fi.Size(), Format: tar.FormatPAX}); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, f, fi.Size()); err != nil {
		return fmt.Errorf("inputs: %s changed while it was read: %w", rel, err)
	}
	return nil
}

// keepFile stores one output file of size bytes, read from r, as an
// artifact, within what is left of budget; a file over it is left out with
// a note. A file that is not size bytes long when read is left out too.
func (m *Manager) keepFile(name string, size int64, r io.Reader, budget *int64) (store.JobFile, string, error) {
	if size > *budget {
		return store.JobFile{}, fmt.Sprintf("%s: %d bytes, over the %d bytes all outputs may hold", name, size, MaxOutputsBytes), nil
	}
	sp, err := m.cfg.Artifacts.NewSpool()
	if err != nil {
		return store.JobFile{}, "", fmt.Errorf("outputs: %w", err)
	}
	n, err := io.Copy(sp, io.LimitReader(r, size))
	if err != nil {
		sp.Discard()
		return store.JobFile{}, "", fmt.Errorf("outputs: %s: %w", name, err)
	}
	if n != size {
		sp.Discard()
		return store.JobFile{}, fmt.Sprintf("%s: changed while it was read", name), nil
	}
	ref, err := sp.Commit()
	if err != nil {
		return store.JobFile{}, "", fmt.Errorf("outputs: %s: %w", name, err)
	}
	*budget -= size
	return store.JobFile{Path: name, Artifact: "a" + ref.SHA256, Size: ref.Size}, "", nil
}

// addFiles puts a run's files and what was left out into its result and
// its end.
func addFiles(result map[string]any, e *store.JobEnd, files []store.JobFile, outSkipped, inSkipped []string) {
	if files != nil || outSkipped != nil {
		if files == nil {
			files = []store.JobFile{}
		}
		result["artifacts"] = files
		e.Files = files
	}
	if len(outSkipped) > 0 {
		result["outputs_skipped"] = outSkipped
	}
	if len(inSkipped) > 0 {
		result["inputs_skipped"] = inSkipped
	}
}

// jobsDir holds the own directories of local jobs with inputs or outputs:
// <data>/jobs/<job>-<run>. The data directory is hidden from workers; each
// job's sandbox gets its own directory back, writable, and no other.
func (m *Manager) jobsDir() string { return filepath.Join(m.cfg.Store.Dir(), "jobs") }

// localDir makes a local job's own directory with its inputs copied in
// (from workspace root, through celltree), owned by the uid its sandbox
// drops to, and returns it with the sandbox that lets the job write it.
func (m *Manager) localDir(j store.Job, s CommandSpec, root string, sb kernel.Sandbox) (string, kernel.Sandbox, []string, error) {
	base := m.jobsDir()
	if err := os.MkdirAll(base, 0o711); err != nil {
		return "", sb, nil, fmt.Errorf("the job's directory: %w", err)
	}
	if err := os.Chmod(base, 0o711); err != nil {
		return "", sb, nil, fmt.Errorf("the job's directory: %w", err)
	}
	dir := filepath.Join(base, fmt.Sprintf("%d-%d", j.ID, j.Runs))
	if err := os.RemoveAll(dir); err != nil {
		return "", sb, nil, fmt.Errorf("the job's directory: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", sb, nil, fmt.Errorf("the job's directory: %w", err)
	}
	var skipped []string
	if len(s.Inputs) > 0 {
		tree, sk, err := packInputs(root, s.Inputs)
		if err != nil {
			return dir, sb, nil, err
		}
		skipped = sk
		if err := unpack(tree.Tar, dir); err != nil {
			return dir, sb, nil, fmt.Errorf("inputs: %w", err)
		}
	}
	if sb.DropUser {
		err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, sb.UID, sb.GID)
		})
		if err != nil {
			return dir, sb, nil, fmt.Errorf("the job's directory: %w", err)
		}
	}
	sb.ReadWrite = append(slices.Clone(sb.ReadWrite), dir)
	return dir, sb, skipped, nil
}

// unpack writes a tree packInputs made (directories and regular files of
// clean relative names) into the empty directory dir.
func unpack(b []byte, dir string) error {
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := strings.TrimSuffix(hdr.Name, "/")
		if !cleanPath(name) {
			return fmt.Errorf("%q is not a clean relative path", hdr.Name)
		}
		p := filepath.Join(dir, filepath.FromSlash(name))
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, os.FileMode(hdr.Mode).Perm())
			if err != nil {
				return err
			}
			_, err = io.CopyN(f, tr, hdr.Size)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("%q: not a file or directory", hdr.Name)
		}
	}
}

// localOutputs brings the files of a local job's directory that match
// globs back as artifacts, read through celltree (the job wrote them: no
// link is followed, no special file opened).
func (m *Manager) localOutputs(dir string, globs []string) ([]store.JobFile, []string, error) {
	if m.cfg.Artifacts == nil {
		return nil, []string{"no artifact store here"}, nil
	}
	root, err := celltree.Open(dir)
	if err != nil {
		return nil, nil, err
	}
	defer root.Close()
	var listed []hosts.File
	err = root.Walk(func(e *celltree.Entry) error {
		if e.Path == "output" || e.Path == "tmp" {
			if e.Type.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if !e.Type.IsRegular() {
			return nil
		}
		if len(listed) == hosts.MaxListed {
			return fmt.Errorf("more than %d files in the job's directory", hosts.MaxListed)
		}
		fi, err := e.Stat()
		if err != nil {
			return err
		}
		listed = append(listed, hosts.File{Path: e.Path, Size: fi.Size()})
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	picked, skipped := selectOutputs(listed, globs)
	var files []store.JobFile
	var budget int64 = MaxOutputsBytes
	for _, p := range picked {
		f, err := root.OpenFile(p.Path)
		if err != nil {
			skipped = append(skipped, err.Error())
			continue
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return files, skipped, err
		}
		jf, note, err := m.keepFile(p.Path, fi.Size(), f, &budget)
		f.Close()
		if err != nil {
			return files, skipped, err
		}
		if note != "" {
			skipped = append(skipped, note)
		}
		if jf.Artifact != "" {
			files = append(files, jf)
		}
	}
	return files, skipped, nil
}

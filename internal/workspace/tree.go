package workspace

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/klbr-dev/klbr/internal/celltree"
	"github.com/klbr-dev/klbr/internal/hosts"
)

// maxTarName bounds a name in a tree archive a host sends.
const maxTarName = 4096

// packTree packs the tree beneath dir, a directory a cell can write, as a
// tar archive for a host (hosts.Tree): read with celltree, so no link is
// followed and a file swapped for a link while it is read fails the pack;
// regular files (with their permission bits) and directories only, every
// .git and the directories of exclude (by device and inode) left out;
// links and other kinds are left out too, and counted. Bounded by lim.
func packTree(dir string, lim Limits, exclude []string) (hosts.Tree, int, error) {
	root, err := celltree.Open(dir)
	if err != nil {
		return hosts.Tree{}, 0, err
	}
	defer root.Close()
	return packRoot(root, lim, exclude)
}

// packRoot is packTree of an open root.
func packRoot(root *celltree.Root, lim Limits, exclude []string) (t hosts.Tree, skipped int, err error) {
	dir := root.Name()
	type devIno struct{ dev, ino uint64 }
	skip := map[devIno]bool{}
	for _, x := range exclude {
		var st unix.Stat_t
		if unix.Stat(x, &st) == nil {
			skip[devIno{st.Dev, st.Ino}] = true
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	entries, size := 0, int64(0)
	err = root.Walk(func(e *celltree.Entry) error {
		if path.Base(e.Path) == ".git" {
			if e.Type.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if entries++; entries > lim.MaxFiles {
			return fmt.Errorf("%w: more than %d entries", ErrTooLarge, lim.MaxFiles)
		}
		info, err := e.Stat()
		if err != nil {
			return err
		}
		st, _ := info.Sys().(*unix.Stat_t)
		hdr := &tar.Header{Name: e.Path, Mode: int64(info.Mode().Perm()), Format: tar.FormatPAX}
		switch {
		case e.Type.IsDir():
			if st != nil && skip[devIno{st.Dev, st.Ino}] {
				return fs.SkipDir
			}
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
			return tw.WriteHeader(hdr)
		case e.Type.IsRegular():
			f, err := e.Open()
			if err != nil {
				return err
			}
			defer f.Close()
			fi, err := f.Stat()
			if err != nil {
				return err
			}
			if size += fi.Size(); size > lim.MaxBytes || buf.Len()+int(fi.Size()) > hosts.MaxTreeBytes {
				return fmt.Errorf("%w: more than %d bytes", ErrTooLarge, min(lim.MaxBytes, hosts.MaxTreeBytes))
			}
			hdr.Typeflag, hdr.Size, hdr.Mode = tar.TypeReg, fi.Size(), int64(fi.Mode().Perm())
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if _, err := io.CopyN(tw, f, fi.Size()); err != nil {
				return fmt.Errorf("%s changed while it was read: %w", e.Path, err)
			}
			return nil
		}
		skipped++
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		return hosts.Tree{}, skipped, fmt.Errorf("pack %s: %w", dir, err)
	}
	sum := sha256.Sum256(buf.Bytes())
	return hosts.Tree{Hash: hex.EncodeToString(sum[:]), Tar: buf.Bytes()}, skipped, nil
}

// errTreeName refuses an archive entry whose name could leave the tree.
var errTreeName = errors.New("not a plain relative name")

// readTree reads a tree archive (one packTree made, or a host's tar of a
// workspace) and calls fn with each regular file's slash path and content,
// within lim: at most lim.MaxFiles entries and lim.MaxBytes bytes of files.
// Names are checked, never trusted: one that is absolute, climbs out (..),
// is not clean or holds a NUL refuses the archive; .git and what is in it
// is left out; directories are passed over and links and other kinds left
// out and counted.
func readTree(r io.Reader, lim Limits, fn func(name string, data []byte) error) (skipped int, err error) {
	links := 0
	skipped, err = readEntries(r, lim, func(e treeEntry) error {
		if e.Link {
			links++
			return nil
		}
		return fn(e.Name, e.Data)
	})
	return skipped + links, err
}

// treeEntry is a file of a tree archive: a regular file (its content, and
// whether its owner may execute it) or a symbolic link (its target, as the
// archive says it: text, never followed).
type treeEntry struct {
	Name string
	Data []byte
	Exec bool
	Link bool
}

// readEntries is readTree with symbolic links passed on too (Link, the
// target in Data: at most maxTarName bytes, no NUL, counted in
// lim.MaxBytes) and each file's executable bit. A name beneath a link's is
// refused: a tree holds no path through a link.
func readEntries(r io.Reader, lim Limits, fn func(treeEntry) error) (skipped int, err error) {
	var links, names []string
	defer func() {
		if err == nil {
			err = checkBeneathLinks(links, names)
		}
	}()
	tr := tar.NewReader(r)
	entries, size := 0, int64(0)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return skipped, nil
		}
		if err != nil {
			return skipped, fmt.Errorf("read tree: %w", err)
		}
		if entries++; entries > lim.MaxFiles {
			return skipped, fmt.Errorf("read tree: %w: more than %d entries", ErrTooLarge, lim.MaxFiles)
		}
		name, err := treeName(h.Name)
		if err != nil {
			return skipped, fmt.Errorf("read tree: %q: %w", truncate(h.Name, 200), err)
		}
		if name == "" || hasGit(name) {
			continue
		}
		switch h.Typeflag {
		case tar.TypeDir:
			names = append(names, name)
			continue
		case tar.TypeReg:
		case tar.TypeSymlink:
			t := h.Linkname
			if t == "" || len(t) > maxTarName || strings.IndexByte(t, 0) >= 0 {
				return skipped, fmt.Errorf("read tree: %s: a link whose target is empty, overlong or holds a NUL", name)
			}
			if size += int64(len(t)); size > lim.MaxBytes {
				return skipped, fmt.Errorf("read tree: %w: more than %d bytes", ErrTooLarge, lim.MaxBytes)
			}
			links, names = append(links, name), append(names, name)
			if err := fn(treeEntry{Name: name, Data: []byte(t), Link: true}); err != nil {
				return skipped, err
			}
			continue
		default:
			skipped++
			continue
		}
		names = append(names, name)
		if h.Size < 0 || size+h.Size > lim.MaxBytes {
			return skipped, fmt.Errorf("read tree: %w: more than %d bytes", ErrTooLarge, lim.MaxBytes)
		}
		size += h.Size
		data, err := io.ReadAll(io.LimitReader(tr, h.Size))
		if err != nil {
			return skipped, fmt.Errorf("read tree: %s: %w", name, err)
		}
		if int64(len(data)) != h.Size {
			return skipped, fmt.Errorf("read tree: %s: %d bytes of %d", name, len(data), h.Size)
		}
		if err := fn(treeEntry{Name: name, Data: data, Exec: h.Mode&0o100 != 0}); err != nil {
			return skipped, err
		}
	}
}

// checkBeneathLinks refuses names that go through a link of links, and a
// name given twice.
func checkBeneathLinks(links, names []string) error {
	if len(links) == 0 {
		return nil
	}
	isLink := make(map[string]bool, len(links))
	for _, l := range links {
		isLink[l] = true
	}
	seen := make(map[string]bool, len(names))
	for _, n := range names {
		if seen[n] {
			return fmt.Errorf("read tree: %q: %w", truncate(n, 200), errTreeTwice)
		}
		seen[n] = true
		for p := path.Dir(n); p != "."; p = path.Dir(p) {
			if isLink[p] {
				return fmt.Errorf("read tree: %q: %w", truncate(n, 200), errBeneathLink)
			}
		}
	}
	return nil
}

var (
	errBeneathLink = errors.New("a name beneath a link")
	errTreeTwice   = errors.New("a name given twice in a tree with links")
)

// treeName is an archive entry's name as a clean relative slash path ("."
// and "./" prefixes dropped; "" for the tree itself).
func treeName(n string) (string, error) {
	if len(n) > maxTarName || strings.IndexByte(n, 0) >= 0 {
		return "", errTreeName
	}
	n = strings.TrimSuffix(n, "/")
	for strings.HasPrefix(n, "./") {
		n = n[2:]
	}
	if n == "." || n == "" {
		return "", nil
	}
	if strings.HasPrefix(n, "/") || path.Clean(n) != n || n == ".." || strings.HasPrefix(n, "../") {
		return "", errTreeName
	}
	return n, nil
}

// hasGit reports whether a component of name is .git.
func hasGit(name string) bool {
	for _, c := range strings.Split(name, "/") {
		if c == ".git" {
			return true
		}
	}
	return false
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

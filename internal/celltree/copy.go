package celltree

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// Options bound and shape a copy.
type Options struct {
	// MaxEntries bounds the entries visited (files, directories, links and
	// skipped ones; the root aside); 0: no bound.
	MaxEntries int
	// MaxBytes bounds the bytes of regular files copied; 0: no bound.
	MaxBytes int64
	// MaxDepth bounds the directories descended; 0: DefaultMaxDepth.
	MaxDepth int
	// Exclude lists directories left out (with what is beneath them),
	// known by device and inode, so no name or link can stand in for them.
	Exclude []string
	// Writable gives the owner write permission on every copied file and
	// directory (a draft of a read-only release).
	Writable bool
}

// Result is what a copy did.
type Result struct {
	Files, Dirs, Links int
	Bytes              int64
	// Skipped lists (the first MaxSkipsListed of) the entries left out,
	// SkippedCount counts them all.
	Skipped      []Skip
	SkippedCount int
}

// Skip is one entry a copy left out and why.
type Skip struct {
	Path string `json:"path"`
	Why  string `json:"why"`
}

// MaxSkipsListed bounds Result.Skipped.
const MaxSkipsListed = 64

type devIno struct{ dev, ino uint64 }

// Copy copies the tree at src to dst, a new directory, as (*Root).Copy.
func Copy(src, dst string, o Options) (Result, error) {
	r, err := Open(src)
	if err != nil {
		return Result{}, err
	}
	defer r.Close()
	return r.Copy(dst, o)
}

// Copy copies the tree beneath r into dst, which it creates (it must not
// exist; its parent is the caller's, not a cell's): regular files with
// their permission bits (no set-id or sticky bit), directories, and the
// links whose target stays inside the tree; other links, FIFOs, sockets
// and devices are skipped and reported. A file with other hard links
// fails the copy (ErrHardLink), as does going over o's bounds
// (ErrTooLarge). On failure nothing is left at dst.
func (r *Root) Copy(dst string, o Options) (res Result, err error) {
	if err := unix.Mkdir(dst, 0o700); err != nil {
		return res, &os.PathError{Op: "mkdir", Path: dst, Err: err}
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dst)
		}
	}()
	dfd, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return res, &os.PathError{Op: "open", Path: dst, Err: err}
	}
	defer unix.Close(dfd)
	c := &copier{r: r, o: o, res: &res, excl: map[devIno]bool{}}
	if c.o.MaxDepth <= 0 {
		c.o.MaxDepth = DefaultMaxDepth
	}
	var st unix.Stat_t
	for _, e := range o.Exclude {
		if unix.Stat(e, &st) == nil {
			c.excl[devIno{st.Dev, st.Ino}] = true
		}
	}
	if unix.Fstat(dfd, &st) == nil {
		c.excl[devIno{st.Dev, st.Ino}] = true // dst inside the tree
	}
	if err := unix.Fstat(r.fd, &st); err != nil {
		return res, err
	}
	if err := c.dir(r.fd, dfd, ".", 0); err != nil {
		return res, err
	}
	return res, unix.Fchmod(dfd, c.dirPerm(st.Mode))
}

type copier struct {
	r    *Root
	o    Options
	res  *Result
	excl map[devIno]bool
	bufs [][]byte // a getdents buffer per depth
	seen int
}

func (c *copier) display(rel string) string { return path.Join(c.r.name, rel) }

func (c *copier) skip(rel, why string) {
	c.res.SkippedCount++
	if len(c.res.Skipped) < MaxSkipsListed {
		c.res.Skipped = append(c.res.Skipped, Skip{Path: rel, Why: why})
	}
}

func (c *copier) dirPerm(mode uint32) uint32 {
	p := mode & 0o777
	if c.o.Writable {
		p |= 0o700
	}
	return p
}

func (c *copier) filePerm(mode uint32) uint32 {
	p := mode & 0o777
	if c.o.Writable {
		p |= 0o600
	}
	return p
}

// dir copies the entries of the directory sfd into dfd.
func (c *copier) dir(sfd, dfd int, rel string, depth int) error {
	if depth >= c.o.MaxDepth {
		return fmt.Errorf("%s: %w: deeper than %d directories", c.display(rel), ErrTooLarge, c.o.MaxDepth)
	}
	for len(c.bufs) <= depth {
		c.bufs = append(c.bufs, make([]byte, 16<<10))
	}
	err := readDir(sfd, c.bufs[depth], func(name string, typ uint8) error {
		crel := path.Join(rel, name)
		if typ == unix.DT_UNKNOWN {
			var st unix.Stat_t
			if err := unix.Fstatat(sfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if errors.Is(err, unix.ENOENT) {
					return nil // gone since the listing
				}
				return &os.PathError{Op: "stat", Path: c.display(crel), Err: err}
			}
			typ = dtype(st.Mode)
		}
		if c.seen++; c.o.MaxEntries > 0 && c.seen > c.o.MaxEntries {
			return fmt.Errorf("%s: %w: more than %d entries", c.r.name, ErrTooLarge, c.o.MaxEntries)
		}
		switch typ {
		case unix.DT_DIR:
			return c.subdir(sfd, dfd, name, crel, depth)
		case unix.DT_REG:
			return c.file(sfd, dfd, name, crel)
		case unix.DT_LNK:
			return c.link(sfd, dfd, name, crel)
		}
		c.skip(crel, "not a regular file, directory or link (a FIFO, socket or device is never opened)")
		return nil
	})
	if err != nil && !isOurs(err) {
		err = &os.PathError{Op: "readdir", Path: c.display(rel), Err: err}
	}
	return err
}

// isOurs tells an error that already names its path.
func isOurs(err error) bool {
	var pe *os.PathError
	return errors.As(err, &pe) || errors.Is(err, ErrTooLarge) || errors.Is(err, ErrHardLink)
}

// changed handles an entry that is no longer what the listing said:
// whatever it is now is judged afresh, never followed.
func (c *copier) changed(sfd, dfd int, name, crel string, depth int) error {
	var st unix.Stat_t
	if err := unix.Fstatat(sfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return &os.PathError{Op: "stat", Path: c.display(crel), Err: err}
	}
	switch dtype(st.Mode) {
	case unix.DT_LNK:
		return c.link(sfd, dfd, name, crel)
	case unix.DT_DIR:
		if depth < 0 {
			break // it was a directory already
		}
		return c.subdir(sfd, dfd, name, crel, depth)
	}
	c.skip(crel, "changed while it was copied")
	return nil
}

func (c *copier) subdir(sfd, dfd int, name, crel string, depth int) error {
	child, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
		return c.changed(sfd, dfd, name, crel, -1)
	case err != nil:
		return &os.PathError{Op: "open", Path: c.display(crel), Err: err}
	}
	defer unix.Close(child)
	var st unix.Stat_t
	if err := unix.Fstat(child, &st); err != nil {
		return &os.PathError{Op: "stat", Path: c.display(crel), Err: err}
	}
	if c.excl[devIno{st.Dev, st.Ino}] {
		c.seen--
		return nil
	}
	if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
		return &os.PathError{Op: "mkdir", Path: crel, Err: err}
	}
	dchild, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: crel, Err: err}
	}
	defer unix.Close(dchild)
	c.res.Dirs++
	if err := c.dir(child, dchild, crel, depth+1); err != nil {
		return err
	}
	return unix.Fchmod(dchild, c.dirPerm(st.Mode))
}

func (c *copier) file(sfd, dfd int, name, crel string) error {
	in, st, err := openRegular(sfd, name, unix.DT_REG, c.display(crel))
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, ErrLink), errors.Is(err, ErrNotRegular):
		return c.changed(sfd, dfd, name, crel, -1)
	case err != nil:
		return err
	}
	defer in.Close()
	left := int64(-1)
	if c.o.MaxBytes > 0 {
		if left = c.o.MaxBytes - c.res.Bytes; st.Size > left {
			return fmt.Errorf("%s: %w: more than %d bytes", c.r.name, ErrTooLarge, c.o.MaxBytes)
		}
	}
	ofd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, c.filePerm(st.Mode))
	if err != nil {
		return &os.PathError{Op: "create", Path: crel, Err: err}
	}
	out := os.NewFile(uintptr(ofd), crel)
	var n int64
	if left >= 0 {
		n, err = io.Copy(out, &io.LimitedReader{R: in, N: left + 1})
	} else {
		n, err = io.Copy(out, in)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return &os.PathError{Op: "copy", Path: c.display(crel), Err: err}
	}
	if c.res.Bytes += n; left >= 0 && n > left {
		return fmt.Errorf("%s: %w: more than %d bytes", c.r.name, ErrTooLarge, c.o.MaxBytes)
	}
	c.res.Files++
	return nil
}

func (c *copier) link(sfd, dfd int, name, crel string) error {
	buf := make([]byte, 4096)
	n, err := unix.Readlinkat(sfd, name, buf)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.EINVAL):
		c.skip(crel, "changed while it was copied")
		return nil
	case err != nil:
		return &os.PathError{Op: "readlink", Path: c.display(crel), Err: err}
	case n >= len(buf):
		c.skip(crel, "a link with an overlong target")
		return nil
	}
	target := string(buf[:n])
	if !Inside(path.Dir(crel), target) {
		c.skip(crel, "a link out of the tree (not copied)")
		return nil
	}
	if err := unix.Symlinkat(target, dfd, name); err != nil {
		return &os.PathError{Op: "symlink", Path: crel, Err: err}
	}
	c.res.Links++
	return nil
}

// Inside reports whether a link in the directory dir (a slash path
// relative to a tree's root) with target stays inside the tree by its
// text: relative, and no ".." past the root. It is a courtesy to the
// cell, not a guard: the host follows no link in a cell's tree.
func Inside(dir, target string) bool {
	if target == "" || path.IsAbs(target) || strings.ContainsRune(target, 0) {
		return false
	}
	j := path.Join(dir, target)
	return j != ".." && !strings.HasPrefix(j, "../")
}

package celltree

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"

	"golang.org/x/sys/unix"
)

// Entry is one entry a Walk visits, valid only during the call.
type Entry struct {
	// Path is the entry's slash path relative to the root.
	Path string
	// Type is its type as listed: fs.ModeDir, 0 for a regular file,
	// fs.ModeSymlink, or another type; Open judges again.
	Type fs.FileMode

	root  *Root
	dirfd int
	name  string
	typ   uint8
}

// Open opens a regular file entry for reading as (*Root).OpenFile does.
func (e *Entry) Open() (*os.File, error) {
	f, _, err := openRegular(e.dirfd, e.name, e.typ, path.Join(e.root.name, e.Path))
	return f, err
}

// Stat describes the entry without following it.
func (e *Entry) Stat() (fs.FileInfo, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(e.dirfd, e.name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, &fs.PathError{Op: "stat", Path: path.Join(e.root.name, e.Path), Err: err}
	}
	return fileInfo(e.name, &st), nil
}

// Walk calls fn for every entry beneath r, a directory before what it
// holds, each directory entered by its descriptor (never through a link:
// one swapped in after the listing fails the open and is passed to fn as
// what it is now). fn returning fs.SkipDir on a directory leaves it out,
// fs.SkipAll ends the walk; any other error ends it and is returned.
func (r *Root) Walk(fn func(e *Entry) error) error {
	w := &walker{r: r, fn: fn}
	err := w.dir(r.fd, ".", 0)
	if errors.Is(err, fs.SkipAll) {
		return nil
	}
	return err
}

type walker struct {
	r    *Root
	fn   func(*Entry) error
	bufs [][]byte
}

func (w *walker) dir(fd int, rel string, depth int) error {
	if depth >= DefaultMaxDepth {
		return fmt.Errorf("%s: %w: deeper than %d directories", path.Join(w.r.name, rel), ErrTooLarge, DefaultMaxDepth)
	}
	for len(w.bufs) <= depth {
		w.bufs = append(w.bufs, make([]byte, 16<<10))
	}
	err := readDir(fd, w.bufs[depth], func(name string, typ uint8) error {
		if typ == unix.DT_UNKNOWN {
			var st unix.Stat_t
			if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if errors.Is(err, unix.ENOENT) {
					return nil
				}
				return &fs.PathError{Op: "stat", Path: path.Join(w.r.name, rel, name), Err: err}
			}
			typ = dtype(st.Mode)
		}
		e := &Entry{Path: path.Join(rel, name), Type: modeType(typ), root: w.r, dirfd: fd, name: name, typ: typ}
		if typ != unix.DT_DIR {
			return w.fn(e)
		}
		child, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		switch {
		case errors.Is(err, unix.ENOENT):
			return nil
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
			// No longer a directory: tell fn what it is now.
			var st unix.Stat_t
			if unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
				return nil
			}
			e.typ = dtype(st.Mode)
			e.Type = modeType(e.typ)
			return w.fn(e)
		case err != nil:
			return &fs.PathError{Op: "open", Path: path.Join(w.r.name, e.Path), Err: err}
		}
		defer unix.Close(child)
		if err := w.fn(e); err != nil {
			if errors.Is(err, fs.SkipDir) {
				return nil
			}
			return err
		}
		return w.dir(child, e.Path, depth+1)
	})
	var errno unix.Errno
	if errors.As(err, &errno) && !isPathErr(err) { // the listing's own
		err = &fs.PathError{Op: "readdir", Path: path.Join(w.r.name, rel), Err: err}
	}
	return err
}

func isPathErr(err error) bool {
	var pe *fs.PathError
	return errors.As(err, &pe)
}

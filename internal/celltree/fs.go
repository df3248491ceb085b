package celltree

import (
	"errors"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// FS is the tree beneath r as an fs.FS (with ReadDir, ReadFile and Stat)
// that follows no link: opening one, or a path through one, fails with
// ErrLink; a FIFO, socket or device with ErrNotRegular; a file with other
// hard links with ErrHardLink; ReadFile of a file over maxFile bytes with
// ErrTooLarge (maxFile <= 0: no bound). Stat does not follow a link
// either (it is an lstat). r must stay open while the FS is used.
func (r *Root) FS(maxFile int64) fs.FS { return &rootFS{r: r, max: maxFile} }

type rootFS struct {
	r   *Root
	max int64
}

func (f *rootFS) check(op, name string) error {
	if !fs.ValidPath(name) {
		return &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	return nil
}

func (f *rootFS) Open(name string) (fs.File, error) {
	if err := f.check("open", name); err != nil {
		return nil, err
	}
	if name == "." {
		return f.openDir(name)
	}
	dirfd, base, err := f.r.split(name)
	if err != nil {
		return nil, err
	}
	defer f.r.release(dirfd)
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, f.r.pathErr("open", name, err)
	}
	if dtype(st.Mode) == unix.DT_DIR {
		return f.openDir(name)
	}
	file, _, err := openRegular(dirfd, base, dtype(st.Mode), path.Join(f.r.name, name))
	if err != nil {
		return nil, err
	}
	return file, nil
}

func (f *rootFS) openDir(name string) (fs.File, error) {
	fd, err := f.r.openDir(name, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	return &dirFile{fs: f, name: name, fd: fd}, nil
}

func (f *rootFS) ReadFile(name string) ([]byte, error) {
	if err := f.check("read", name); err != nil {
		return nil, err
	}
	return f.r.ReadFile(name, f.max)
}

func (f *rootFS) Stat(name string) (fs.FileInfo, error) {
	if err := f.check("stat", name); err != nil {
		return nil, err
	}
	return f.r.Lstat(name)
}

// ReadDir lists name, sorted; each entry's type is the listing's (an
// lstat where the file system gives none).
func (f *rootFS) ReadDir(name string) ([]fs.DirEntry, error) {
	if err := f.check("readdir", name); err != nil {
		return nil, err
	}
	fd, err := f.r.openDir(name, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return f.list(fd, name)
}

func (f *rootFS) list(fd int, name string) ([]fs.DirEntry, error) {
	var out []fs.DirEntry
	err := readDir(fd, make([]byte, 16<<10), func(n string, typ uint8) error {
		if typ == unix.DT_UNKNOWN {
			var st unix.Stat_t
			if unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
				return nil
			}
			typ = dtype(st.Mode)
		}
		out = append(out, &dirEntry{fs: f, dir: name, name: n, typ: modeType(typ)})
		return nil
	})
	if err != nil {
		return nil, f.r.pathErr("readdir", name, err)
	}
	slices.SortFunc(out, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return out, nil
}

type dirEntry struct {
	fs   *rootFS
	dir  string
	name string
	typ  fs.FileMode
}

func (d *dirEntry) Name() string               { return d.name }
func (d *dirEntry) IsDir() bool                { return d.typ.IsDir() }
func (d *dirEntry) Type() fs.FileMode          { return d.typ }
func (d *dirEntry) Info() (fs.FileInfo, error) { return d.fs.r.Lstat(path.Join(d.dir, d.name)) }

// dirFile is an open directory of a rootFS.
type dirFile struct {
	fs      *rootFS
	name    string
	fd      int
	entries []fs.DirEntry
	read    bool
}

func (d *dirFile) Stat() (fs.FileInfo, error) {
	var st unix.Stat_t
	if err := unix.Fstat(d.fd, &st); err != nil {
		return nil, d.fs.r.pathErr("stat", d.name, err)
	}
	return fileInfo(path.Base(d.name), &st), nil
}

func (d *dirFile) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: d.name, Err: errors.New("is a directory")}
}

func (d *dirFile) Close() error {
	if d.fd < 0 {
		return fs.ErrClosed
	}
	err := unix.Close(d.fd)
	d.fd = -1
	return err
}

func (d *dirFile) ReadDir(n int) ([]fs.DirEntry, error) {
	if !d.read {
		ents, err := d.fs.list(d.fd, d.name)
		if err != nil {
			return nil, err
		}
		d.entries, d.read = ents, true
	}
	if n <= 0 {
		out := d.entries
		d.entries = nil
		return out, nil
	}
	if len(d.entries) == 0 {
		return nil, io.EOF
	}
	n = min(n, len(d.entries))
	out := d.entries[:n]
	d.entries = d.entries[n:]
	return out, nil
}

// Package celltree reads and copies directory trees a cell can write
// (workspaces, worktrees, drafts, backups being restored) without ever
// following a link out of them: the host's authority never applies to a
// name a cell chose.
//
// Every name is resolved by the kernel beneath a directory descriptor:
// openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
// or, where openat2 is missing (ENOSYS), one component at a time with
// O_NOFOLLOW. A walk opens each entry by its name in its parent's
// descriptor, so a cell that swaps an entry for a link between the
// listing and the opening gets ELOOP, never the link's target.
//
// What it reads or copies:
//   - regular files, opened O_NONBLOCK (a FIFO swapped in cannot block)
//     and checked with fstat on the open descriptor; a file with more than
//     one hard link is refused (ErrHardLink): the host cannot tell a link
//     the cell made to its own file from one to a file it may not read;
//   - directories, by descriptor;
//   - symbolic links are never followed. Copy recreates a link whose
//     target is relative and stays inside the tree by its text, and skips
//     (and reports) any other; the host does not follow the recreated ones
//     either, they are for the cell;
//   - FIFOs, sockets and devices are never opened: Copy skips them and
//     reports them.
//
// Limits: a walk is bounded in depth (descriptors held) and a copy in
// entries and bytes.
package celltree

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

var (
	// ErrLink refuses a path that crosses or names a symbolic link.
	ErrLink = errors.New("a symbolic link (not followed)")
	// ErrHardLink refuses a regular file with more than one hard link.
	ErrHardLink = errors.New("a file with other hard links (not read)")
	// ErrNotRegular refuses a FIFO, socket or device where a file is read.
	ErrNotRegular = errors.New("not a regular file")
	// ErrBadPath refuses a path that is absolute, holds "..", or is not clean.
	ErrBadPath = errors.New("not a clean relative path")
	// ErrTooLarge refuses a copy or read over its bounds.
	ErrTooLarge = errors.New("over the bounds")
)

// DefaultMaxDepth bounds the directories a walk descends (each holds a
// descriptor while its children are walked).
const DefaultMaxDepth = 128

// resolveFlags are openat2's: beneath the root, and no link of any kind.
const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// Root is a directory opened once; every path beneath it is resolved
// from its descriptor with no link followed.
type Root struct {
	name string
	fd   int
	// walk: openat2 is missing here (ENOSYS); paths are resolved one
	// component at a time with O_NOFOLLOW. Set once in Open, read only.
	walk bool
}

// Open opens dir as a root. dir itself is the caller's path (the
// workspace the operator configured may be reached through a link); what
// lies beneath it is not followed.
func Open(dir string) (*Root, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	return newRoot(dir, fd), nil
}

func newRoot(name string, fd int) *Root {
	r := &Root{name: name, fd: fd}
	probe, err := unix.Openat2(fd, ".", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: resolveFlags})
	if err == nil {
		unix.Close(probe)
	} else if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		// ENOSYS: a kernel before 5.6; EPERM: a seccomp filter that denies it.
		r.walk = true
	}
	return r
}

// Name is the directory r was opened as.
func (r *Root) Name() string { return r.name }

// Close closes r's descriptor.
func (r *Root) Close() error {
	if r.fd < 0 {
		return nil
	}
	err := unix.Close(r.fd)
	r.fd = -1
	return err
}

// OpenRoot opens the directory rel beneath r as a root of its own.
func (r *Root) OpenRoot(rel string) (*Root, error) {
	fd, err := r.openDir(rel, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	sub := &Root{name: path.Join(r.name, rel), fd: fd, walk: r.walk}
	return sub, nil
}

// checkRel refuses what is not a clean relative slash path ("." is the root).
func checkRel(rel string) error {
	if rel == "" || path.IsAbs(rel) || path.Clean(rel) != rel || rel == ".." || strings.HasPrefix(rel, "../") || strings.ContainsRune(rel, 0) {
		return fmt.Errorf("%q: %w", rel, ErrBadPath)
	}
	return nil
}

// openDir opens the directory rel beneath r with flags (O_RDONLY or
// O_PATH); a link anywhere on the way fails with ErrLink.
func (r *Root) openDir(rel string, flags int) (int, error) {
	if err := checkRel(rel); err != nil {
		return -1, err
	}
	flags |= unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	if !r.walk {
		fd, err := unix.Openat2(r.fd, rel, &unix.OpenHow{Flags: uint64(flags), Resolve: resolveFlags})
		if err != nil {
			return -1, r.pathErr("open", rel, err)
		}
		return fd, nil
	}
	cur := r.fd
	parts := strings.Split(rel, "/")
	for i, part := range parts {
		fl := unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if i == len(parts)-1 {
			fl = flags
		}
		next, err := unix.Openat(cur, part, fl, 0)
		if cur != r.fd {
			unix.Close(cur)
		}
		if err != nil {
			return -1, r.pathErr("open", strings.Join(parts[:i+1], "/"), err)
		}
		cur = next
	}
	return cur, nil
}

// pathErr says which name failed; ELOOP (and ENOTDIR from O_NOFOLLOW on
// a link where a directory is asked) become ErrLink, EXDEV (openat2's
// answer to a way out) ErrBadPath.
func (r *Root) pathErr(op, rel string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		err = ErrLink
	case errors.Is(err, unix.ENOTDIR):
		var st unix.Stat_t
		if dir, base := path.Split(rel); unix.Fstatat(r.fd, path.Join(".", dir, base), &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			err = ErrLink
		}
	case errors.Is(err, unix.EXDEV):
		err = ErrBadPath
	}
	return &fs.PathError{Op: op, Path: path.Join(r.name, rel), Err: err}
}

// split opens rel's parent directory (O_PATH) and returns it with rel's
// last name; the caller closes the descriptor unless it is r's own.
func (r *Root) split(rel string) (dirfd int, name string, err error) {
	if err := checkRel(rel); err != nil {
		return -1, "", err
	}
	if rel == "." {
		return -1, "", fmt.Errorf("%q: %w (the root is no file)", rel, ErrBadPath)
	}
	dir, name := path.Split(rel)
	if dir == "" {
		return r.fd, name, nil
	}
	fd, err := r.openDir(strings.TrimSuffix(dir, "/"), unix.O_PATH)
	return fd, name, err
}

func (r *Root) release(fd int) {
	if fd >= 0 && fd != r.fd {
		unix.Close(fd)
	}
}

// OpenFile opens the regular file rel beneath r for reading. A link on
// the way or at rel is ErrLink; a FIFO, socket or device ErrNotRegular
// (a FIFO is opened non-blocking to be told so, a device never); a file
// with other hard links ErrHardLink.
func (r *Root) OpenFile(rel string) (*os.File, error) {
	dirfd, name, err := r.split(rel)
	if err != nil {
		return nil, err
	}
	defer r.release(dirfd)
	f, _, err := openRegular(dirfd, name, 0, path.Join(r.name, rel))
	return f, err
}

// ReadFile reads the regular file rel beneath r, as OpenFile opens it,
// refusing one over max bytes (max <= 0: no bound).
func (r *Root) ReadFile(rel string, max int64) ([]byte, error) {
	f, err := r.OpenFile(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readAll(f, max)
}

// Lstat describes rel beneath r without following it (a link on the way
// to it is ErrLink).
func (r *Root) Lstat(rel string) (fs.FileInfo, error) {
	if rel == "." {
		var st unix.Stat_t
		if err := unix.Fstat(r.fd, &st); err != nil {
			return nil, r.pathErr("stat", rel, err)
		}
		return fileInfo(path.Base(r.name), &st), nil
	}
	dirfd, name, err := r.split(rel)
	if err != nil {
		return nil, err
	}
	defer r.release(dirfd)
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, r.pathErr("stat", rel, err)
	}
	return fileInfo(name, &st), nil
}

// ReplaceFile writes data to rel beneath r, replacing what is there
// atomically (a new file beside it, renamed over it; a link at rel is
// replaced, not followed), with no link followed on the way.
func (r *Root) ReplaceFile(rel string, data []byte, perm os.FileMode) error {
	dirfd, name, err := r.split(rel)
	if err != nil {
		return err
	}
	if dirfd != r.fd {
		// split opened it O_PATH, which cannot create; open it for real.
		d, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		r.release(dirfd)
		if err != nil {
			return r.pathErr("open", path.Dir(rel), err)
		}
		dirfd = d
	}
	defer func() { r.release(dirfd) }()
	tmp := "." + name + ".tmp"
	unix.Unlinkat(dirfd, tmp, 0)
	fd, err := unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
	if err != nil {
		return r.pathErr("create", rel, err)
	}
	f := os.NewFile(uintptr(fd), path.Join(r.name, rel))
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dirfd, tmp, dirfd, name)
	}
	if err != nil {
		unix.Unlinkat(dirfd, tmp, 0)
		return &fs.PathError{Op: "write", Path: path.Join(r.name, rel), Err: err}
	}
	return nil
}

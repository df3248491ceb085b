package celltree

import (
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// openRegular opens name in dirfd for reading, refusing anything but a
// regular file with one link. typ is the entry's d_type from the listing
// (0: unknown); a listed FIFO, socket or device is refused unopened,
// anything else is opened with O_NOFOLLOW | O_NONBLOCK | O_NOCTTY and
// judged by fstat on the descriptor, which no later swap can change. The
// name is only between the listing and the open: a cell can put there a
// link (ELOOP), a FIFO (opened without blocking, then refused) or another
// regular file; not a device, which it cannot create (no CAP_MKNOD) nor
// link from another file system.
func openRegular(dirfd int, name string, typ uint8, display string) (*os.File, *unix.Stat_t, error) {
	switch typ {
	case unix.DT_LNK:
		return nil, nil, &fs.PathError{Op: "open", Path: display, Err: ErrLink}
	case unix.DT_FIFO, unix.DT_SOCK, unix.DT_CHR, unix.DT_BLK:
		return nil, nil, &fs.PathError{Op: "open", Path: display, Err: ErrNotRegular}
	case unix.DT_UNKNOWN:
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return nil, nil, &fs.PathError{Op: "open", Path: display, Err: err}
		}
		if t := dtype(st.Mode); t != unix.DT_REG {
			return openRegular(dirfd, name, t, display)
		}
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		if err == unix.ELOOP {
			err = ErrLink
		}
		return nil, nil, &fs.PathError{Op: "open", Path: display, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, nil, &fs.PathError{Op: "open", Path: display, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, nil, &fs.PathError{Op: "open", Path: display, Err: ErrNotRegular}
	}
	if st.Nlink > 1 {
		unix.Close(fd)
		return nil, nil, &fs.PathError{Op: "open", Path: display, Err: fmt.Errorf("%w: %d links", ErrHardLink, st.Nlink)}
	}
	// O_NONBLOCK means nothing to a regular file; clearing it keeps the
	// runtime from trying to poll the descriptor.
	unix.SetNonblock(fd, false)
	return os.NewFile(uintptr(fd), display), &st, nil
}

// readAll reads f whole, refusing more than max bytes (max <= 0: no bound).
func readAll(f *os.File, max int64) ([]byte, error) {
	if max <= 0 {
		return io.ReadAll(f)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s: %w: more than %d bytes", f.Name(), ErrTooLarge, max)
	}
	return b, nil
}

// dtype is st_mode's type as a d_type.
func dtype(mode uint32) uint8 {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return unix.DT_REG
	case unix.S_IFDIR:
		return unix.DT_DIR
	case unix.S_IFLNK:
		return unix.DT_LNK
	case unix.S_IFIFO:
		return unix.DT_FIFO
	case unix.S_IFSOCK:
		return unix.DT_SOCK
	case unix.S_IFCHR:
		return unix.DT_CHR
	case unix.S_IFBLK:
		return unix.DT_BLK
	}
	return unix.DT_UNKNOWN
}

// modeType is a d_type as an fs.FileMode type.
func modeType(t uint8) fs.FileMode {
	switch t {
	case unix.DT_DIR:
		return fs.ModeDir
	case unix.DT_LNK:
		return fs.ModeSymlink
	case unix.DT_FIFO:
		return fs.ModeNamedPipe
	case unix.DT_SOCK:
		return fs.ModeSocket
	case unix.DT_CHR:
		return fs.ModeDevice | fs.ModeCharDevice
	case unix.DT_BLK:
		return fs.ModeDevice
	case unix.DT_REG:
		return 0
	}
	return fs.ModeIrregular
}

// readDir calls fn with each name and d_type of the directory fd holds
// (not "." and ".."), reading the kernel's listing into buf as it goes.
func readDir(fd int, buf []byte, fn func(name string, typ uint8) error) error {
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n <= 0 {
			return nil
		}
		// struct linux_dirent64: ino u64, off s64, reclen u16, type u8, name.
		for off := 0; off+19 <= n; {
			reclen := int(binary.NativeEndian.Uint16(buf[off+16:]))
			if reclen < 19 || off+reclen > n {
				return fmt.Errorf("getdents: a malformed record")
			}
			typ := buf[off+18]
			name := buf[off+19 : off+reclen]
			for i, c := range name {
				if c == 0 {
					name = name[:i]
					break
				}
			}
			off += reclen
			if s := string(name); s != "." && s != ".." {
				if err := fn(s, typ); err != nil {
					return err
				}
			}
		}
	}
}

// info is an fs.FileInfo from a stat.
type info struct {
	name string
	st   unix.Stat_t
}

func fileInfo(name string, st *unix.Stat_t) fs.FileInfo { return &info{name: name, st: *st} }

func (i *info) Name() string       { return i.name }
func (i *info) Size() int64        { return i.st.Size }
func (i *info) Mode() fs.FileMode  { return modeType(dtype(i.st.Mode)) | fs.FileMode(i.st.Mode&0o777) }
func (i *info) ModTime() time.Time { return time.Unix(i.st.Mtim.Unix()) }
func (i *info) IsDir() bool        { return i.st.Mode&unix.S_IFMT == unix.S_IFDIR }
func (i *info) Sys() any           { return &i.st }

package kernel

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// ReadBeneathArg is klbr-kernel's subcommand that reads one file of a cell-writable
// directory for klbr-core on a worker host (a file a remote cell sends to Discord):
//
//	klbr-kernel --read-beneath ROOT NAME MAX
//
// It writes the file NAME beneath the directory ROOT to stdout, at most MAX bytes, and
// exits 0; or it writes nothing, says why on one line of stderr, and exits
// ExitReadRefused or ExitReadTooLarge. NAME is relative to ROOT, or absolute and lexically
// beneath it. The directory is writable by the cells that work in it, and the kernel runs
// as the login, so no link is followed at any component (a cell could point one at another
// unit's directory or the login's ~/.ssh), nothing resolves outside ROOT, no mount is
// crossed, and only a regular file with no other hard link is read.
const ReadBeneathArg = "--read-beneath"

// Exit statuses of --read-beneath besides 0 and ExitKernel (bad usage).
const (
	ExitReadRefused  = 3 // not a regular file of ROOT's reachable without a link
	ExitReadTooLarge = 4 // larger than MAX (or grew past it while read)
)

// MaxReadBeneathName bounds NAME.
const MaxReadBeneathName = 4096

// Why --read-beneath refuses a file.
var (
	ErrReadLink     = errors.New("a symbolic link (on the way or at the file) is not followed: name the file itself")
	ErrReadOutside  = errors.New("not a file in the workspace")
	ErrReadNotFile  = errors.New("not a regular file")
	ErrReadHardLink = errors.New("a file with other hard links is not sent: copy it")
	ErrReadMissing  = errors.New("no such file in the workspace")
	ErrReadTooLarge = errors.New("too large")
)

// ReadBeneathMain runs the subcommand with its arguments (after ReadBeneathArg).
func ReadBeneathMain(args []string, stdout, stderr io.Writer) int {
	if len(args) != 3 {
		fmt.Fprintln(stderr, "klbr-kernel: usage: --read-beneath ROOT NAME MAX")
		return ExitKernel
	}
	max, err := strconv.ParseInt(args[2], 10, 64)
	if err != nil || max < 0 {
		fmt.Fprintf(stderr, "klbr-kernel: --read-beneath: MAX %q is not a byte count\n", args[2])
		return ExitKernel
	}
	err = ReadBeneath(args[0], args[1], max, stdout)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrReadTooLarge):
		fmt.Fprintln(stderr, err)
		return ExitReadTooLarge
	}
	for _, why := range []error{ErrReadLink, ErrReadOutside, ErrReadNotFile, ErrReadHardLink, ErrReadMissing} {
		if errors.Is(err, why) {
			fmt.Fprintln(stderr, why) // the reason alone: klbr-core names the file
			return ExitReadRefused
		}
	}
	fmt.Fprintf(stderr, "klbr-kernel: --read-beneath: %v\n", err)
	return ExitKernel
}

// ReadBeneath writes the file name beneath root to w (see ReadBeneathArg): openat2(2)
// with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS|RESOLVE_NO_XDEV, or, on
// a kernel without it, a walk of one O_NOFOLLOW openat per component.
func ReadBeneath(root, name string, max int64, w io.Writer) error {
	return readBeneath(root, name, max, w, true)
}

func readBeneath(root, name string, max int64, w io.Writer, useOpenat2 bool) error {
	if !filepath.IsAbs(root) {
		return fmt.Errorf("ROOT %q is not an absolute path", root)
	}
	// ROOT is the host's own (the work root and a checked unit or workspace name), a bind
	// mount point in the unit's namespace that its cells cannot replace; its last
	// component is still opened without following a link.
	dir, err := unix.Open(filepath.Clean(root), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open ROOT %s: %w", root, err)
	}
	defer unix.Close(dir)
	rel, err := relBeneath(dir, root, name)
	if err != nil {
		return err
	}
	var fd int
	if useOpenat2 {
		fd, err = openat2Beneath(dir, rel)
		if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
			// Before Linux 5.6, or a seccomp filter that does not know openat2.
			fd, err = walkBeneath(dir, rel)
		}
	} else {
		fd, err = walkBeneath(dir, rel)
	}
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fmt.Errorf("%q: %w", rel, ErrReadNotFile)
	case st.Nlink > 1:
		return fmt.Errorf("%q: %w", rel, ErrReadHardLink)
	case st.Size > max:
		return fmt.Errorf("%q: %w: %d bytes, more than %d", rel, ErrReadTooLarge, st.Size, max)
	}
	// O_NONBLOCK kept a FIFO from stalling the open; a regular file ignores it.
	n, err := io.Copy(w, io.LimitReader(f, max))
	if err != nil {
		return fmt.Errorf("read %q: %w", rel, err)
	}
	if k, _ := f.Read(make([]byte, 1)); k > 0 {
		return fmt.Errorf("%q: %w: it grew past %d bytes while read", rel, ErrReadTooLarge, n)
	}
	return nil
}

// relBeneath is name relative to the directory root (open as dir): a relative name as it
// is, an absolute one only when lexically beneath root, as given or as the directory
// really is (a cell's os.getcwd() names the real path).
func relBeneath(dir int, root, name string) (string, error) {
	if name == "" || len(name) > MaxReadBeneathName || !utf8.ValidString(name) || strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("a name is 1 to %d bytes of UTF-8: %w", MaxReadBeneathName, ErrReadOutside)
	}
	if filepath.IsAbs(name) {
		name = filepath.Clean(name)
		roots := []string{filepath.Clean(root)}
		if real, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(dir)); err == nil && filepath.IsAbs(real) {
			roots = append(roots, real)
		}
		found := false
		for _, r := range roots {
			if rel, ok := strings.CutPrefix(name, strings.TrimSuffix(r, "/")+"/"); ok {
				name, found = rel, true
				break
			}
		}
		if !found {
			return "", fmt.Errorf("%q: %w", name, ErrReadOutside)
		}
	}
	rel := filepath.Clean(name)
	if rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || filepath.IsAbs(rel) {
		return "", fmt.Errorf("%q: %w", name, ErrReadOutside)
	}
	return rel, nil
}

const readFlags = unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOCTTY | unix.O_NONBLOCK

func openat2Beneath(dir int, rel string) (int, error) {
	fd, err := unix.Openat2(dir, rel, &unix.OpenHow{Flags: readFlags,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV})
	switch {
	case err == nil:
		return fd, nil
	case errors.Is(err, unix.ELOOP):
		return -1, fmt.Errorf("%q: %w", rel, ErrReadLink)
	case errors.Is(err, unix.EXDEV):
		return -1, fmt.Errorf("%q: %w", rel, ErrReadOutside)
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
		return -1, fmt.Errorf("%q: %w", rel, ErrReadMissing)
	case errors.Is(err, unix.ENXIO):
		return -1, fmt.Errorf("%q: %w", rel, ErrReadNotFile) // a socket
	}
	return -1, fmt.Errorf("open %q: %w", rel, err)
}

// walkBeneath opens rel beneath dir one component at a time, following no link and
// crossing no mount.
func walkBeneath(dir int, rel string) (int, error) {
	var root unix.Stat_t
	if err := unix.Fstat(dir, &root); err != nil {
		return -1, err
	}
	parts := strings.Split(rel, "/")
	cur := dir
	defer func() {
		if cur != dir {
			unix.Close(cur)
		}
	}()
	for i, p := range parts {
		last := i == len(parts)-1
		flags := unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if last {
			flags = readFlags | unix.O_NOFOLLOW
		}
		fd, err := unix.Openat(cur, p, flags, 0)
		if err != nil {
			var st unix.Stat_t
			switch {
			case errors.Is(err, unix.ELOOP),
				errors.Is(err, unix.ENOTDIR) && unix.Fstatat(cur, p, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK:
				return -1, fmt.Errorf("%q: %w", rel, ErrReadLink)
			case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
				return -1, fmt.Errorf("%q: %w", rel, ErrReadMissing)
			case errors.Is(err, unix.ENXIO):
				return -1, fmt.Errorf("%q: %w", rel, ErrReadNotFile)
			}
			return -1, fmt.Errorf("open %q: %w", rel, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return -1, err
		}
		if st.Dev != root.Dev {
			unix.Close(fd)
			return -1, fmt.Errorf("%q: %w (a mount point on the way)", rel, ErrReadOutside)
		}
		if cur != dir {
			unix.Close(cur)
		}
		cur = fd
	}
	fd := cur
	cur = dir // handed to the caller, not closed here
	return fd, nil
}

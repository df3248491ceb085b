package kernel

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// sanitizeFDs closes every inherited fd of 3 and above except those in keep, which are
// marked close-on-exec (the child gets the protocol socket through an explicit dup).
//
// It must run before the kernel opens files of its own. The Go runtime may hold fds that
// are not inherited: since Go 1.25 it keeps the cgroup CPU limit files open to adjust
// GOMAXPROCS (cmd/klbr-kernel turns that off with //go:debug), and a poller may exist.
// Those are recognized by what they point at and only marked close-on-exec, never closed.
func sanitizeFDs(keep ...int) (closed int, err error) {
	dir, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0, fmt.Errorf("list fds: %w", err)
	}
	defer dir.Close()
	dirFD := int(dir.Fd())
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return 0, fmt.Errorf("list fds: %w", err)
	}
	for _, name := range names {
		fd, err := strconv.Atoi(name)
		if err != nil || fd < 3 || fd == dirFD {
			continue
		}
		kept := false
		for _, k := range keep {
			kept = kept || k == fd
		}
		if kept || runtimeOwned(fd) {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
				return closed, fmt.Errorf("fd %d: set close-on-exec: %w", fd, err)
			}
			continue
		}
		if err := unix.Close(fd); err == nil {
			closed++
		}
	}
	return closed, nil
}

// runtimeOwned reports whether fd looks like one the Go runtime opened for itself.
func runtimeOwned(fd int) bool {
	target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return false
	}
	switch target {
	case "anon_inode:[eventpoll]", "anon_inode:[eventfd]", "anon_inode:[pidfd]":
		return true
	}
	if strings.HasPrefix(target, "/sys/fs/cgroup/") {
		for _, f := range []string{"/cpu.max", "/cpu.cfs_quota_us", "/cpu.cfs_period_us"} {
			if strings.HasSuffix(target, f) {
				return true
			}
		}
	}
	return false
}

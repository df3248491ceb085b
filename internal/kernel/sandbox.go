package kernel

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Sandbox is what the kernel takes away from its child before exec (flags --deny, --ro,
// --rw, --uid, --gid). The zero value takes nothing away.
//
//   - Deny: paths the child may not read, write or execute anything beneath (the data
//     directory: operator token, runtime.sqlite, sockets). Enforced with Landlock where the
//     running kernel has it; nothing enforces it where it does not (see [LandlockABI]).
//   - ReadOnly: exceptions beneath a denied path that the child reads (the Python runtime,
//     a behavior release, the skills file).
//   - ReadWrite: where the child may write (the workspace, the temporary directory); any
//     denied path beneath them stays denied. A ReadWrite path beneath a denied one is an
//     exception, like ReadOnly (the drafts the agent edits).
//
// Outside Deny the whole file system is readable and executable, /dev is writable, and
// nothing else is writable: in particular /sys (so no cgroup.procs, no moving out of the
// placement) and /proc. Landlock's scopes (ABI 6 and later) also keep the child from
// signalling any process outside its sandbox (its klbr-kernel, klbr-core) and from
// connecting to abstract Unix sockets outside it; ptrace of processes outside the sandbox
// is refused by Landlock itself (every ABI).
//
// DropUser with UID and GID drops the child to that user and group, with no supplementary groups,
// and so with no capabilities; only root can drop, and the core asks for it only when it
// runs as root. The child always runs with no_new_privs when any of this is asked for, so
// no setuid program gives anything back.
type Sandbox struct {
	Deny      []string `json:"deny,omitempty"`
	ReadOnly  []string `json:"ro,omitempty"`
	ReadWrite []string `json:"rw,omitempty"`
	// TempDir, when set, is writable and is the child's TMPDIR: with the data directory
	// under /tmp, /tmp itself is granted entry by entry and no new entry can be made there.
	TempDir string `json:"tmp,omitempty"`
	// DropUser runs the child as UID:GID.
	DropUser bool `json:"drop_user,omitempty"`
	// DropCaps runs the child without any capability, even as uid 0: empty bounding,
	// effective, permitted, inheritable and ambient sets, and securebits that keep exec
	// from giving root its capabilities back. The core asks for it when it runs as root but
	// no other uid can run the workers (the interpreter is in root's home).
	DropCaps bool `json:"drop_caps,omitempty"`
	UID      int  `json:"uid,omitempty"`
	GID      int  `json:"gid,omitempty"`
}

// NoSandbox keeps everything.
var NoSandbox = Sandbox{}

// Active reports whether the sandbox takes anything away.
func (s Sandbox) Active() bool {
	return len(s.Deny) > 0 || len(s.ReadWrite) > 0 || s.DropUser || s.DropCaps
}

// Args are the klbr-kernel flags that ask for s.
func (s Sandbox) Args() []string {
	var args []string
	for _, p := range s.Deny {
		args = append(args, "--deny", p)
	}
	for _, p := range s.ReadOnly {
		args = append(args, "--ro", p)
	}
	for _, p := range s.ReadWrite {
		args = append(args, "--rw", p)
	}
	if s.DropUser {
		args = append(args, "--uid", strconv.Itoa(s.UID), "--gid", strconv.Itoa(s.GID))
	}
	if s.DropCaps {
		args = append(args, "--drop-caps")
	}
	if s.TempDir != "" {
		args = append(args, "--tmp", s.TempDir)
	}
	return args
}

// Landlock access rights (uapi/linux/landlock.h), by the ABI version that added them.
const (
	llFSv1 = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE |
		unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR |
		unix.LANDLOCK_ACCESS_FS_REMOVE_DIR | unix.LANDLOCK_ACCESS_FS_REMOVE_FILE |
		unix.LANDLOCK_ACCESS_FS_MAKE_CHAR | unix.LANDLOCK_ACCESS_FS_MAKE_DIR |
		unix.LANDLOCK_ACCESS_FS_MAKE_REG | unix.LANDLOCK_ACCESS_FS_MAKE_SOCK |
		unix.LANDLOCK_ACCESS_FS_MAKE_FIFO | unix.LANDLOCK_ACCESS_FS_MAKE_BLOCK |
		unix.LANDLOCK_ACCESS_FS_MAKE_SYM
	llRead = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR
)

// LandlockABI returns the Landlock ABI version of the running kernel, 0 where Landlock is
// absent or disabled, with the reason.
func LandlockABI() (int, error) {
	v, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		switch errno {
		case unix.ENOSYS:
			return 0, errors.New("landlock: this kernel was built without it")
		case unix.EOPNOTSUPP:
			return 0, errors.New("landlock: disabled at boot (lsm=)")
		}
		return 0, fmt.Errorf("landlock: %w", errno)
	}
	return int(v), nil
}

// landlockRuleset is struct landlock_ruleset_attr up to ABI 6 (scoped).
type landlockRuleset struct {
	handledFS  uint64
	handledNet uint64
	scoped     uint64
}

// landlockPathBeneath is struct landlock_path_beneath_attr (packed: 12 bytes).
type landlockPathBeneath struct {
	allowed  uint64
	parentFD int32
}

// rule is one path and what may be done beneath it.
type rule struct {
	path   string
	access uint64
}

// landlockRules turns a sandbox into Landlock rules: read on / and rw on s.ReadWrite, /dev
// and /tmp, each with every denied path cut out (Landlock only grants: a grant on / would
// reach the data directory, so / is granted entry by entry along the way to each denied
// path), then read on the exceptions.
func landlockRules(s Sandbox, all uint64) ([]rule, error) {
	deny := make([]string, 0, len(s.Deny))
	for _, d := range s.Deny {
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("sandbox: deny %q: not an absolute path", d)
		}
		d = filepath.Clean(d)
		deny = append(deny, d)
		if real, err := filepath.EvalSymlinks(d); err == nil && real != d {
			deny = append(deny, real)
		}
	}
	// under reports whether d lies strictly beneath p.
	under := func(d, p string) bool {
		if p == "/" {
			return d != "/"
		}
		return strings.HasPrefix(d, p+"/")
	}
	denied := func(p string) bool {
		for _, d := range deny {
			if d == p || under(p, d) {
				return true
			}
		}
		return false
	}
	holdsDenied := func(p string) bool {
		for _, d := range deny {
			if under(d, p) {
				return true
			}
		}
		return false
	}
	var out []rule
	var walk func(p string, access uint64) error
	walk = func(p string, access uint64) error {
		switch {
		case denied(p):
			return nil
		case !holdsDenied(p):
			out = append(out, rule{p, access})
			return nil
		}
		// Grant p's entries one by one, not p. Symbolic links are not granted: access is
		// checked on what they resolve to, which has its own rule or none.
		ents, err := os.ReadDir(p)
		if err != nil {
			return nil // unreadable: nothing beneath it is granted (the safe side)
		}
		for _, e := range ents {
			if e.Type()&os.ModeSymlink != 0 {
				continue
			}
			if err := walk(filepath.Join(p, e.Name()), access); err != nil {
				return err
			}
		}
		return nil
	}
	grant := func(p string, access uint64) error {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("sandbox: %q: not an absolute path", p)
		}
		p = filepath.Clean(p)
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		return walk(p, access)
	}
	if err := grant("/", llRead); err != nil {
		return nil, err
	}
	for _, p := range []string{"/dev", os.TempDir()} {
		if err := grant(p, all); err != nil {
			return nil, err
		}
	}
	rwPaths := s.ReadWrite
	if s.TempDir != "" {
		rwPaths = append(slices.Clone(rwPaths), s.TempDir)
	}
	for _, p := range rwPaths {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		if !denied(filepath.Clean(p)) {
			if err := grant(p, all); err != nil {
				return nil, err
			}
			continue
		}
		// An exception beneath a denied path (the drafts the agent edits).
		out = append(out, rule{filepath.Clean(p), all})
	}
	for _, p := range s.ReadOnly {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("sandbox: read-only %q: not an absolute path", p)
		}
		p = filepath.Clean(p)
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		out = append(out, rule{p, llRead})
	}
	return out, nil
}

// applySandbox restricts the calling thread (the helper, just before exec) as s says, in
// this order: no_new_privs, Landlock (while still privileged enough to open every rule's
// path), then the uid/gid drop. It returns a note for the kernel's log when Landlock
// could not be applied, or an error when any step failed that was asked for.
func applySandbox(s Sandbox) (note string, err error) {
	if !s.Active() {
		return "", nil
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return "", fmt.Errorf("sandbox: no_new_privs: %w", err)
	}
	if len(s.Deny) > 0 || len(s.ReadWrite) > 0 {
		abi, lerr := LandlockABI()
		if lerr != nil {
			note = lerr.Error() + ": the data directory is NOT hidden from this process"
		} else if err := landlock(s, abi); err != nil {
			return "", err
		}
	}
	if s.DropCaps && !s.DropUser {
		if err := dropCaps(); err != nil {
			return "", err
		}
	}
	if s.DropUser {
		if err := unix.Setgroups(nil); err != nil {
			return "", fmt.Errorf("sandbox: setgroups: %w", err)
		}
		if err := unix.Setresgid(s.GID, s.GID, s.GID); err != nil {
			return "", fmt.Errorf("sandbox: setresgid %d: %w", s.GID, err)
		}
		// setresuid from root to another uid clears the permitted, effective and ambient
		// capability sets (capabilities(7)); no_new_privs keeps exec from restoring any.
		if err := unix.Setresuid(s.UID, s.UID, s.UID); err != nil {
			return "", fmt.Errorf("sandbox: setresuid %d: %w", s.UID, err)
		}
		var hdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err == nil && (data[0].Effective|data[1].Effective|data[0].Permitted|data[1].Permitted) != 0 {
			return "", errors.New("sandbox: capabilities survived the uid drop")
		}
	}
	return note, nil
}

// Securebits (uapi/linux/securebits.h): exec gives uid 0 no capabilities, setuid changes
// do not adjust them, and neither can be undone.
const (
	secbitNoroot             = 1 << 0
	secbitNorootLocked       = 1 << 1
	secbitNoSetuidFixup      = 1 << 2
	secbitNoSetuidFixupLock  = 1 << 3
	secbitKeepCapsLocked     = 1 << 5
	secbitNoCapAmbientRaise  = 1 << 6
	secbitNoCapAmbientLocked = 1 << 7
)

// dropCaps leaves the calling thread, and what it execs, without capabilities.
func dropCaps() error {
	bits := secbitNoroot | secbitNorootLocked | secbitNoSetuidFixup | secbitNoSetuidFixupLock |
		secbitKeepCapsLocked | secbitNoCapAmbientRaise | secbitNoCapAmbientLocked
	// Without CAP_SETPCAP (a unit with an empty CapabilityBoundingSet=) neither the
	// securebits nor the bounding set can change: then the bounding set must already be
	// empty, so that no exec can give a capability back.
	secErr := unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(bits), 0, 0, 0)
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0)
		if err != nil || in == 0 {
			continue // unknown to this kernel, or not in the set
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("sandbox: drop capability %d from the bounding set: %w", c, err)
		}
	}
	if secErr != nil && secErr != unix.EPERM {
		return fmt.Errorf("sandbox: securebits: %w", secErr)
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && err != unix.EINVAL {
		return fmt.Errorf("sandbox: clear ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("sandbox: capset: %w", err)
	}
	return nil
}

// landlock builds and enforces the ruleset for abi.
func landlock(s Sandbox, abi int) error {
	all := uint64(llFSv1)
	if abi >= 2 {
		all |= unix.LANDLOCK_ACCESS_FS_REFER
	}
	if abi >= 3 {
		all |= unix.LANDLOCK_ACCESS_FS_TRUNCATE
	}
	if abi >= 5 {
		all |= unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	}
	attr := landlockRuleset{handledFS: all}
	size := unsafe.Offsetof(attr.handledNet) // ABI 1-3: handled_access_fs only
	if abi >= 4 {
		size = unsafe.Offsetof(attr.scoped)
	}
	if abi >= 6 {
		attr.scoped = unix.LANDLOCK_SCOPE_SIGNAL | unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET
		size = unsafe.Sizeof(attr)
	}
	rules, err := landlockRules(s, all)
	if err != nil {
		return err
	}
	fd, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), size, 0)
	if errno != 0 {
		return fmt.Errorf("sandbox: landlock_create_ruleset: %w", errno)
	}
	defer unix.Close(int(fd))
	for _, r := range rules {
		pfd, err := unix.Open(r.path, unix.O_PATH|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.ELOOP) {
				continue // vanished while walking, or a dangling link: nothing to grant
			}
			return fmt.Errorf("sandbox: open %s: %w", r.path, err)
		}
		access := r.access & all
		var st unix.Stat_t
		if unix.Fstat(pfd, &st) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			// A rule on a file may only name the rights that apply to files.
			access &= unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE |
				unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_TRUNCATE | unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
		}
		pb := landlockPathBeneath{allowed: access, parentFD: int32(pfd)}
		_, _, errno := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, fd, unix.LANDLOCK_RULE_PATH_BENEATH,
			uintptr(unsafe.Pointer(&pb)), 0, 0, 0)
		unix.Close(pfd)
		if errno != 0 {
			return fmt.Errorf("sandbox: landlock_add_rule %s: %w", r.path, errno)
		}
	}
	if _, _, errno := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, fd, 0, 0); errno != 0 {
		return fmt.Errorf("sandbox: landlock_restrict_self: %w", errno)
	}
	return nil
}

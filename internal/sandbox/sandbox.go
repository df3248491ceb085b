// Package sandbox is the daemon's policy for what its workers run without (the
// kernel.Sandbox every worker and tracked command gets): which paths are hidden, which are
// the exceptions, which uid they drop to, and the one line that says what holds here, for
// status and doctor.
package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/kernel"
)

// nobody is the uid and gid workers drop to when klbr-core runs as root and the workspace
// belongs to root as well.
const nobody = 65534

// ForWorkers is what every worker and tracked command runs without: the data directory
// (operator token, runtime.sqlite, the sockets, artifacts), the config file and every
// secret file it names, with read-only exceptions for what Python needs (the runtime, the
// releases, the managed skills) and read-write ones for the workspace and the drafts the
// agent edits. As root it also drops the workers to an unprivileged uid (the workspace's
// owner, or nobody) with no capabilities.
func ForWorkers(cfg *config.Config, python, runtimeSrc string) (sb kernel.Sandbox, note string) {
	data := cfg.Paths.DataDir
	sb = kernel.Sandbox{
		Deny:      []string{data},
		ReadOnly:  []string{filepath.Join(data, "runtime"), filepath.Join(data, "releases"), filepath.Join(data, "skills")},
		ReadWrite: []string{cfg.Paths.Workspace, filepath.Join(data, "drafts")},
	}
	if runtimeSrc != "" && !within(runtimeSrc, data) {
		sb.ReadOnly = append(sb.ReadOnly, runtimeSrc)
	}
	sb.TempDir = TempDir(data)
	if within(data, cfg.Paths.Workspace) && data != cfg.Paths.Workspace {
		note = "the data directory lies inside the workspace: cells cannot make new entries in the directories on the way to it (Landlock grants a directory only with all beneath it); set KLBR_DATA_DIR outside " + cfg.Paths.Workspace
	}
	// A secret file outside the data directory is denied when it is one: a file others may
	// read anyway (a config file in /nix/store) gains nothing by it, and cutting its
	// directory into its entries costs a rule per entry.
	secret := func(p string) {
		if p == "" || !filepath.IsAbs(p) || within(p, data) {
			return
		}
		if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o004 == 0 {
			sb.Deny = append(sb.Deny, p)
		}
	}
	secret(cfg.Paths.ConfigFile)
	for _, r := range cfg.File.Routes {
		secret(r.APIKeyFile)
	}
	secret(cfg.File.Discord.TokenFile)
	secret(os.Getenv("CREDENTIALS_DIRECTORY"))
	if os.Geteuid() != 0 {
		return sb, note
	}
	eff, bnd := capabilities()
	if eff&(1<<unix.CAP_SETUID) == 0 || eff&(1<<unix.CAP_SETGID) == 0 {
		// Root without the capabilities to change uid (a unit with an empty
		// CapabilityBoundingSet=): workers stay uid 0 with what the daemon has.
		sb.DropCaps = bnd != 0
		return sb, join(note, fmt.Sprintf("workers stay uid 0: klbr-core holds no CAP_SETUID/CAP_SETGID (capability bounding set %#x), so they run with %s",
			bnd, map[bool]string{true: "no capability (the bounding set is dropped for them)", false: "no capability, as klbr-core"}[bnd != 0]))
	}
	uid, gid := nobody, nobody
	if fi, err := os.Stat(cfg.Paths.Workspace); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 {
			uid, gid = int(st.Uid), int(st.Gid)
		}
	}
	// The data directory's own parts are opened to the worker uid (OpenDataDir); what
	// lies outside it must already be reachable.
	var errs []string
	for _, c := range []struct {
		path string
		mode uint32 // the bits needed of the path itself (4 read, 1 execute)
	}{{python, 5}, {cfg.Paths.Workspace, 5}} {
		if err := reachable(uid, gid, c.path, c.mode); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if runtimeSrc != "" && !within(runtimeSrc, data) {
		if err := reachable(uid, gid, runtimeSrc, 5); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if err := reachable(uid, gid, filepath.Dir(data), 1); err != nil {
		errs = append(errs, err.Error())
	}
	if len(errs) > 0 {
		// Root without capabilities, Landlock around it: weaker than another uid (root
		// still owns root's files), but not root's powers.
		sb.DropCaps = true
		return sb, join(note, fmt.Sprintf("workers stay uid 0 (without capabilities): uid %d cannot reach %s; install the interpreter and workspace where uid %d can, or chown the workspace to an unprivileged user (workers run as its owner)",
			uid, strings.Join(errs, "; "), uid))
	}
	sb.DropUser, sb.UID, sb.GID = true, uid, gid
	return sb, note
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// capabilities returns this process's effective capability set and its bounding set.
func capabilities() (effective, bounding uint64) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if unix.Capget(&hdr, &data[0]) == nil {
		effective = uint64(data[0].Effective) | uint64(data[1].Effective)<<32
	}
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		if in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err == nil && in == 1 {
			bounding |= 1 << c
		}
	}
	return effective, bounding
}

// reachable checks by permission bits whether uid:gid can walk to path and use it with
// mode (4 read, 2 write, 1 execute/search).
func reachable(uid, gid int, path string, mode uint32) error {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return err
	}
	allows := func(p string, want uint32) bool {
		fi, err := os.Stat(p)
		if err != nil {
			return false
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return false
		}
		perm := uint32(fi.Mode().Perm())
		switch {
		case int(st.Uid) == uid:
			perm >>= 6
		case int(st.Gid) == gid:
			perm >>= 3
		}
		return perm&want == want
	}
	for d := filepath.Dir(real); ; d = filepath.Dir(d) {
		if !allows(d, 1) {
			return fmt.Errorf("%s (no search permission on %s)", path, d)
		}
		if d == "/" {
			break
		}
	}
	if !allows(real, mode) {
		return fmt.Errorf("%s (mode %s)", path, fileMode(real))
	}
	return nil
}

func fileMode(p string) string {
	fi, err := os.Stat(p)
	if err != nil {
		return err.Error()
	}
	return fi.Mode().String()
}

// TempDir is the workers' TMPDIR: a directory of this data directory's own under the
// system's temporary directory (made by PrepareTempDir).
func TempDir(data string) string {
	sum := sha256.Sum256([]byte(data))
	return filepath.Join(os.TempDir(), "klbr-tmp-"+hex.EncodeToString(sum[:6]))
}

// PrepareTempDir makes the workers' TMPDIR, owned by the uid they run as, mode 0700; a
// path there that is not a directory of that owner is refused (another user may have put
// it there first).
func PrepareTempDir(sb kernel.Sandbox) error {
	if sb.TempDir == "" {
		return nil
	}
	uid, gid := os.Getuid(), os.Getgid()
	if sb.DropUser {
		uid, gid = sb.UID, sb.GID
	}
	if err := os.Mkdir(sb.TempDir, 0o700); err != nil && !os.IsExist(err) {
		return fmt.Errorf("workers' temporary directory: %w", err)
	}
	fi, err := os.Lstat(sb.TempDir)
	if err != nil {
		return fmt.Errorf("workers' temporary directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || (int(st.Uid) != os.Getuid() && int(st.Uid) != uid) {
		return fmt.Errorf("workers' temporary directory %s: not a directory of ours; remove it", sb.TempDir)
	}
	if int(st.Uid) != uid || int(st.Gid) != gid {
		if err := os.Lchown(sb.TempDir, uid, gid); err != nil {
			return fmt.Errorf("workers' temporary directory: %w", err)
		}
	}
	return os.Chmod(sb.TempDir, 0o700)
}

// within reports whether p is dir or lies beneath it.
func within(p, dir string) bool {
	p, dir = filepath.Clean(p), filepath.Clean(dir)
	return p == dir || strings.HasPrefix(p, dir+string(filepath.Separator))
}

// OpenDataDir lets a worker of another uid reach the read-only parts of the data
// directory by plain permissions: the directories on the way are made traversable (0711:
// entering, not listing), the runtime, releases and skills readable. runtime.sqlite, the
// operator token, klbr.toml, drafts and artifacts keep their 0600/0700.
func OpenDataDir(data string) error {
	dirs := []string{data, filepath.Join(data, "runtime"), filepath.Join(data, "runtime", "skills"), filepath.Join(data, "releases"), filepath.Join(data, "drafts")}
	// The materialized runtimes, <data>/runtime/<hash>, are made private (a temporary
	// directory renamed into place).
	if ents, err := os.ReadDir(filepath.Join(data, "runtime")); err == nil {
		for _, e := range ents {
			if e.IsDir() && e.Name() != "skills" && !strings.HasPrefix(e.Name(), ".") {
				dirs = append(dirs, filepath.Join(data, "runtime", e.Name()))
			}
		}
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return fmt.Errorf("open the runtime to workers: %w", err)
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return fmt.Errorf("open the runtime to workers: %w", err)
		}
	}
	skills := filepath.Join(data, "skills")
	if err := os.Chmod(skills, 0o755); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("open the skills to workers: %w", err)
	}
	return nil
}

// Describe says in one line what the sandbox enforces here, for doctor and status;
// note, when set, says what is weaker than it should be and how to fix it.
func Describe(sb kernel.Sandbox, note string) string {
	var parts []string
	if abi, err := kernel.LandlockABI(); err != nil {
		parts = append(parts, "data directory NOT hidden from workers ("+err.Error()+")")
	} else {
		s := fmt.Sprintf("landlock ABI %d: data directory hidden, /sys and /proc read-only", abi)
		if abi >= 6 {
			s += ", no signals outside the sandbox"
		} else {
			s += ", signals NOT scoped (ABI < 6)"
		}
		parts = append(parts, s)
	}
	switch {
	case sb.DropUser:
		parts = append(parts, fmt.Sprintf("workers run as uid %d gid %d without capabilities", sb.UID, sb.GID))
	case sb.DropCaps:
		parts = append(parts, "workers run as uid 0 WITHOUT capabilities (no other uid can run them here)")
	default:
		parts = append(parts, fmt.Sprintf("workers run as the daemon's uid %d", os.Getuid()))
	}
	parts = append(parts, "no_new_privs", "control.sock and ingress.sock refuse worker peers")
	if note != "" {
		parts = append(parts, note)
	}
	return strings.Join(parts, "; ")
}

// Brief is Describe in a few words, for status and doctor: the Landlock ABI,
// the workers' uid, and whether anything is weaker than it could be (its
// paragraph: klbr-core doctor --verbose).
func Brief(sb kernel.Sandbox, note string) string {
	var parts []string
	if abi, err := kernel.LandlockABI(); err != nil {
		parts = append(parts, "NO landlock (the data directory is not hidden)")
	} else {
		parts = append(parts, fmt.Sprintf("landlock ABI %d", abi))
	}
	switch {
	case sb.DropUser:
		parts = append(parts, fmt.Sprintf("workers run as uid %d without capabilities", sb.UID))
	case sb.DropCaps:
		parts = append(parts, "workers run as uid 0 without capabilities")
	default:
		parts = append(parts, fmt.Sprintf("workers run as the daemon's uid %d", os.Getuid()))
	}
	parts = append(parts, "no_new_privs")
	s := strings.Join(parts, ", ")
	if note != "" {
		s += "; weaker than it could be (klbr-core doctor --verbose says why and what to do)"
	}
	return s
}

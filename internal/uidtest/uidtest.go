// Package uidtest runs a test's body as an unprivileged uid, the way
// klbr-core runs when it is not root: the test binary re-executes itself
// as that uid, with no supplementary groups and no capabilities, and runs
// only the named child test. Tests that run as root everywhere else use it
// to show that what they prove does not rest on root's privileges.
//
// The parent calls Run; the child test (named …Child by convention) starts
// with Child, which skips it when no parent started it and otherwise checks
// that it really runs as the uid it was given with no capability.
package uidtest

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/klbr-dev/klbr/internal/citest"
)

// The uids the tests use: Host is the unprivileged daemon (no user of the
// machine has it), Cell is another uid standing for a cell or the
// workspace's owner (nobody, as the workers run when the daemon is root).
const (
	Host = 64011
	Cell = 65534
)

const (
	envChild = "KLBR_UIDTEST_CHILD" // the uid the child was started as
	envDir   = "KLBR_UIDTEST_DIR"   // the child's own directory (also its HOME and TMPDIR)
)

// Root skips t (fails it under CI=true, where tests run as root) unless
// this process may take another uid.
func Root(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		citest.SkipOrFail(t, fmt.Sprintf("running a test as another uid needs root (this is uid %d)", os.Geteuid()))
	}
}

// Dir returns a new directory owned by uid:gid with the given mode, inside
// a directory every uid may enter (a test's TempDir is root's, 0700). It is
// removed when t ends.
func Dir(t testing.TB, uid, gid int, mode fs.FileMode) string {
	t.Helper()
	Root(t)
	top, err := os.MkdirTemp("", "klbr-uidtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	if err := os.Chmod(top, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(top, "d")
	if err := os.Mkdir(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Chown gives everything beneath top (top included) to uid:gid, links
// themselves rather than what they point at.
func Chown(t testing.TB, top string, uid, gid int) {
	t.Helper()
	err := filepath.WalkDir(top, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Run runs the test named child (a top-level func, with its subtests) in a
// copy of this test binary as uid:gid, with no supplementary group and no
// capability, and fails t with the child's output if the child fails or
// did not run. env is added to the child's environment; HOME and TMPDIR
// are a directory of its own, and PATH keeps only directories the uid may
// search. The child's working directory is this one.
func Run(t testing.TB, child string, uid, gid int, env ...string) {
	t.Helper()
	Root(t)
	dir := Dir(t, 0, 0, 0o755)
	bin := filepath.Join(dir, "test.bin")
	if err := copyFile(os.Args[0], bin); err != nil {
		t.Fatalf("uidtest: copy the test binary: %v", err)
	}
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, uid, gid); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^"+child+"$", "-test.count=1", "-test.v")
	cmd.Env = append(childEnv(os.Environ(), uid, gid), envChild+"="+strconv.Itoa(uid), envDir+"="+home,
		"HOME="+home, "TMPDIR="+home)
	cmd.Env = append(cmd.Env, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}},
		Pdeathsig:  syscall.SIGKILL,
	}
	out, err := cmd.CombinedOutput()
	switch {
	case err != nil:
		t.Fatalf("%s as uid %d: %v\n%s", child, uid, err, out)
	case strings.Contains(string(out), "--- SKIP: "+child+" "):
		citest.SkipOrFail(t, fmt.Sprintf("%s as uid %d skipped:\n%s", child, uid, out))
	case !strings.Contains(string(out), "--- PASS: "+child+" "):
		t.Fatalf("%s as uid %d did not run:\n%s", child, uid, out)
	}
	t.Logf("%s ran as uid %d with no capability", child, uid)
}

// Child skips t unless Run started this process (parent names the test
// that does). In the child it checks the uid and that no capability is
// left, and returns the child's own directory.
func Child(t testing.TB, parent string) string {
	t.Helper()
	want := os.Getenv(envChild)
	if want == "" {
		t.Skipf("the child of %s, run as an unprivileged uid", parent)
	}
	if uid := strconv.Itoa(os.Getuid()); uid != want || os.Geteuid() != os.Getuid() {
		t.Fatalf("uidtest: running as uid %s (euid %d), want %s", uid, os.Geteuid(), want)
	}
	if caps := capabilities(t); caps != "" {
		t.Fatalf("uidtest: the child holds capabilities: %s", caps)
	}
	return os.Getenv(envDir)
}

// AsFS makes the calling goroutine's thread act on files as uid:gid
// (setfsuid/setfsgid apply to one thread; the kernel drops the file
// capabilities with them). The thread stays locked and ends with the
// goroutine, so call it at the top of a goroutine of its own. It needs
// root.
func AsFS(uid, gid int) error {
	runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
	if err := unix.Setfsgid(gid); err != nil {
		return fmt.Errorf("setfsgid %d: %w", gid, err)
	}
	if err := unix.Setfsuid(uid); err != nil {
		return fmt.Errorf("setfsuid %d: %w", uid, err)
	}
	return nil
}

// childEnv is env without HOME, TMPDIR, GOCACHE and with PATH reduced to
// the directories uid:gid may search.
func childEnv(env []string, uid, gid int) []string {
	var out []string
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "HOME", "TMPDIR", "GOCACHE", envChild, envDir:
			continue
		case "PATH":
			var keep []string
			for _, d := range filepath.SplitList(v) {
				if searchable(d, uid, gid) {
					keep = append(keep, d)
				}
			}
			kv = "PATH=" + strings.Join(keep, string(filepath.ListSeparator))
		}
		out = append(out, kv)
	}
	return out
}

// searchable says whether uid:gid (with no supplementary group) may
// search dir and every directory above it.
func searchable(dir string, uid, gid int) bool {
	if !filepath.IsAbs(dir) {
		return false
	}
	for p := filepath.Clean(dir); ; p = filepath.Dir(p) {
		var st unix.Stat_t
		if unix.Stat(p, &st) != nil {
			return false
		}
		bit := uint32(0o001)
		switch {
		case int(st.Uid) == uid:
			bit = 0o100
		case int(st.Gid) == gid:
			bit = 0o010
		}
		if st.Mode&bit == 0 {
			return false
		}
		if p == "/" {
			return true
		}
	}
}

// capabilities is what /proc/self/status says this process holds beyond
// nothing, or "".
func capabilities(t testing.TB) string {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var held []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, _ := strings.Cut(s.Text(), ":")
		v = strings.TrimSpace(v)
		switch k {
		case "CapInh", "CapPrm", "CapEff", "CapAmb":
			if strings.Trim(v, "0") != "" {
				held = append(held, k+"="+v)
			}
		}
	}
	return strings.Join(held, " ")
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

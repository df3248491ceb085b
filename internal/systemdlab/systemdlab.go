// Package systemdlab boots a real systemd as PID 1 of new PID, mount and
// network namespaces (lab.sh), so that tests can run unit files, scopes and
// their limits on machines whose own PID 1 is not systemd. Test support:
// the product never uses it.
package systemdlab

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/citest"
)

//go:embed lab.sh
var script []byte

// Require skips tb, or under CI=true fails it, unless this machine can boot
// a lab: root, Debian's systemd and dbus, util-linux, writable cgroup v1
// hierarchies pids and memory, and the extra tools named.
func Require(tb testing.TB, tools ...string) {
	tb.Helper()
	if reason := Missing(tools...); reason != "" {
		citest.SkipOrFail(tb, reason)
	}
}

// Missing says what this machine lacks to boot a lab with tools on the
// PATH ("": nothing): a test that can do without the lab asks it instead
// of Require.
func Missing(tools ...string) string {
	if os.Geteuid() != 0 {
		return "the systemd lab needs root"
	}
	if _, err := os.Stat("/lib/systemd/systemd"); err != nil {
		return "/lib/systemd/systemd is missing (apt-get install -y systemd dbus)"
	}
	for _, tool := range append([]string{"dbus-daemon", "unshare", "nsenter", "setsid", "bash"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " is missing (apt-get install -y systemd dbus util-linux)"
		}
	}
	for _, h := range []string{"pids", "memory"} {
		if err := syscall.Access("/sys/fs/cgroup/"+h, 2); err != nil {
			return "the systemd lab needs a writable cgroup v1 hierarchy /sys/fs/cgroup/" + h
		}
	}
	return ""
}

// Lab is a lab directory: Run is its /run (units go in Run/systemd/system,
// the bus is Run/dbus/system_bus_socket), VarLib its /var/lib.
type Lab struct {
	Dir, Run, VarLib string
	// UTS gives the lab a UTS namespace of its own (a host name of its
	// own); set before Boot.
	UTS    bool
	script string
	name   string
}

// Prepare lays out a lab in dir. name (lowercase letters, digits, -)
// prefixes its cgroups: one name per test package, so that packages that
// run at once never sweep each other's. Put units and files in place, then
// Boot.
func Prepare(tb testing.TB, dir, name string) (*Lab, error) {
	tb.Helper()
	sh := filepath.Join(tb.TempDir(), "systemd-lab.sh")
	if err := os.WriteFile(sh, script, 0o755); err != nil {
		return nil, err
	}
	l := &Lab{Dir: dir, Run: filepath.Join(dir, "run"), VarLib: filepath.Join(dir, "varlib"), script: sh, name: name}
	if out, err := l.command("prepare").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("prepare the lab: %v\n%s", err, out)
	}
	return l, nil
}

func (l *Lab) command(verb string) *exec.Cmd {
	cmd := exec.Command("bash", l.script, verb, l.Dir)
	cmd.Env = append(os.Environ(), "LAB_NAME="+l.name)
	return cmd
}

// Boot starts the lab's systemd and waits for it and its bus. It returns
// the host pid of the namespace's PID 1 (enter it with nsenter -t PID1 -m
// -p -n) and halt, which powers it off and removes its cgroups. The
// launcher is this process's child with a parent-death signal, so a test
// binary that dies (a timeout panic skips cleanups) takes the lab along.
func (l *Lab) Boot(tb testing.TB) (pid1 string, halt func(), err error) {
	tb.Helper()
	start := time.Now()
	args := []string{"--pid", "--fork", "--kill-child", "--mount", "--propagation", "private", "--net", "--mount-proc"}
	if l.UTS {
		args = append(args, "--uts")
	}
	launcher := exec.Command("unshare", append(args, filepath.Join(l.Dir, "inner"))...)
	log, err := os.Create(filepath.Join(l.Dir, "systemd.log"))
	if err != nil {
		return "", nil, err
	}
	defer log.Close()
	launcher.Stdout, launcher.Stderr = log, log
	launcher.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	// Pdeathsig follows the starting thread (go.dev/issue/27505): keep this
	// goroutine on its thread until the lab is halted.
	runtime.LockOSThread()
	if err := launcher.Start(); err != nil {
		runtime.UnlockOSThread()
		return "", nil, err
	}
	exited := make(chan struct{})
	go func() { _ = launcher.Wait(); close(exited) }()
	halt = func() {
		defer runtime.UnlockOSThread()
		start := time.Now()
		if out, err := l.command("halt").CombinedOutput(); err != nil {
			tb.Errorf("halt the lab: %v\n%s", err, out)
		}
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			tb.Errorf("the lab's launcher did not exit")
		}
		tb.Logf("lab halted in %s", time.Since(start).Round(time.Millisecond))
	}
	fail := func(err error) (string, func(), error) { halt(); return "", nil, err }
	if err := os.WriteFile(filepath.Join(l.Dir, "launcher.pid"), []byte(strconv.Itoa(launcher.Process.Pid)), 0o644); err != nil {
		return fail(err)
	}
	for {
		_, e1 := os.Stat(filepath.Join(l.Run, "systemd", "private"))
		_, e2 := os.Stat(filepath.Join(l.Run, "dbus", "system_bus_socket"))
		if e1 == nil && e2 == nil {
			break
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(log.Name())
			return fail(fmt.Errorf("systemd exited:\n%s", b))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Since(start) > 20*time.Second {
			b, _ := os.ReadFile(log.Name())
			return fail(fmt.Errorf("systemd and its bus did not come up in 20 s:\n%s", b))
		}
	}
	children, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", launcher.Process.Pid, launcher.Process.Pid))
	if err != nil {
		return fail(err)
	}
	f := strings.Fields(string(children))
	if len(f) == 0 {
		return fail(errors.New("the launcher has no child"))
	}
	if err := os.WriteFile(filepath.Join(l.Dir, "pid1"), []byte(f[0]), 0o644); err != nil {
		return fail(err)
	}
	tb.Logf("systemd booted as PID 1 of a namespace in %s (host pid %s)", time.Since(start).Round(time.Millisecond), f[0])
	return f[0], halt, nil
}

package hosts

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/klbr-dev/klbr/internal/kernel"
)

// Unit is a transient service to start on a host.
type Unit struct {
	// Name is the unit's name and identity: klbr-job-<job>-<attempt>.service.
	Name        string
	Description string
	Argv        []string
	Env         map[string]string
	// Limits; zero takes the host's.
	MemoryMaxBytes uint64
	TasksMax       int
	CPUQuotaPct    int
	Wall           time.Duration
	// Confine (Pipe): Argv is klbr-kernel, and its sandbox flags go
	// after Argv[0]: its program may write only the unit's directory, read
	// the tree cache, reach nothing else of the work directory (other units)
	// nor the login's home, nor the service manager, and runs without
	// capabilities (a job's containment, and klbr-kernel's sandbox in it).
	// Confine (Start): Argv runs under the host's klbr-kernel (on the
	// login's PATH; ErrNoKernel without it) with the same sandbox, but no
	// read of the tree cache: Landlock lets it write only the unit's
	// directory (and its tmp/, its TMPDIR) and reach nothing of the login's
	// home or the work directory but that; nor, through /proc, another
	// job's processes.
	Confine bool
	// Inputs (Start), when set, is a directory on the host (a tree PutTree
	// made) whose content is copied into the unit's directory before the
	// unit starts.
	Inputs string
	// Workspace (Confine only), when set, names a workspace on the host
	// (MakeWorkspace): the unit works there (its working directory), and may
	// write it besides its own directory.
	Workspace string
}

// ErrNoKernel says a confined unit was asked of a host with no klbr-kernel
// on its login's PATH: nothing was started.
var ErrNoKernel = errors.New("no klbr-kernel on the host")

var unitName = regexp.MustCompile(`^klbr-[a-z0-9][a-z0-9-]{0,200}\.service$`)

// CheckUnitName refuses a name that is not klbr-….service of plain characters.
func CheckUnitName(name string) error {
	if !unitName.MatchString(name) {
		return fmt.Errorf("hosts: %q is not a klbr unit name (klbr-[a-z0-9-]+.service)", name)
	}
	return nil
}

var envKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// workDir is the shell expression of a unit's directory on the host.
func (c *conn) workDir(unit string) string {
	return c.workRoot() + "/" + Quote(unit)
}

// workRoot is the shell expression of the directory that holds the units'
// directories on the host.
func (c *conn) workRoot() string {
	if c.h.WorkDir != "" {
		return Quote(c.h.WorkDir)
	}
	return `"$HOME/.cache/klbr/work"`
}

// containment are the properties that keep a job to its own directory. Its
// unit runs as the login's uid, as every other job of klbr-core there does,
// so its directory's mode parts nothing: the unit's mount namespace does.
// The login's home and the work root are empty tmpfs in it, with only the
// job's own directory bound back ($d); the system bus, systemd's private
// socket and the login's runtime directory (its user manager's private
// socket and bus) are gone, since through them (the login's own manager,
// or a polkit rule for klbr-* units) a job could start a unit of its
// choosing, outside its containment; and it has no capabilities, so that a
// job of a root login cannot undo any of it. Its /tmp and /var/tmp are its
// own (PrivateTmp): the host's temporary files are out of its sight, and a
// work root under /tmp costs klbr-kernel's Landlock rules a handful of
// entries there to grant around it, not one per file of the host's /tmp.
// klbr-kernel's Landlock leaves /dev writable for the devices, so two
// more: /dev is mounted read-only (a device node opens for writing on a
// read-only mount: GPUs work; a root login's job makes no file there), and
// /dev/shm, which every login may write, is a tmpfs of the unit's own
// (world-writable and sticky as the host's), not a place its jobs share.
const containment = `-p "TemporaryFileSystem=$HOME $r" -p "BindPaths=$d" -p PrivateTmp=yes ` +
	`-p "ReadOnlyPaths=/dev" -p "TemporaryFileSystem=/dev/shm:mode=1777,nosuid,nodev" ` +
	`-p "InaccessiblePaths=-/run/dbus -/var/run/dbus -/run/systemd/private -/run/user/$(id -u)" ` +
	`-p CapabilityBoundingSet= -p AmbientCapabilities=`

// ErrGone says a unit's start reached its host once, but the unit is not
// there any more (the host rebooted, or it was collected by hand): it is
// never started again under its name.
var ErrGone = errors.New("the unit was started on the host once and is gone")

// Start starts u on host unless a unit of its name was ever started there;
// existed says the unit is there already. Either way, exactly one unit of
// that name has been started on the host. A marker beside the unit's
// directory (WORK_DIR/.<unit>.started, out of every unit's reach) is made
// just before systemd-run and removed by Collect: a marker without its unit
// means the start reached systemd once and the unit is gone since, and
// Start refuses with ErrGone rather than start it a second time. A start
// cut off before the marker (while its directory or inputs were being
// made) is begun again from an empty directory. Starts of
// one name are serialized on the host (flock), so a start that a crash of
// klbr-core left running there is finished before the next one asks. An
// error of kind ErrUnreachable, ErrHostKey or ErrAuth means nothing was
// sent; ErrLost means the start may or may not have happened: Start again
// says which, and never starts a second unit.
func (e *Engine) Start(ctx context.Context, host string, u Unit) (existed bool, err error) {
	c, err := e.conn(host)
	if err != nil {
		return false, err
	}
	if err := CheckUnitName(u.Name); err != nil {
		return false, err
	}
	if len(u.Argv) == 0 || u.Argv[0] == "" {
		return false, errors.New("hosts: a unit needs a program")
	}
	quoted, err := c.runArgs(u, "-p", "RemainAfterExit=yes") // the outcome stays readable until Collect
	if err != nil {
		return false, err
	}
	argv := make([]string, len(u.Argv))
	for i, a := range u.Argv {
		argv[i] = Quote(a)
	}
	// Confined, klbr-kernel goes before the program with its sandbox
	// (Landlock, no capabilities), which the environment crosses by name.
	// The kernel is bound back read-only: the unit's /tmp is its own, and
	// the host's klbr-kernel may live under the host's /tmp (a test host).
	check, prep, kern, bind := "", "", "", ""
	if u.Confine {
		bind = ` -p "BindReadOnlyPaths=$k"`
		check = `k=$(command -v klbr-kernel) || { echo no-kernel; exit 0; }
`
		prep = `mkdir -p -- "$d/tmp" || fail
`
		kern = `"$k" --deny "$HOME" --deny "$r" --rw "$d" --tmp "$d/tmp" --drop-caps`
		for _, k := range slices.Sorted(maps.Keys(u.Env)) {
			kern += " --keep-env " + Quote(k)
		}
		kern += " --"
	}
	if u.Inputs != "" {
		prep += "cp -R -- " + Quote(u.Inputs) + `/. "$d"/ || fail` + "\n"
	}
	script := fmt.Sprintf(`set -u
u=%s
r=%s
d="$r"/%s
mkdir -p -- "$r" || exit 1
exec 9>>"$r/.$u.lock" || exit 1
if command -v flock >/dev/null 2>&1; then flock 9 || exit 1; fi
if [ "$(systemctl show --property=LoadState --value -- "$u")" != not-found ]; then echo existed; exit 0; fi
if [ -e "$r/.$u.started" ]; then echo gone; exit 0; fi
fail() { rm -rf -- "$d"; exit 1; }
%s
rm -rf -- "$d" && mkdir -m 700 -- "$d" || exit 1
%s: > "$r/.$u.started" || fail
%s %s %s -p "WorkingDirectory=$d" -p "StandardOutput=append:$d/output" -p "StandardError=append:$d/output" -- %s %s || { s=$?; rm -rf -- "$d" "$r/.$u.started"; exit $s; }
echo started
`, Quote(u.Name), c.workRoot(), Quote(u.Name), check, prep, strings.Join(quoted, " "), c.identity(), containment+bind, kern, strings.Join(argv, " "))
	var out bytes.Buffer
	if err := c.run(ctx, script, &limited{w: &out, n: 4096}); err != nil {
		return false, err
	}
	switch strings.TrimSpace(out.String()) {
	case "existed":
		return true, nil
	case "started":
		return false, nil
	case "no-kernel":
		return false, fmt.Errorf("host %s: start %s: %w on the PATH of the login: install klbr there (NixOS: services.klbr-worker.enable), then the job can run", host, u.Name, ErrNoKernel)
	case "gone":
		return false, fmt.Errorf("host %s: %s: %w", host, u.Name, ErrGone)
	}
	return false, fmt.Errorf("host %s: start %s: unexpected answer %q", host, u.Name, out.String())
}

// runArgs is the systemd-run command line, quoted for the shell, that starts
// u in klbr.slice with its limits (the host's where u has none), its
// environment and extra.
func (c *conn) runArgs(u Unit, extra ...string) ([]string, error) {
	mem, tasks, cpu, wall := u.MemoryMaxBytes, u.TasksMax, u.CPUQuotaPct, u.Wall
	if mem == 0 {
		mem = c.h.MemoryMaxBytes
	}
	if tasks == 0 {
		tasks = c.h.TasksMax
	}
	if cpu == 0 {
		cpu = c.h.CPUQuotaPct
	}
	if wall == 0 {
		wall = c.h.Wall
	}
	wall = min(wall, c.h.Wall)
	run := append([]string{"systemd-run"}, c.managerFlag()...)
	run = append(run, "--quiet", "--no-ask-password", "--unit="+u.Name, "--slice=klbr.slice",
		"--description="+strings.Join(strings.Fields(strings.ToValidUTF8(u.Description, "?")), " "), // one line: list-units reads lines
		"-p", "NoNewPrivileges=yes",
		"-p", fmt.Sprintf("MemoryMax=%d", mem),
		"-p", fmt.Sprintf("TasksMax=%d", tasks),
		"-p", fmt.Sprintf("CPUQuota=%d%%", cpu),
		"-p", fmt.Sprintf("RuntimeMaxSec=%d", max(1, int(wall/time.Second))),
	)
	run = append(run, extra...)
	for _, k := range slices.Sorted(maps.Keys(u.Env)) {
		if !envKey.MatchString(k) {
			return nil, fmt.Errorf("hosts: %q is not an environment variable name", k)
		}
		run = append(run, "--setenv="+k+"="+u.Env[k])
	}
	quoted := make([]string, len(run))
	for i, a := range run {
		quoted[i] = Quote(a)
	}
	return quoted, nil
}

// UnitState is a unit's state on its host.
type UnitState struct {
	Name        string
	LoadState   string // "not-found": no such unit
	ActiveState string
	SubState    string
	Result      string
	MainCode    string // ExecMainCode: "1" exited, "2" killed, "3" dumped, "0" not yet
	MainStatus  int    // exit status or signal
	MainPID     int
}

// Exists reports whether the unit is known to the host.
func (s UnitState) Exists() bool { return s.LoadState != "" && s.LoadState != "not-found" }

// Ended reports whether the unit's main process has ended.
func (s UnitState) Ended() bool {
	return s.Exists() && (s.ActiveState == "failed" || s.ActiveState == "inactive" || s.SubState == "exited")
}

// Outcome describes an ended unit: its exit status (-1 when killed by a
// signal) and a reason when it did not exit 0.
func (s UnitState) Outcome() (exit int, reason string) {
	if s.MainCode == "1" && s.MainStatus == 0 {
		return 0, ""
	}
	// The host's systemd says why it ended the unit, whatever its main
	// process (klbr-kernel, around a confined job) made of it.
	switch s.Result {
	case "oom-kill":
		return -1, "killed by the host's systemd: out of memory (MemoryMax)"
	case "timeout":
		return -1, "killed by the host's systemd: ran past its wall-time limit (RuntimeMaxSec)"
	}
	switch s.MainCode {
	case "1": // CLD_EXITED
		why := fmt.Sprintf("exit status %d", s.MainStatus)
		// klbr-kernel (around a confined job) exits 128+N when its child
		// was killed by signal N. Without cgroup v2 the host's systemd
		// cannot tell an OOM kill (Result=oom-kill) from another SIGKILL.
		if sig := s.MainStatus - 128; sig > 0 && sig < 65 {
			why += fmt.Sprintf(": killed by signal %d", sig)
			if sig == 9 {
				why += " (SIGKILL: on the host, the kernel's OOM killer under MemoryMax, or a stop)"
			}
		}
		return s.MainStatus, why
	case "2", "3":
		why := fmt.Sprintf("killed by signal %d", s.MainStatus)
		if s.MainStatus == 9 {
			why += " (SIGKILL: on the host, the kernel's OOM killer under MemoryMax, or a stop)"
		}
		return -1, why
	}
	if s.Result != "" && s.Result != "success" {
		return -1, "the unit failed: " + s.Result
	}
	return -1, "the unit ended without an exit status"
}

var stateProps = []string{"Id", "LoadState", "ActiveState", "SubState", "Result", "ExecMainCode", "ExecMainStatus", "MainPID"}

// State asks the host for the state of units, one command for all.
func (e *Engine) State(ctx context.Context, host string, units ...string) ([]UnitState, error) {
	c, err := e.conn(host)
	if err != nil {
		return nil, err
	}
	if len(units) == 0 {
		return nil, nil
	}
	q := make([]string, len(units))
	for i, u := range units {
		if err := CheckUnitName(u); err != nil {
			return nil, err
		}
		q[i] = Quote(u)
	}
	script := "systemctl show --property=" + strings.Join(stateProps, ",") + " -- " + strings.Join(q, " ")
	var out bytes.Buffer
	if err := c.run(ctx, script, &limited{w: &out, n: 64 << 10 * len(units)}); err != nil {
		return nil, err
	}
	states := parseShow(out.Bytes())
	if len(states) != len(units) {
		return nil, fmt.Errorf("host %s: systemctl show answered %d units for %d", host, len(states), len(units))
	}
	for i := range states {
		states[i].Name = units[i]
	}
	return states, nil
}

// parseShow reads systemctl show's blocks of Key=Value lines, separated by
// blank lines.
func parseShow(b []byte) []UnitState {
	var out []UnitState
	var cur *UnitState
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			cur = nil
			continue
		}
		if cur == nil {
			out = append(out, UnitState{})
			cur = &out[len(out)-1]
		}
		k, v, _ := strings.Cut(line, "=")
		switch k {
		case "LoadState":
			cur.LoadState = v
		case "ActiveState":
			cur.ActiveState = v
		case "SubState":
			cur.SubState = v
		case "Result":
			cur.Result = v
		case "ExecMainCode":
			cur.MainCode = v
		case "ExecMainStatus":
			cur.MainStatus, _ = strconv.Atoi(v)
		case "MainPID":
			cur.MainPID, _ = strconv.Atoi(v)
		}
	}
	return out
}

// Stop stops a unit on its host, and with it every process of its control
// group.
func (e *Engine) Stop(ctx context.Context, host, unit string) error {
	c, err := e.conn(host)
	if err != nil {
		return err
	}
	if err := CheckUnitName(unit); err != nil {
		return err
	}
	return c.run(ctx, "systemctl stop -- "+Quote(unit)+" 2>/dev/null || true", io.Discard)
}

// Output copies the first max bytes of a unit's output (its stdout and
// stderr) to w and returns the output's whole size; a unit that put
// something else than a regular file in its output's place has none.
func (e *Engine) Output(ctx context.Context, host, unit string, max int64, w io.Writer) (int64, error) {
	c, err := e.conn(host)
	if err != nil {
		return 0, err
	}
	if err := CheckUnitName(unit); err != nil {
		return 0, err
	}
	// The file is in the unit's own directory, which its programs may
	// write: it is read only when it is a regular file, never through a
	// link put in its place (O_NOFOLLOW; O_NONBLOCK: no fifo stalls it).
	script := fmt.Sprintf(`f=%s/output
if [ -f "$f" ] && [ ! -L "$f" ]; then stat -c %%s -- "$f"; exec dd if="$f" iflag=nofollow,nonblock,count_bytes count=%d bs=65536 status=none; else echo 0; fi
`, c.workDir(unit), max)
	hw := &headerWriter{w: w}
	if err := c.run(ctx, script, hw); err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(hw.head)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("host %s: output size of %s: %q", host, unit, hw.head)
	}
	return n, nil
}

// Tail returns the last n bytes (at most 1 MiB) of a unit's output (its
// stdout and stderr) on host: a worker's last words. The file is in the
// unit's own directory, which its programs may write: it is read only
// when it is a regular file, never through a link a program of the unit
// put in its place (O_NOFOLLOW, O_NONBLOCK: no fifo stalls the read).
// Nothing (no error) when there is no such file.
func (e *Engine) Tail(ctx context.Context, host, unit string, n int) ([]byte, error) {
	c, err := e.conn(host)
	if err != nil {
		return nil, err
	}
	if err := CheckUnitName(unit); err != nil {
		return nil, err
	}
	n = max(0, min(n, 1<<20))
	script := fmt.Sprintf(`f=%s/output
[ -f "$f" ] && [ ! -L "$f" ] || exit 0
s=$(stat -c %%s -- "$f") || exit 0
k=0; [ "$s" -gt %d ] && k=$((s - %d))
exec dd if="$f" iflag=nofollow,nonblock,skip_bytes,count_bytes skip="$k" count=%d bs=65536 status=none
`, c.workDir(unit), n, n, n)
	var out bytes.Buffer
	if err := c.run(ctx, script, &limited{w: &out, n: n}); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// headerWriter passes on everything after the first line, which it keeps.
type headerWriter struct {
	w    io.Writer
	head []byte
	done bool
}

func (h *headerWriter) Write(p []byte) (int, error) {
	n := len(p)
	if !h.done {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(h.head) < 64 {
				h.head = append(h.head, p...)
			}
			return n, nil
		}
		h.head = append(h.head, p[:i]...)
		h.done = true
		p = p[i+1:]
	}
	if len(p) > 0 {
		if _, err := h.w.Write(p); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// Collect forgets an ended unit on its host: stops it (a unit that
// remained after its exit), resets a failed one, and removes its directory.
func (e *Engine) Collect(ctx context.Context, host, unit string) error {
	c, err := e.conn(host)
	if err != nil {
		return err
	}
	if err := CheckUnitName(unit); err != nil {
		return err
	}
	c.unforward(unit)
	script := fmt.Sprintf(`u=%s
systemctl stop -- "$u" 2>/dev/null
systemctl reset-failed -- "$u" 2>/dev/null
rm -rf -- %s
rm -f -- %s/.%s.lock %s/.%s.started
true
`, Quote(unit), c.workDir(unit), c.workRoot(), Quote(unit), c.workRoot(), Quote(unit))
	return c.run(ctx, script, io.Discard)
}

// Pipe returns the command that starts u on host as a transient service
// whose standard input and output are the command's own (systemd-run
// --pipe): a session of the host's one connection, so the bytes travel over
// it. Set the command's Stdin and Stdout and start it; the unit ends when
// its program does, and is unloaded then (--collect). u.Argv[0] is looked up
// on the login's PATH. A unit of u's name that exists already is refused
// (exit status 75): the name is the worker's identity, one generation each.
// The session is not tied to ctx beyond the connect: stop it with Stop.
func (e *Engine) Pipe(ctx context.Context, host string, u Unit) (*exec.Cmd, error) {
	c, script, err := e.workerScript(host, u, false)
	if err != nil {
		return nil, err
	}
	if err := c.connect(ctx); err != nil {
		return nil, err
	}
	return c.session(context.Background(), script), nil
}

// Serve starts u on host as a plain transient service (no --pipe) whose
// program, klbr-kernel, listens on the unit's protocol socket
// (WORK_DIR/<unit>/protocol.sock: --listen) for the connections Attach
// makes; its output goes to WORK_DIR/<unit>/output. The unit lives under
// the host's systemd independent of any SSH session, and is unloaded when
// its program ends (--collect). A unit of u's name that exists already is
// refused.
//
// The host's klbr-kernel must speak this klbr-core's protocol: one that
// does not (an older release) is refused before anything starts, with
// ErrKernelProtocol, its version and the fix.
func (e *Engine) Serve(ctx context.Context, host string, u Unit) error {
	c, script, err := e.workerScript(host, u, true)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	err = c.run(ctx, script, &limited{w: &out, n: 512})
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == exitOtherProtocol {
		line, _, _ := strings.Cut(out.String(), "\n")
		path, kv, _ := strings.Cut(line, " ")
		ver, proto, _ := kernel.ParseVersionLine(kv)
		p := kernelProblem(path, ver, proto)
		if p == nil { // the line says this protocol after all: not a shell's glob of it
			p = &Problem{What: fmt.Sprintf("the host's klbr-kernel (%s) says %q", path, kv), Fix: "install the same klbr release on the host as here"}
		}
		return fmt.Errorf("host %s: start %s: %w: %s; %s", host, u.Name, ErrKernelProtocol, p.What, p.Fix)
	}
	return err
}

// exitOtherProtocol is the exit status of Serve's script when the host's
// klbr-kernel does not say this klbr-core's protocol (it prints where the
// kernel is and what it said first).
const exitOtherProtocol = 76

// Attach returns the command, a session of the host's one connection
// (connected first, again if it dropped), that relays its stdin and stdout
// to unit's protocol socket (kernel --attach): one connection of the
// unit's resumable protocol stream. kernel is looked up on the login's PATH.
func (e *Engine) Attach(ctx context.Context, host, unit, kernel string) (*exec.Cmd, error) {
	c, err := e.conn(host)
	if err != nil {
		return nil, err
	}
	if err := CheckUnitName(unit); err != nil {
		return nil, err
	}
	if err := c.connect(ctx); err != nil {
		return nil, err
	}
	return c.session(context.Background(), "exec "+Quote(kernel)+" --attach "+c.workDir(unit)+"/protocol.sock"), nil
}

// workerScript is the script that starts u: piped (systemd-run --pipe
// --wait, the session's stdin and stdout the unit's) or, with serve, as a
// service listening on its protocol socket.
func (e *Engine) workerScript(host string, u Unit, serve bool) (*conn, string, error) {
	c, err := e.conn(host)
	if err != nil {
		return nil, "", err
	}
	if err := CheckUnitName(u.Name); err != nil {
		return nil, "", err
	}
	if len(u.Argv) == 0 || u.Argv[0] == "" {
		return nil, "", errors.New("hosts: a unit needs a program")
	}
	extra, listen, check := []string{"--pipe", "--wait", "--collect"}, "", ""
	if serve {
		extra, listen = []string{"--collect"}, `-p "StandardOutput=append:$d/output" -p "StandardError=append:$d/output"`
		// --listen is protocol 3's: a kernel of another protocol is
		// refused here, before a unit exists, not after a handshake's
		// timeout.
		check = fmt.Sprintf(`v=$("$p" --version 2>/dev/null </dev/null | head -n 1 | head -c 200)
case "$v" in "klbr-kernel "*" protocol %d") ;; *) printf '%%s %%s\n' "$p" "$v"; exit %d;; esac
`, kernel.Protocol, exitOtherProtocol)
	}
	quoted, err := c.runArgs(u, extra...)
	if err != nil {
		return nil, "", err
	}
	argv := make([]string, len(u.Argv)-1)
	for i, a := range u.Argv[1:] {
		argv[i] = Quote(a)
	}
	if serve {
		argv = append([]string{`--listen "$d/protocol.sock"`}, argv...)
	}
	// Confined, the unit gets a job's containment (its own mount namespace:
	// an empty home and work root with its directory bound back, no bus, no
	// capabilities) with the tree cache bound back read-only, and
	// klbr-kernel's own sandbox inside it, as a local worker has.
	confine, props, wd := "", "", `"$d"`
	if u.Confine {
		confine = `mkdir -p -- "$c" "$d/tmp"
set -- --deny "$r" --deny "$HOME/.ssh" --ro "$c" --rw "$d" --tmp "$d/tmp" --drop-caps`
		props = containment + ` -p "BindReadOnlyPaths=$c" -p "BindReadOnlyPaths=$p"`
	}
	if u.Workspace != "" {
		if !u.Confine {
			return nil, "", errors.New("hosts: a workspace is for a confined unit")
		}
		if err := CheckWorkspaceName(u.Workspace); err != nil {
			return nil, "", err
		}
		confine = `w="$r"/` + Quote(u.Workspace) + `
[ -d "$w" ] || { echo "klbr: the workspace $w is not on the host" >&2; exit 66; }
` + confine + ` --rw "$w"`
		props += ` -p "BindPaths=$w"`
		wd = `"$w"`
	}
	script := fmt.Sprintf(`set -u
u=%s
r=%s
d="$r"/%s
c="$r"/cache
if [ "$(systemctl show --property=LoadState --value -- "$u")" != not-found ]; then echo "klbr: $u exists on the host already" >&2; exit 75; fi
p=$(command -v -- %s) || { echo "klbr: %s is not on the PATH of $(id -un) on the host" >&2; exit 127; }
%smkdir -p -- "$d" && chmod 700 -- "$d"
set --
%s
exec %s %s %s %s -p "WorkingDirectory="%s -- "$p" "$@" %s
`, Quote(u.Name), c.workRoot(), Quote(u.Name), Quote(u.Argv[0]), Quote(u.Argv[0]), check, confine,
		strings.Join(quoted, " "), c.identity(), props, listen, wd, strings.Join(argv, " "))
	return c, script, nil
}

// Units lists the units on host whose names match prefix* (a klbr unit
// name's beginning, such as "klbr-job-"), loaded or ended.
func (e *Engine) Units(ctx context.Context, host, prefix string) ([]UnitLine, error) {
	c, err := e.conn(host)
	if err != nil {
		return nil, err
	}
	if !unitPrefix.MatchString(prefix) {
		return nil, fmt.Errorf("hosts: %q is not the beginning of a klbr unit name", prefix)
	}
	var out bytes.Buffer
	if err := c.run(ctx, "systemctl list-units --all --plain --no-legend --no-pager "+Quote(prefix+"*"), &limited{w: &out, n: 1 << 20}); err != nil {
		return nil, err
	}
	return parseUnits(out.String()), nil
}

// parseUnits reads systemctl list-units --plain --no-legend: the klbr units
// among its lines, one a line at most.
func parseUnits(out string) []UnitLine {
	var units []UnitLine
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 4 && unitName.MatchString(f[0]) {
			units = append(units, UnitLine{Unit: f[0], Active: f[2], Sub: f[3]})
		}
	}
	return units
}

var unitPrefix = regexp.MustCompile(`^klbr-[a-z0-9-]{0,100}$`)

// Package hosttest boots a second host on this machine for tests of worker
// hosts: a network namespace with its own address on a veth pair (the root
// side is .1, the host .2 of a private 10.77.N.0/24), a real systemd as PID
// 1 of its PID and mount namespaces (package systemdlab), and a real
// OpenSSH sshd, run by that systemd, listening only on the host's address
// with a generated host key and one authorized client key. Whatever reaches
// the host from the root namespace does so by SSH, as klbr-core reaches a
// machine on the network. Test support: the product never uses it.
package hosttest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/systemdlab"
	"github.com/klbr-dev/klbr/internal/workertest"
)

// Port is where the host's sshd listens (not 22, so that the port of
// user@host:port is exercised).
const Port = 2222

// User is the account the client logs in as on a host of Start: root,
// whose system manager's transient units need no polkit rule.
const User = "root"

// Worker is the account the client logs in as on a host of StartWorker:
// unprivileged, lingering, its own user manager running.
const Worker = "klbr"

// Require skips tb, or under CI=true fails it, unless this machine can boot
// a host: what the systemd lab needs, plus iproute2 and OpenSSH (Debian:
// apt-get install -y iproute2 openssh-server openssh-client).
func Require(tb testing.TB) {
	tb.Helper()
	if reason := Missing(); reason != "" {
		citest.SkipOrFail(tb, reason)
	}
}

// Missing says what this machine lacks to boot a host ("": nothing): a
// test that can do without one (the soak's host part) asks it instead of
// Require.
func Missing() string {
	if reason := systemdlab.Missing("ip", "ssh", "ssh-keygen"); reason != "" {
		return reason
	}
	if _, err := os.Stat(sshd); err != nil {
		return sshd + " is missing (apt-get install -y openssh-server)"
	}
	return ""
}

const sshd = "/usr/sbin/sshd"

// Host is a booted second host.
type Host struct {
	Name string // a name for configuration: "lab"
	Addr string // its address, 10.77.N.2
	Gw   string // the root namespace's side, 10.77.N.1
	Port int
	User string
	// Manager is [hosts.NAME] manager for this host: "system" for root's
	// login (Start), "user" for the worker account's (StartWorker).
	Manager string
	// UID is the login's uid on the host.
	UID int
	// Dir holds the client's and the host's keys, sshd's configuration and
	// log, and WorkDir.
	Dir            string
	IdentityFile   string // the client's private key (authorized on the host)
	KnownHostsFile string // a known_hosts file that knows the host's key
	HostKeyFile    string // the host's private key
	SSHDLog        string
	// WorkDir is a directory for the host's work (the machine's /root is
	// shared with the lab: tests keep off it).
	WorkDir string
	// BinDir is on the PATH of every SSH session on the host (the lab
	// shares the machine's /usr and /root, whose shell profile may put
	// more before it): a test puts the host's klbr-kernel there.
	BinDir string
	PID1   string // the host pid of the namespace's PID 1
	// Hostname is the host's own name (its UTS namespace's): what
	// os.uname().nodename says of a process that runs there.
	Hostname string

	veth string // the root side of the veth pair
}

// SSH is the host as configuration writes it: user@addr:port.
func (h *Host) SSH() string { return fmt.Sprintf("%s@%s:%d", h.User, h.Addr, h.Port) }

// Start boots a host whose login is root; t.Cleanup removes everything it
// made (the namespaces and their processes, the veth pair, the cgroups).
func Start(t testing.TB) *Host {
	t.Helper()
	return start(t, false)
}

// StartWorker boots a host whose login is Worker, an unprivileged account
// as a worker host has it: lingering, so that its user manager runs
// without a session, and no polkit rule. The account exists only on the
// host: its /etc/passwd, /etc/group and /etc/shadow are private copies of
// the machine's, with the account added, bound over the originals in the
// host's own mount namespace (the machine's /etc is never changed).
func StartWorker(t testing.TB) *Host {
	t.Helper()
	return start(t, true)
}

func start(t testing.TB, worker bool) *Host {
	t.Helper()
	Require(t)
	dir, err := os.MkdirTemp("", "klbr-host-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	net, release, err := claimSubnet()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	h := &Host{Name: "lab", Addr: fmt.Sprintf("10.77.%d.2", net), Gw: fmt.Sprintf("10.77.%d.1", net),
		Port: Port, User: User, Manager: "system", Dir: dir, IdentityFile: filepath.Join(dir, "id_ed25519"),
		KnownHostsFile: filepath.Join(dir, "known_hosts"), HostKeyFile: filepath.Join(dir, "ssh_host_ed25519_key"),
		SSHDLog: filepath.Join(dir, "sshd.log"), WorkDir: filepath.Join(dir, "work"), BinDir: filepath.Join(dir, "bin"), veth: fmt.Sprintf("klbrh%d", net)}
	for _, d := range []string{h.WorkDir, h.BinDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.keys(); err != nil {
		t.Fatal(err)
	}
	lab, err := systemdlab.Prepare(t, filepath.Join(dir, "lab"), labName())
	if err != nil {
		t.Fatal(err)
	}
	if worker {
		if err := h.worker(lab); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.writeSSHD(lab.Run); err != nil {
		t.Fatal(err)
	}
	lab.UTS = true
	pid1, halt, err := lab.Boot(t)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(halt)
	h.PID1 = pid1
	h.Hostname = fmt.Sprintf("klbr-lab-%d", net)
	if out, err := h.Enter("hostname", h.Hostname).CombinedOutput(); err != nil {
		t.Fatalf("name the host: %v\n%s", err, out)
	}
	// The veth goes after halt in cleanup order (cleanups run last first):
	// deleting the root side deletes the pair; a namespace that dies takes
	// its side along, and then the root side too.
	if err := h.link(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", h.veth).Run() })
	if worker {
		if err := h.workerManager(); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := h.Enter("systemctl", "start", "hosttest-sshd.service").CombinedOutput(); err != nil {
		log, _ := os.ReadFile(h.SSHDLog)
		t.Fatalf("start sshd on the host: %v\n%s\n%s", err, out, log)
	}
	if err := h.waitSSHD(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("host %s booted: systemd pid %s, sshd on %s:%d", h.Name, pid1, h.Addr, h.Port)
	return h
}

// labName is the prefix of the lab's cgroups: one per test binary, so that
// packages that run at once never sweep each other's (package systemdlab).
func labName() string {
	base := strings.ToLower(strings.TrimSuffix(filepath.Base(os.Args[0]), ".test"))
	base = regexp.MustCompile(`[^a-z0-9-]+`).ReplaceAllString(base, "-")
	if len(base) > 24 {
		base = base[:24]
	}
	return "klbr-host-" + strings.Trim(base, "-")
}

// claimSubnet picks N for 10.77.N.0/24, held by an exclusive lock on a file
// that every test binary of the machine uses, until release.
func claimSubnet() (int, func(), error) {
	start := rand.IntN(250)
	for i := range 250 {
		n := 1 + (start+i)%250
		f, err := os.OpenFile(filepath.Join(os.TempDir(), fmt.Sprintf("klbr-hosttest-net-%d.lock", n)), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return 0, nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		// A veth that a killed test left behind (its namespace gone, the
		// pair gone with it, unless the kill came between) is ours now.
		_ = exec.Command("ip", "link", "del", fmt.Sprintf("klbrh%d", n)).Run()
		return n, func() { f.Close() }, nil
	}
	return 0, nil, errors.New("hosttest: every 10.77.N.0/24 is taken by other tests")
}

// keys generates the client's key, the host's key, authorized_keys and
// known_hosts.
func (h *Host) keys() error {
	for _, k := range []string{h.IdentityFile, h.HostKeyFile} {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "klbr-hosttest", "-f", k).CombinedOutput(); err != nil {
			return fmt.Errorf("ssh-keygen: %v\n%s", err, out)
		}
	}
	client, err := os.ReadFile(h.IdentityFile + ".pub")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(h.Dir, "authorized_keys"), client, 0o600); err != nil {
		return err
	}
	return h.writeKnownHosts()
}

// KnownHostsLine is the known_hosts line of the host's current key.
func (h *Host) KnownHostsLine() (string, error) {
	pub, err := os.ReadFile(h.HostKeyFile + ".pub")
	if err != nil {
		return "", err
	}
	f := strings.Fields(string(pub))
	if len(f) < 2 {
		return "", fmt.Errorf("hosttest: malformed %s.pub", h.HostKeyFile)
	}
	return fmt.Sprintf("[%s]:%d %s %s\n", h.Addr, h.Port, f[0], f[1]), nil
}

func (h *Host) writeKnownHosts() error {
	line, err := h.KnownHostsLine()
	if err != nil {
		return err
	}
	return os.WriteFile(h.KnownHostsFile, []byte(line), 0o600)
}

// writeSSHD writes sshd's configuration and the unit that runs it on the
// host. sshd takes nothing from the machine's /etc/ssh.
func (h *Host) writeSSHD(run string) error {
	conf := strings.Join([]string{
		fmt.Sprintf("ListenAddress %s:%d", h.Addr, h.Port),
		"HostKey " + h.HostKeyFile,
		"AuthorizedKeysFile " + filepath.Join(h.Dir, "authorized_keys"),
		"AuthenticationMethods publickey",
		"PermitRootLogin prohibit-password",
		"PasswordAuthentication no",
		"KbdInteractiveAuthentication no",
		"UsePAM no",
		"StrictModes no", // the keys live under /tmp (world-writable, sticky)
		"PidFile none",
		"MaxSessions 64",
		"LogLevel VERBOSE",
		"PrintMotd no",
		"SetEnv PATH=" + h.BinDir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"",
	}, "\n")
	if err := os.WriteFile(filepath.Join(h.Dir, "sshd_config"), []byte(conf), 0o600); err != nil {
		return err
	}
	// ProtectHome= would hide /run/user too: the worker account's user
	// manager is reached there.
	home := "ProtectHome=tmpfs"
	if h.Manager == "user" {
		home = "TemporaryFileSystem=/root /home"
	}
	unit := fmt.Sprintf(`[Unit]
Description=the test host's sshd
[Service]
RuntimeDirectory=sshd
RuntimeDirectoryMode=0755
# The host shares this machine's /etc and /root; a login's shell would
# read root's startup files (a pyenv's rehash, say) before each command.
# A worker host's login has a home of its own: so does this one, empty.
%s
ExecStart=%s -D -e -f %s -E %s
KillMode=process
`, home, sshd, filepath.Join(h.Dir, "sshd_config"), h.SSHDLog)
	return os.WriteFile(filepath.Join(run, "systemd", "system", "hosttest-sshd.service"), []byte(unit), 0o644)
}

// link makes the veth pair: the root side with Gw, the host's side, moved
// into the namespace of its PID 1, with Addr.
func (h *Host) link() error {
	peer := h.veth + "p"
	steps := [][]string{
		{"ip", "link", "add", h.veth, "type", "veth", "peer", "name", peer},
		{"ip", "link", "set", peer, "netns", h.PID1},
		{"ip", "addr", "add", h.Gw + "/24", "dev", h.veth},
		{"ip", "link", "set", h.veth, "up"},
	}
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v\n%s", strings.Join(s, " "), err, out)
		}
	}
	inner := [][]string{
		{"ip", "link", "set", peer, "name", "eth0"},
		{"ip", "addr", "add", h.Addr + "/24", "dev", "eth0"},
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "link", "set", "lo", "up"},
	}
	for _, s := range inner {
		if out, err := h.Enter(s...).CombinedOutput(); err != nil {
			return fmt.Errorf("on the host: %s: %v\n%s", strings.Join(s, " "), err, out)
		}
	}
	return nil
}

// Enter returns a command that runs argv on the host, beside its systemd
// (its mount, PID, network and UTS namespaces), not through SSH.
func (h *Host) Enter(argv ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"-t", h.PID1, "-m", "-p", "-n", "-u"}, argv...)...)
}

// NetNS is the identity of the host's network namespace
// ("net:[4026532…]"): a process that reports it ran on the host.
func (h *Host) NetNS() (string, error) {
	return os.Readlink("/proc/" + h.PID1 + "/ns/net")
}

func (h *Host) waitSSHD(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	addr := net.JoinHostPort(h.Addr, strconv.Itoa(h.Port))
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(h.SSHDLog)
			return fmt.Errorf("sshd on the host does not answer at %s: %v\n%s", addr, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// RotateHostKey gives the host a new key and restarts its sshd: a client
// that knew the old key sees a changed one. known_hosts is left as it was.
func (h *Host) RotateHostKey(t testing.TB) {
	t.Helper()
	os.Remove(h.HostKeyFile)
	os.Remove(h.HostKeyFile + ".pub")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "klbr-hosttest", "-f", h.HostKeyFile).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	if out, err := h.Enter("systemctl", "restart", "hosttest-sshd.service").CombinedOutput(); err != nil {
		t.Fatalf("restart sshd: %v\n%s", err, out)
	}
	if err := h.waitSSHD(10 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// SetLink takes the host's link down (false) or up (true), from the root
// side: the host is unreachable, its units keep running.
func (h *Host) SetLink(t testing.TB, up bool) {
	t.Helper()
	state := "down"
	if up {
		state = "up"
	}
	if out, err := exec.Command("ip", "link", "set", h.veth, state).CombinedOutput(); err != nil {
		t.Fatalf("ip link set %s %s: %v\n%s", h.veth, state, err, out)
	}
}

// Accepted counts the SSH connections sshd has accepted since it started.
func (h *Host) Accepted() (int, error) {
	b, err := os.ReadFile(h.SSHDLog)
	if err != nil {
		return 0, err
	}
	return bytes.Count(b, []byte("Accepted publickey for ")), nil
}

// Units lists the units matching pattern of the login's service manager
// on the host (systemctl list-units --all), one name a line.
func (h *Host) Units(pattern string) ([]string, error) {
	out, err := h.Systemctl("list-units", "--all", "--plain", "--no-legend", "--no-pager", pattern).Output()
	if err != nil {
		return nil, fmt.Errorf("systemctl list-units: %w", err)
	}
	var units []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			units = append(units, f[0])
		}
	}
	return units, nil
}

// InstallKernel puts this build's klbr-kernel on the PATH of the host's
// login (in BinDir): jobs on a host run under it (package hosts, Confine).
func (h *Host) InstallKernel(t testing.TB) {
	t.Helper()
	b, err := os.ReadFile(workertest.Setup(t).Kernel)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.BinDir, "klbr-kernel"), b, 0o755); err != nil {
		t.Fatal(err)
	}
}

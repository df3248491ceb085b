package hosttest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// The host answers SSH with the generated keys, strictly checked, and what
// runs there runs in its own network namespace beside its own systemd.
func TestHost(t *testing.T) {
	h := Start(t)
	ssh := func(argv ...string) *exec.Cmd {
		return exec.Command("ssh", append([]string{"-F", "none", "-p", strconv.Itoa(h.Port), "-i", h.IdentityFile,
			"-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes",
			"-o", "UserKnownHostsFile=" + h.KnownHostsFile, "-o", "GlobalKnownHostsFile=/dev/null",
			h.User + "@" + h.Addr}, argv...)...)
	}
	out, err := ssh("readlink /proc/self/ns/net; systemctl is-system-running; echo $SSH_CONNECTION; echo $PATH").CombinedOutput()
	if err != nil {
		t.Fatalf("ssh: %v\n%s", err, out)
	}
	want, err := h.NetNS()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 3 || lines[0] != want {
		t.Fatalf("the command over ssh saw\n%s\nwant its network namespace %s", out, want)
	}
	if !strings.HasPrefix(lines[2], h.Gw+" ") {
		t.Fatalf("the connection came from %q, want the root side %s", lines[2], h.Gw)
	}
	if len(lines) < 4 || !strings.Contains(":"+lines[3]+":", ":"+h.BinDir+":") {
		t.Fatalf("PATH on the host is %q, want %s on it", lines[3:], h.BinDir)
	}
	t.Logf("host: %s", strings.Join(lines, " | "))
	if n, err := h.Accepted(); err != nil || n != 1 {
		t.Fatalf("sshd accepted %d connections (%v), want 1", n, err)
	}

	h.RotateHostKey(t)
	out, err = ssh("true").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "REMOTE HOST IDENTIFICATION HAS CHANGED") {
		t.Fatalf("a changed host key was accepted: %v\n%s", err, out)
	}
}

// A worker host's login is an unprivileged account that exists only on
// the host (the machine's /etc stays as it was), lingers, and reaches its
// own user manager over SSH with no session of its own.
func TestWorkerHost(t *testing.T) {
	before, err := os.ReadFile("/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}
	h := StartWorker(t)
	out, err := exec.Command("ssh", "-F", "none", "-p", strconv.Itoa(h.Port), "-i", h.IdentityFile,
		"-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes",
		"-o", "UserKnownHostsFile="+h.KnownHostsFile, "-o", "GlobalKnownHostsFile=/dev/null",
		h.SSH()[:strings.LastIndex(h.SSH(), ":")],
		"id -un; id -u; XDG_RUNTIME_DIR=/run/user/$(id -u) systemctl --user show --property=Version >/dev/null && echo manager; ls /var/lib/systemd/linger").CombinedOutput()
	if err != nil {
		t.Fatalf("ssh: %v\n%s", err, out)
	}
	want := fmt.Sprintf("%s\n%d\nmanager\n%s\n", Worker, h.UID, Worker)
	if string(out) != want || h.UID == 0 || h.Manager != "user" {
		t.Fatalf("the worker login said\n%s\nwant\n%s", out, want)
	}
	if after, err := os.ReadFile("/etc/passwd"); err != nil || !bytes.Equal(before, after) {
		t.Fatalf("the machine's /etc/passwd changed (%v)", err)
	}
}

package hosttest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/klbr-dev/klbr/internal/systemdlab"
)

// worker makes the Worker account for the host before it boots: a uid
// free on this machine, private account files, a home, the client's key
// authorized for it, its lingering, and the host's files it must reach
// (the work directory, BinDir) its own or readable.
func (h *Host) worker(lab *systemdlab.Lab) error {
	uid, err := freeID()
	if err != nil {
		return err
	}
	h.User, h.Manager, h.UID = Worker, "user", uid
	etc := filepath.Join(h.Dir, "etc")
	home := filepath.Join(h.Dir, "home")
	for _, d := range []string{etc, home} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	// "*", not "!": OpenSSH without PAM takes "!" for a locked account
	// and refuses it even a key.
	for f, line := range map[string]string{
		"passwd": fmt.Sprintf("%s:x:%d:%d:klbr worker:%s:/bin/sh\n", Worker, uid, uid, home),
		"group":  fmt.Sprintf("%s:x:%d:\n", Worker, uid),
		"shadow": fmt.Sprintf("%s:*:19000:0:99999:7:::\n", Worker),
	} {
		b, err := os.ReadFile("/etc/" + f)
		if err != nil {
			return err
		}
		if len(b) > 0 && b[len(b)-1] != '\n' {
			b = append(b, '\n')
		}
		if err := os.WriteFile(filepath.Join(etc, f), append(b, line...), 0o644); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(etc, "shadow"), 0o600); err != nil {
		return err
	}
	if err := os.Chmod(etc, 0o755); err != nil {
		return err
	}
	// sshd reads authorized_keys as the login.
	for _, p := range []string{home, h.WorkDir, filepath.Join(h.Dir, "authorized_keys")} {
		if err := os.Chown(p, uid, uid); err != nil {
			return err
		}
	}
	for _, d := range []string{h.Dir, h.BinDir} {
		if err := os.Chmod(d, 0o755); err != nil {
			return err
		}
	}
	linger := filepath.Join(lab.VarLib, "systemd", "linger")
	if err := os.MkdirAll(linger, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(linger, Worker), nil, 0o644)
}

// workerManager binds the account files over the host's /etc and starts
// the account's user manager, as logind does at boot for a lingering user
// (the lab runs no logind).
func (h *Host) workerManager() error {
	for _, f := range []string{"passwd", "group", "shadow"} {
		if out, err := h.Enter("mount", "--bind", filepath.Join(h.Dir, "etc", f), "/etc/"+f).CombinedOutput(); err != nil {
			return fmt.Errorf("on the host: bind /etc/%s: %v\n%s", f, err, out)
		}
	}
	unit := fmt.Sprintf("user@%d.service", h.UID)
	if out, err := h.Enter("systemctl", "start", unit).CombinedOutput(); err != nil {
		st, _ := h.Enter("systemctl", "status", "--no-pager", unit).CombinedOutput()
		return fmt.Errorf("on the host: start %s: %v\n%s\n%s", unit, err, out, st)
	}
	bus := fmt.Sprintf("/run/user/%d/systemd/private", h.UID)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if err := h.Enter("test", "-S", bus).Run(); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("on the host: %s did not appear", bus)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Systemctl runs systemctl with args on the host, beside its systemd, for
// the login's service manager: the system's for root, the worker
// account's own for Worker.
func (h *Host) Systemctl(args ...string) *exec.Cmd {
	if h.Manager != "user" {
		return h.Enter(append([]string{"systemctl"}, args...)...)
	}
	id := strconv.Itoa(h.UID)
	return h.Enter(append([]string{"setpriv", "--reuid=" + id, "--regid=" + id, "--clear-groups",
		"env", "-i", "PATH=/usr/bin:/bin", "XDG_RUNTIME_DIR=/run/user/" + id, "systemctl", "--user"}, args...)...)
}

// freeID is a uid that is no user's and no group's id on this machine.
func freeID() (int, error) {
	used := map[int]bool{}
	for _, f := range []string{"/etc/passwd", "/etc/group"} {
		b, err := os.ReadFile(f)
		if err != nil {
			return 0, err
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if p := strings.Split(sc.Text(), ":"); len(p) > 2 {
				if n, err := strconv.Atoi(p[2]); err == nil {
					used[n] = true
				}
			}
		}
	}
	for id := 1500; id < 60000; id++ {
		if !used[id] {
			return id, nil
		}
	}
	return 0, fmt.Errorf("hosttest: no free uid")
}

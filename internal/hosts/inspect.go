package hosts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/kernel"
)

// Info is what a host says about itself: `klbr-core hosts` and doctor show it.
type Info struct {
	Name      string `json:"name"`
	SSH       string `json:"ssh"`
	Reachable bool   `json:"reachable"`
	Error     string `json:"error,omitempty"`   // why not, with the fix
	Systemd   string `json:"systemd,omitempty"` // systemctl --version, first line
	// SystemdVersion is the number of Systemd ("systemd 252 (252.39-1)": 252); 0 unknown.
	SystemdVersion int    `json:"systemd_version,omitempty"`
	Kernel         string `json:"klbr_kernel,omitempty"` // where klbr-kernel is on the host's PATH; "" none
	// KernelVersion and KernelProtocol are what the host's klbr-kernel
	// --version says; protocol 0: it did not say (too old, or not klbr's).
	KernelVersion  string     `json:"klbr_kernel_version,omitempty"`
	KernelProtocol int        `json:"klbr_kernel_protocol,omitempty"`
	CPUs           int        `json:"cpus,omitempty"`         // nproc
	MemoryBytes    int64      `json:"memory_bytes,omitempty"` // MemTotal
	MaxJobs        int        `json:"max_jobs"`
	Reserved       int        `json:"reserved"`
	Units          []UnitLine `json:"units"` // the klbr-* units there now
	// Manager is the service manager that runs the host's units: "user"
	// (the login's own) or "system".
	Manager string `json:"manager"`
	// With the user manager: its version ("" it did not answer), whether
	// the login lingers (its manager runs without a session), and the
	// cgroup controllers its units may use (memory, pids and cpu enforce
	// the limits).
	UserManager string   `json:"user_manager,omitempty"`
	Lingering   bool     `json:"lingering,omitempty"`
	Controllers []string `json:"controllers,omitempty"`
}

// UnitLine is one unit of systemctl list-units.
type UnitLine struct {
	Unit   string `json:"unit"`
	Active string `json:"active"`
	Sub    string `json:"sub"`
}

// MinSystemd is the oldest systemd a host may run: systemd-run's
// --slice, -p RuntimeMaxSec= and StandardOutput=append: (240) on a
// transient service.
const MinSystemd = 240

// ErrKernelProtocol says the host's klbr-kernel speaks another protocol
// than this klbr-core (or says none): nothing was started.
var ErrKernelProtocol = errors.New("klbr-kernel protocol mismatch")

// Problem is one finding of Check: what is wrong, and what to do.
type Problem struct {
	What string `json:"what"`
	Fix  string `json:"fix"`
	// Warn: jobs run, but something is off.
	Warn bool `json:"warn,omitempty"`
}

// Problems says what keeps the host from running klbr's work (or, with
// Warn, what is worth a look); none: it is ready.
func (i Info) Problems() []Problem {
	if !i.Reachable {
		return []Problem{{What: "unreachable: " + i.Error, Fix: "see the error; `klbr-core hosts` asks again"}}
	}
	var out []Problem
	switch {
	case i.SystemdVersion == 0:
		out = append(out, Problem{What: fmt.Sprintf("no systemd answered (systemctl --version said %q)", i.Systemd),
			Fix: "a worker host runs systemd as its service manager, with systemctl and systemd-run on the login's PATH"})
	case i.SystemdVersion < MinSystemd:
		out = append(out, Problem{What: fmt.Sprintf("systemd %d is older than %d", i.SystemdVersion, MinSystemd),
			Fix: "upgrade the host's systemd"})
	}
	if i.Manager == config.ManagerUser {
		out = append(out, i.userManagerProblems()...)
	}
	switch {
	case i.Kernel == "":
		out = append(out, Problem{What: "no klbr-kernel on the login's PATH (jobs, routines and cells run under it there)",
			Fix: "install klbr on the host (NixOS: services.klbr-worker.enable) so that klbr-kernel is on the PATH of " + strings.SplitN(i.SSH, "@", 2)[0]})
	default:
		if p := kernelProblem(i.Kernel, i.KernelVersion, i.KernelProtocol); p != nil {
			out = append(out, *p)
		}
	}
	return out
}

// kernelProblem says what is wrong with the host's klbr-kernel at path,
// whose --version said version and protocol (0: it said none); nil: it
// speaks this klbr-core's protocol.
func kernelProblem(path, version string, protocol int) *Problem {
	const fix = "install the same klbr release on the host as here (NixOS: the same flake revision for services.klbr-worker)"
	switch {
	case protocol == 0:
		return &Problem{What: "the host's klbr-kernel (" + path + ") does not say its protocol (klbr-kernel --version)", Fix: fix}
	case protocol != kernel.Protocol:
		return &Problem{What: fmt.Sprintf("the host's klbr-kernel %s speaks protocol %d, this klbr-core %d", version, protocol, kernel.Protocol), Fix: fix}
	}
	return nil
}

// userManagerProblems says what keeps the login's user manager from
// running the host's units with their limits.
func (i Info) userManagerProblems() []Problem {
	user := strings.SplitN(i.SSH, "@", 2)[0]
	system := "; or set manager = \"system\" in [hosts." + i.Name + "], if the key may be worth the host's root (docs/hosts.md)"
	var out []Problem
	if i.UserManager == "" {
		out = append(out, Problem{What: "the login's own service manager does not answer (systemctl --user)",
			Fix: "let " + user + " linger so that its manager runs without a session: loginctl enable-linger " + user + " (NixOS: services.klbr-worker.enable does it)" + system})
	}
	if !i.Lingering {
		out = append(out, Problem{What: user + " does not linger: its service manager, and every unit of it, stops when its last session ends",
			Fix: "loginctl enable-linger " + user + " (NixOS: services.klbr-worker.enable does it)"})
	}
	if i.UserManager != "" {
		var missing []string
		for _, c := range []string{"memory", "pids", "cpu"} {
			if !slices.Contains(i.Controllers, c) {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			out = append(out, Problem{What: "the login's service manager cannot enforce limits (cgroup controllers " + strings.Join(missing, ", ") +
				" not delegated to it): MemoryMax, TasksMax and CPUQuota would not hold",
				Fix: "boot the host with the unified cgroup hierarchy (cgroup v2: systemd's default, every current NixOS) and user@.service's Delegate= (systemd ≥ 252 delegates memory, pids and cpu)" + system})
		}
	}
	return out
}

// inspectScript prints one answer a line, then the klbr-* units.
const inspectScript = `systemctl --version 2>/dev/null | head -n 1; echo
command -v klbr-kernel || echo
if command -v klbr-kernel >/dev/null; then klbr-kernel --version 2>/dev/null | head -n 1; fi; echo
nproc
awk '/^MemTotal:/ {print $2 * 1024}' /proc/meminfo
systemctl list-units --all --plain --no-legend --no-pager 'klbr-*'
`

// Inspect connects to host and asks it what Info holds.
func (e *Engine) Inspect(ctx context.Context, host string) Info {
	c, err := e.conn(host)
	if err != nil {
		return Info{Name: host, Error: err.Error(), Units: []UnitLine{}}
	}
	c.mu.Lock()
	info := Info{Name: host, SSH: c.h.Target.User + "@" + c.h.Target.KnownHostsName(), MaxJobs: c.h.MaxJobs, Reserved: c.reserved, Units: []UnitLine{}}
	c.mu.Unlock()
	var out bytes.Buffer
	if err := c.run(ctx, inspectScript+c.managerCheck(), &limited{w: &out, n: 1 << 20}); err != nil {
		info.Error = err.Error()
		return info
	}
	info.Reachable = true
	parseInspect(&info, out.String())
	info.Manager = config.ManagerSystem
	if c.h.UserManager {
		info.Manager = config.ManagerUser
	}
	return info
}

// parseInspect reads inspectScript's answer into info. Each of the first
// answers ends with an extra newline (a command that printed nothing
// still leaves its line): the answers are every other line.
func parseInspect(info *Info, out string) {
	lines := strings.Split(out, "\n")
	field := func() string {
		if len(lines) == 0 {
			return ""
		}
		l := strings.TrimSpace(lines[0])
		lines = lines[1:]
		return l
	}
	info.Systemd = field()
	if info.Systemd != "" {
		field() // the echo after a first line
	}
	if f := strings.Fields(info.Systemd); len(f) >= 2 && f[0] == "systemd" {
		info.SystemdVersion, _ = strconv.Atoi(f[1])
	}
	info.Kernel = field()
	kv := field()
	if kv != "" {
		field()
	}
	if v, p, ok := kernel.ParseVersionLine(kv); ok {
		info.KernelVersion, info.KernelProtocol = v, p
	}
	info.CPUs, _ = strconv.Atoi(field())
	mem, _ := strconv.ParseFloat(field(), 64)
	info.MemoryBytes = int64(mem)
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) >= 3 && f[0] == "@manager" { // managerCheck's line: no unit's name starts with @
			if f[1] != "-" {
				info.UserManager = f[1]
			}
			info.Lingering = f[2] == "yes"
			info.Controllers = f[3:min(len(f), 16)]
			continue
		}
		if len(f) >= 4 {
			info.Units = append(info.Units, UnitLine{Unit: f[0], Active: f[2], Sub: f[3]})
		}
	}
}

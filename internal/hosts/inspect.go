package hosts

import (
	"bytes"
	"context"
	"strconv"
	"strings"
)

// Info is what a host says about itself: `klbr-core hosts` and doctor show it.
type Info struct {
	Name        string     `json:"name"`
	SSH         string     `json:"ssh"`
	Reachable   bool       `json:"reachable"`
	Error       string     `json:"error,omitempty"`        // why not, with the fix
	Systemd     string     `json:"systemd,omitempty"`      // systemctl --version, first line
	Kernel      string     `json:"klbr_kernel,omitempty"`  // where klbr-kernel is on the host's PATH; "" none
	CPUs        int        `json:"cpus,omitempty"`         // nproc
	MemoryBytes int64      `json:"memory_bytes,omitempty"` // MemTotal
	MaxJobs     int        `json:"max_jobs"`
	Reserved    int        `json:"reserved"`
	Units       []UnitLine `json:"units"` // the klbr-* units there now
}

// UnitLine is one unit of systemctl list-units.
type UnitLine struct {
	Unit   string `json:"unit"`
	Active string `json:"active"`
	Sub    string `json:"sub"`
}

// Inspect connects to host and asks it what Info holds.
func (e *Engine) Inspect(ctx context.Context, host string) Info {
	c, err := e.conn(host)
	if err != nil {
		return Info{Name: host, Error: err.Error()}
	}
	c.mu.Lock()
	info := Info{Name: host, SSH: c.h.Target.User + "@" + c.h.Target.KnownHostsName(), MaxJobs: c.h.MaxJobs, Reserved: c.reserved, Units: []UnitLine{}}
	c.mu.Unlock()
	const script = `systemctl --version | head -n 1
command -v klbr-kernel || echo
nproc
awk '/^MemTotal:/ {print $2 * 1024}' /proc/meminfo
systemctl list-units --all --plain --no-legend --no-pager 'klbr-*'
`
	var out bytes.Buffer
	if err := c.run(ctx, script, &limited{w: &out, n: 1 << 20}); err != nil {
		info.Error = err.Error()
		return info
	}
	info.Reachable = true
	lines := strings.Split(out.String(), "\n")
	for len(lines) < 4 {
		lines = append(lines, "")
	}
	info.Systemd = strings.TrimSpace(lines[0])
	info.Kernel = strings.TrimSpace(lines[1])
	info.CPUs, _ = strconv.Atoi(strings.TrimSpace(lines[2]))
	mem, _ := strconv.ParseFloat(strings.TrimSpace(lines[3]), 64)
	info.MemoryBytes = int64(mem)
	for _, l := range lines[4:] {
		f := strings.Fields(l)
		if len(f) >= 4 {
			info.Units = append(info.Units, UnitLine{Unit: f[0], Active: f[2], Sub: f[3]})
		}
	}
	return info
}

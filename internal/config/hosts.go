package config

import (
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Host is one [hosts.NAME] section: a worker host that klbr-core reaches
// over SSH and whose systemd runs jobs in transient units. Omitted limits
// take [jobs]'s (Resolved).
type Host struct {
	// SSH is user@host[:port]; host is a DNS name, an IPv4 address or an
	// IPv6 address in brackets.
	SSH string `toml:"ssh"`
	// IdentityFile is the private key klbr-core logs in with (absolute;
	// e.g. a systemd credential under /run/credentials).
	IdentityFile string `toml:"identity_file"`
	// KnownHostsFile holds the host's key (absolute). It is checked
	// strictly: an unknown or changed key is refused.
	KnownHostsFile string   `toml:"known_hosts_file"`
	Labels         []string `toml:"labels"`
	MaxJobs        int      `toml:"max_jobs"` // jobs running there at once, 1..1024
	MemoryMax      string   `toml:"memory_max"`
	TasksMax       int      `toml:"tasks_max"`
	CPUQuota       string   `toml:"cpu_quota"`
	WallSeconds    int      `toml:"wall_seconds"`
	// WorkDir is the directory on the host under which each job attempt
	// gets its own (absolute); empty: ~/.cache/klbr/work of the SSH user.
	WorkDir string `toml:"work_dir"`
	// DownGraceSeconds is how long a job running there waits for the host
	// to answer again before its recovery policy decides (manual: unknown);
	// 0: until the job's wall time has passed.
	DownGraceSeconds int `toml:"down_grace_seconds"`
}

// DefaultHostMaxJobs is a host's max_jobs when omitted.
const DefaultHostMaxJobs = 4

// Resolved returns h with each omitted limit at its default: [jobs]'s
// (resolved) for the unit limits and wall time.
func (h Host) Resolved(jobs Jobs) Host {
	j := jobs.Resolved()
	if h.MaxJobs == 0 {
		h.MaxJobs = DefaultHostMaxJobs
	}
	if h.MemoryMax == "" {
		h.MemoryMax = j.MemoryMax
	}
	if h.TasksMax == 0 {
		h.TasksMax = j.TasksMax
	}
	if h.CPUQuota == "" {
		h.CPUQuota = j.CPUQuota
	}
	if h.WallSeconds == 0 {
		h.WallSeconds = j.MaxWallSeconds
	}
	return h
}

// UnitLimits returns the limits of one unit on the host in [limits] form.
func (h Host) UnitLimits() Limits {
	return Limits{MemoryMax: h.MemoryMax, TasksMax: h.TasksMax, CPUQuota: h.CPUQuota}
}

// SSHTarget is a parsed ssh = "user@host[:port]".
type SSHTarget struct {
	User string
	Host string // without brackets
	Port int    // 22 when omitted
}

// KnownHostsName is how known_hosts and ssh-keyscan name the target:
// host, or [host]:port off port 22.
func (t SSHTarget) KnownHostsName() string {
	if t.Port == 22 {
		return t.Host
	}
	return "[" + t.Host + "]:" + strconv.Itoa(t.Port)
}

// ParseSSHTarget parses user@host[:port]. It refuses what ssh could take
// for an option or a pattern: the user and host are plain names.
func ParseSSHTarget(s string) (SSHTarget, error) {
	user, rest, ok := strings.Cut(s, "@")
	if !ok || user == "" {
		return SSHTarget{}, fmt.Errorf("%q is not user@host[:port] (e.g. \"klbr@gpu.lan\")", s)
	}
	if !isUserName(user) {
		return SSHTarget{}, fmt.Errorf("%q: the user %q must be letters, digits, _, - and . and not start with -", s, user)
	}
	t := SSHTarget{User: user, Port: 22}
	host, port := rest, ""
	if strings.HasPrefix(rest, "[") {
		end := strings.Index(rest, "]")
		if end < 0 {
			return SSHTarget{}, fmt.Errorf("%q: an IPv6 address needs its closing ]", s)
		}
		host = rest[1:end]
		if ip := net.ParseIP(host); ip == nil || ip.To4() != nil {
			return SSHTarget{}, fmt.Errorf("%q: %q in brackets is not an IPv6 address", s, host)
		}
		after := rest[end+1:]
		if after != "" {
			p, ok := strings.CutPrefix(after, ":")
			if !ok {
				return SSHTarget{}, fmt.Errorf("%q: after ] comes :port or nothing", s)
			}
			port = p
		}
	} else {
		if h, p, ok := strings.Cut(rest, ":"); ok {
			host, port = h, p
		}
		if !isHostName(host) {
			return SSHTarget{}, fmt.Errorf("%q: %q is not a host name or IPv4 address (an IPv6 address goes in brackets)", s, host)
		}
	}
	t.Host = host
	if port != "" || strings.HasSuffix(rest, ":") {
		n, err := strconv.Atoi(port)
		if err != nil || !isDigits(port) || n < 1 || n > 65535 {
			return SSHTarget{}, fmt.Errorf("%q: the port %q is not 1..65535", s, port)
		}
		t.Port = n
	}
	return t, nil
}

// isUserName reports whether s is a plain account name.
func isUserName(s string) bool {
	if s == "" || len(s) > 64 || s[0] == '-' {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// isHostName reports whether s is a DNS name or an IPv4 address: labels of
// letters, digits and -, none starting or ending with -.
func isHostName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range []byte(label) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// hosts checks the [hosts.NAME] sections.
func (v *validator) hosts(f *File) {
	for _, name := range slices.Sorted(maps.Keys(f.Hosts)) {
		h := f.Hosts[name].Resolved(f.Jobs)
		key := "hosts." + formatKey(name)
		if !isRouteName(name) || len(name) > 64 {
			v.fail(key, fmt.Sprintf("the host name %q must be 1..64 of a-z, 0-9, _ and -", name), key)
		}
		if h.SSH == "" {
			v.fail(key+".ssh", "required: user@host[:port] (e.g. \"klbr@gpu.lan\")", key)
		} else if _, err := ParseSSHTarget(h.SSH); err != nil {
			v.fail(key+".ssh", err.Error(), key)
		}
		for _, p := range []struct{ key, path, what string }{
			{"identity_file", h.IdentityFile, "the private key klbr-core logs in with"},
			{"known_hosts_file", h.KnownHostsFile, "a known_hosts file holding the host's key (ssh-keyscan -p PORT HOST >> FILE, after checking the fingerprint on the host)"},
		} {
			switch {
			case p.path == "":
				v.fail(key+"."+p.key, "required: the absolute path of "+p.what, key)
			case !filepath.IsAbs(p.path) || filepath.Clean(p.path) != p.path:
				v.fail(key+"."+p.key, fmt.Sprintf("%q must be an absolute, clean path", p.path), key)
			}
		}
		if h.WorkDir != "" && (!filepath.IsAbs(h.WorkDir) || filepath.Clean(h.WorkDir) != h.WorkDir || h.WorkDir == "/") {
			v.fail(key+".work_dir", fmt.Sprintf("%q must be an absolute, clean path below /", h.WorkDir), key)
		}
		seen := map[string]bool{}
		for i, l := range h.Labels {
			lk := fmt.Sprintf("%s.labels[%d]", key, i)
			switch {
			case !isRouteName(l) || len(l) > 64:
				v.fail(lk, fmt.Sprintf("the label %q must be 1..64 of a-z, 0-9, _ and -", l), key+".labels", key)
			case seen[l]:
				v.fail(lk, fmt.Sprintf("the label %q is given twice", l), key+".labels", key)
			}
			seen[l] = true
		}
		if len(h.Labels) > 64 {
			v.fail(key+".labels", fmt.Sprintf("%d labels; at most 64", len(h.Labels)), key)
		}
		if h.MaxJobs < 1 || h.MaxJobs > 1024 {
			v.fail(key+".max_jobs", fmt.Sprintf("%d is out of range 1..1024", h.MaxJobs), key)
		}
		l := h.UnitLimits()
		if _, err := l.MemoryMaxBytes(); err != nil {
			v.fail(key+".memory_max", err.Error(), key)
		}
		if h.TasksMax < 1 || h.TasksMax > maxTasksMax {
			v.fail(key+".tasks_max", fmt.Sprintf("%d is out of range 1..%d", h.TasksMax, maxTasksMax), key)
		}
		if _, err := l.CPUQuotaPercent(); err != nil {
			v.fail(key+".cpu_quota", err.Error(), key)
		}
		if h.DownGraceSeconds < 0 || h.DownGraceSeconds > 7*86400 {
			v.fail(key+".down_grace_seconds", fmt.Sprintf("%d is out of range 0..%d", h.DownGraceSeconds, 7*86400), key)
		}
		if h.WallSeconds < 1 || h.WallSeconds > 7*86400 {
			v.fail(key+".wall_seconds", fmt.Sprintf("%d is out of range 1..%d", h.WallSeconds, 7*86400), key)
		}
	}
}

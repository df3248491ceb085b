// Package hosts reaches worker hosts: other machines whose own systemd runs
// klbr's work in transient units, reached over SSH the way `systemd-run
// --host` reaches a machine. It runs no daemon of its own on the far side.
//
// Each host has one multiplexed SSH connection: an OpenSSH client in master
// mode (ControlMaster) on a control socket klbr-core owns, with strict host
// key checking against the host's configured known_hosts file, batch mode
// and only the configured identity. Every command (systemd-run, systemctl
// show, stop) is a session on that connection; a command can never open a
// connection of its own (its ProxyCommand fails), so a host that is down is
// one failed connect, reported, and retried by the next command.
//
// A unit's name is its identity and the idempotency key: Start asks the
// host whether the unit exists before it starts one, and systemd refuses a
// second transient unit of a loaded name, so an attempt is started at most
// once. Units stay loaded after they end (RemainAfterExit) until Collect,
// so their outcome can be read after any interruption.
package hosts

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klbr-dev/klbr/internal/config"
)

// Host is one worker host as klbr-core uses it.
type Host struct {
	Name           string
	Target         config.SSHTarget
	IdentityFile   string
	KnownHostsFile string
	Labels         []string
	MaxJobs        int
	MemoryMaxBytes uint64
	TasksMax       int
	CPUQuotaPct    int
	Wall           time.Duration
	WorkDir        string // absolute; "" means ~/.cache/klbr/work of the SSH user
	// DownGrace is how long a running job waits for the host to answer
	// again before its recovery policy decides; 0: until its wall time.
	DownGrace time.Duration
	// UserManager: the host's units are the login's own user manager's
	// (manager = "user", the configuration's default), not the system
	// manager's (manager = "system"; false).
	UserManager bool
}

// FromConfig returns the hosts of a parsed klbr.toml, by name.
func FromConfig(f config.File) (map[string]Host, error) {
	out := make(map[string]Host, len(f.Hosts))
	for name, ch := range f.Hosts {
		c := ch.Resolved(f.Jobs)
		t, err := config.ParseSSHTarget(c.SSH)
		if err != nil {
			return nil, fmt.Errorf("hosts.%s: %w", name, err)
		}
		l := c.UnitLimits()
		mem, err := l.MemoryMaxBytes()
		if err != nil {
			return nil, fmt.Errorf("hosts.%s.memory_max: %w", name, err)
		}
		cpu, err := l.CPUQuotaPercent()
		if err != nil {
			return nil, fmt.Errorf("hosts.%s.cpu_quota: %w", name, err)
		}
		out[name] = Host{Name: name, Target: t, IdentityFile: c.IdentityFile, KnownHostsFile: c.KnownHostsFile,
			Labels: slices.Clone(c.Labels), MaxJobs: c.MaxJobs, MemoryMaxBytes: mem, TasksMax: c.TasksMax,
			CPUQuotaPct: cpu, Wall: time.Duration(c.WallSeconds) * time.Second, WorkDir: c.WorkDir,
			DownGrace: time.Duration(c.DownGraceSeconds) * time.Second, UserManager: c.Manager == config.ManagerUser}
	}
	return out, nil
}

// Config is what an Engine runs with.
type Config struct {
	Hosts map[string]Host
	// ControlDir holds the control sockets (0700; created if missing). ""
	// or a path too long for a socket: a private directory under the
	// system's temporary directory, removed by Close.
	ControlDir string
	// SSH is the OpenSSH client; "" means "ssh" on PATH.
	SSH string
	// ConnectTimeout bounds a connect; 0 means 10 s.
	ConnectTimeout time.Duration
	Log            *slog.Logger
}

// Engine holds one connection per host.
type Engine struct {
	cfg        Config
	controlDir string
	ownDir     bool
	dials      atomic.Int64
	fwdSeq     atomic.Int64 // names the local sockets of forwards

	mu     sync.Mutex // guards closed, conns, retired, socks; each conn guards its own fields
	closed bool
	conns  map[string]*conn // the configured hosts (Reconfigure replaces them)
	// retired are hosts a Reconfigure removed: no new work goes there,
	// but the units already running are still watched, stopped and
	// collected through their connection.
	retired map[string]*conn
	socks   int // control sockets made by Reconfigure, for their names
}

// New returns an Engine; nothing connects until a host is used.
func New(cfg Config) (*Engine, error) {
	if cfg.SSH == "" {
		cfg.SSH = "ssh"
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	e := &Engine{cfg: cfg, conns: map[string]*conn{}, retired: map[string]*conn{}}
	// A socket path is at most 107 bytes, and ssh adds a 17-byte suffix
	// while it creates one.
	longest := 0
	for name := range cfg.Hosts {
		longest = max(longest, len(name))
	}
	if cfg.ControlDir != "" && len(cfg.ControlDir)+1+longest+len(".sock")+17 <= 107 {
		if err := os.MkdirAll(cfg.ControlDir, 0o700); err != nil {
			return nil, fmt.Errorf("hosts: control directory: %w", err)
		}
		if err := os.Chmod(cfg.ControlDir, 0o700); err != nil {
			return nil, fmt.Errorf("hosts: control directory: %w", err)
		}
		e.controlDir = cfg.ControlDir
	} else {
		d, err := os.MkdirTemp("", "klbr-ssh-")
		if err != nil {
			return nil, fmt.Errorf("hosts: control directory: %w", err)
		}
		e.controlDir, e.ownDir = d, true
	}
	for name, h := range cfg.Hosts {
		e.conns[name] = &conn{e: e, h: h, sock: e.controlDir + "/" + name + ".sock"}
	}
	return e, nil
}

// Close closes every connection. Units on the hosts keep running.
func (e *Engine) Close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	all := slices.Concat(slices.Collect(maps.Values(e.conns)), slices.Collect(maps.Values(e.retired)))
	e.mu.Unlock()
	for _, c := range all {
		c.close()
	}
	if e.ownDir {
		os.RemoveAll(e.controlDir)
	}
}

// Dials counts the SSH connections opened since New.
func (e *Engine) Dials() int64 { return e.dials.Load() }

// Names lists the hosts, sorted.
func (e *Engine) Names() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Sorted(maps.Keys(e.conns))
}

// Host returns the named host.
func (e *Engine) Host(name string) (Host, bool) {
	e.mu.Lock()
	c, ok := e.conns[name]
	e.mu.Unlock()
	if !ok {
		return Host{}, false
	}
	return c.h, true
}

// ErrUnknownHost names a host or label no [hosts.NAME] has.
var ErrUnknownHost = errors.New("no such host")

// ErrNoRoom says every host that fits runs its max_jobs.
var ErrNoRoom = errors.New("no host has room")

// Check says whether sel names a configured host ("NAME") or a label some
// host has ("label:L").
func (e *Engine) Check(sel string) error {
	_, err := e.candidates(sel)
	return err
}

// Matches lists the hosts sel may run on: the one it names, or those with
// its label; none for a selector no host matches.
func (e *Engine) Matches(sel string) []string {
	cs, _ := e.candidates(sel)
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.h.Name
	}
	return out
}

func (e *Engine) candidates(sel string) ([]*conn, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.candidatesLocked(sel)
}

// candidatesLocked is candidates with e.mu held.
func (e *Engine) candidatesLocked(sel string) ([]*conn, error) {
	if label, ok := strings.CutPrefix(sel, "label:"); ok {
		var out []*conn
		for _, name := range slices.Sorted(maps.Keys(e.conns)) {
			if c := e.conns[name]; slices.Contains(c.h.Labels, label) {
				out = append(out, c)
			}
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("%w: no host has the label %q (add it to labels of a [hosts.NAME] in klbr.toml)", ErrUnknownHost, label)
		}
		return out, nil
	}
	c, ok := e.conns[sel]
	if !ok {
		names := slices.Sorted(maps.Keys(e.conns))
		if len(names) == 0 {
			return nil, fmt.Errorf("%w: %q: klbr.toml defines no [hosts.NAME]", ErrUnknownHost, sel)
		}
		return nil, fmt.Errorf("%w: %q (the hosts are %s)", ErrUnknownHost, sel, strings.Join(names, ", "))
	}
	return []*conn{c}, nil
}

// Reserve takes a job slot on the host sel names, or on the host with the
// label and the most room that is up (one that is down only when none is
// up). release gives the slot back.
func (e *Engine) Reserve(sel string) (host string, release func(), err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	cs, err := e.candidatesLocked(sel)
	if err != nil {
		return "", nil, err
	}
	var best *conn
	bestRoom, bestUp := 0, false
	for _, c := range cs {
		c.mu.Lock()
		room, up := c.h.MaxJobs-c.reserved, c.lastErr == nil
		c.mu.Unlock()
		if room <= 0 {
			continue
		}
		if best == nil || (up && !bestUp) || (up == bestUp && room > bestRoom) {
			best, bestRoom, bestUp = c, room, up
		}
	}
	if best == nil {
		return "", nil, fmt.Errorf("%w: %s runs its max_jobs", ErrNoRoom, sel)
	}
	best.mu.Lock()
	best.reserved++
	best.mu.Unlock()
	var once sync.Once
	name := best.h.Name
	return name, func() { once.Do(func() { e.release(name) }) }, nil
}

// release gives back a slot on the named host: on its connection now,
// which a Reconfigure may have replaced (the count moves with it).
func (e *Engine) release(name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c, ok := e.conns[name]
	if !ok {
		c, ok = e.retired[name]
	}
	if !ok {
		return
	}
	c.mu.Lock()
	c.reserved--
	c.mu.Unlock()
}

// Status is what klbr-core knows of a host without asking it.
type Status struct {
	Name     string `json:"name"`
	SSH      string `json:"ssh"`
	Up       bool   `json:"up"`       // the last connect or command got through
	Reserved int    `json:"reserved"` // job slots taken
	MaxJobs  int    `json:"max_jobs"` // job slots
	LastErr  string `json:"last_error,omitempty"`
	Known    bool   `json:"contacted"` // a connect was tried since start
	// DownSince is when the host stopped answering; nil while it answers.
	DownSince *time.Time `json:"down_since,omitempty"`
}

// Statuses returns every host's status, by name.
func (e *Engine) Statuses() []Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Status
	for _, name := range slices.Sorted(maps.Keys(e.conns)) {
		c := e.conns[name]
		c.mu.Lock()
		s := Status{Name: name, SSH: fmt.Sprintf("%s@%s", c.h.Target.User, c.h.Target.KnownHostsName()),
			Up: c.tried && c.lastErr == nil, Reserved: c.reserved, MaxJobs: c.h.MaxJobs, Known: c.tried}
		if c.lastErr != nil {
			s.LastErr = c.lastErr.Error()
			since := c.since
			s.DownSince = &since
		}
		c.mu.Unlock()
		out = append(out, s)
	}
	return out
}

func (e *Engine) conn(name string) (*conn, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errors.New("hosts: closed")
	}
	c, ok := e.conns[name]
	if !ok {
		c, ok = e.retired[name] // its running units are still watched
	}
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownHost, name)
	}
	return c, nil
}

package placement

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
	"golang.org/x/sys/unix"
)

const (
	systemdService = "org.freedesktop.systemd1"
	systemdPath    = dbus.ObjectPath("/org/freedesktop/systemd1")
	managerIface   = "org.freedesktop.systemd1.Manager"
	// scopeStopTimeout is how long systemd waits for the scope's processes after SIGTERM
	// when it stops the scope itself (Release SIGKILLs first, so this is a backstop).
	scopeStopTimeout = 2 * time.Second
)

// systemdPlacer creates transient scopes over D-Bus.
type systemdPlacer struct {
	skippedList
	conn    *sddbus.Conn
	owner   *dbus.Conn // the connection that calls StartTransientUnit, and so holds AddRef's references
	addr    string
	slice   string
	version string
	mounts  []cgroupMount // to read a scope's memory counters
}

// NewSystemd connects to systemd over D-Bus (opts.SystemdBus; empty: the system bus) and
// checks that it answers. The connection lives until Close.
func NewSystemd(ctx context.Context, opts Options) (Placer, error) {
	addr := opts.SystemdBus
	var owner *dbus.Conn
	dial := func() (*dbus.Conn, error) {
		// No dbus.WithContext: a connection made with a context is closed when it ends.
		var c *dbus.Conn
		var err error
		if addr == "" {
			c, err = dbus.SystemBusPrivate()
		} else {
			c, err = dbus.Dial(addr)
		}
		if err != nil {
			return nil, err
		}
		if err := c.Auth([]dbus.Auth{dbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
			c.Close()
			return nil, err
		}
		// systemd's private socket is a direct peer-to-peer connection: no bus, no Hello.
		if !strings.HasSuffix(addr, "/systemd/private") {
			if err := c.Hello(); err != nil {
				c.Close()
				return nil, err
			}
		}
		if owner == nil {
			owner = c // go-systemd dials its call connection first
		}
		return c, nil
	}
	type result struct {
		conn *sddbus.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		c, err := sddbus.NewConnection(dial)
		done <- result{c, err}
	}()
	var conn *sddbus.Conn
	select {
	case r := <-done:
		if r.err != nil {
			return nil, fmt.Errorf("systemd: connect to %s: %w", busName(addr), r.err)
		}
		conn = r.conn
	case <-ctx.Done():
		go func() {
			if r := <-done; r.conn != nil {
				r.conn.Close()
			}
		}()
		return nil, fmt.Errorf("systemd: connect to %s: %w", busName(addr), ctx.Err())
	}
	var v dbus.Variant
	err := owner.Object(systemdService, systemdPath).CallWithContext(ctx, "org.freedesktop.DBus.Properties.Get", 0,
		managerIface, "Version").Store(&v)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("systemd: no answer from systemd on %s: %w", busName(addr), err)
	}
	version, _ := v.Value().(string)
	p := &systemdPlacer{conn: conn, owner: owner, addr: addr, slice: opts.slice(), version: version}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		p.mounts = parseMountinfo(mi, opts.cgroupRoot())
	}
	return p, nil
}

func busName(addr string) string {
	if addr == "" {
		return "the system bus"
	}
	return addr
}

func (p *systemdPlacer) Mode() Mode               { return ModeSystemdScope }
func (p *systemdPlacer) KernelArgs(Spec) []string { return nil }

func (p *systemdPlacer) Close() error {
	p.conn.Close()
	return nil
}

func (p *systemdPlacer) describe() string {
	return fmt.Sprintf("systemd %s on %s: transient scopes in %s", p.version, busName(p.addr), p.slice)
}

// Place creates the transient scope holding pid and waits for systemd's job to finish.
func (p *systemdPlacer) Place(ctx context.Context, pid int, spec Spec) (Placement, error) {
	if err := spec.validate(); err != nil {
		return nil, err
	}
	unit := spec.Name() + ".scope"
	props := []sddbus.Property{
		sddbus.PropSlice(p.slice),
		sddbus.PropPids(uint32(pid)),
		sddbus.PropDescription(fmt.Sprintf("klbr %s, session %s, generation %d", spec.Role, spec.Session, spec.Generation)),
		{Name: "Delegate", Value: dbus.MakeVariant(false)},
		{Name: "CollectMode", Value: dbus.MakeVariant("inactive-or-failed")},
		// Keep the unit loaded (not its processes) while this connection holds a
		// reference, so that its Result can be read after the tree exited; Release drops it.
		{Name: "AddRef", Value: dbus.MakeVariant(true)},
		{Name: "TimeoutStopUSec", Value: dbus.MakeVariant(uint64(scopeStopTimeout / time.Microsecond))},
	}
	l := spec.Limits
	if l.MemoryMaxBytes > 0 {
		props = append(props, sddbus.Property{Name: "MemoryMax", Value: dbus.MakeVariant(uint64(l.MemoryMaxBytes))})
	}
	if l.TasksMax > 0 {
		props = append(props, sddbus.Property{Name: "TasksMax", Value: dbus.MakeVariant(uint64(l.TasksMax))})
	}
	if l.CPUQuotaPercent > 0 {
		// 1 % of one CPU is 10 ms of CPU time per second.
		props = append(props, sddbus.Property{Name: "CPUQuotaPerSecUSec", Value: dbus.MakeVariant(uint64(l.CPUQuotaPercent) * 10000)})
	}
	err := p.start(ctx, unit, props)
	if isDBusError(err, "org.freedesktop.systemd1.UnitExists") {
		// A leftover of the same name (a core that died and restarted its generations).
		pl := &scopePlacement{p: p, unit: unit}
		if rerr := pl.Release(ctx); rerr != nil {
			return nil, fmt.Errorf("systemd: %s exists and could not be removed: %w", unit, rerr)
		}
		err = p.start(ctx, unit, props)
	}
	if err != nil {
		return nil, err
	}
	pl := &scopePlacement{p: p, unit: unit, limits: l}
	if v, err := p.conn.GetUnitTypePropertyContext(ctx, unit, "Scope", "ControlGroup"); err == nil {
		pl.cgroup, _ = v.Value.Value().(string)
	}
	return pl, nil
}

func (p *systemdPlacer) start(ctx context.Context, unit string, props []sddbus.Property) error {
	ch := make(chan string, 1)
	if _, err := p.conn.StartTransientUnitContext(ctx, unit, "fail", props, ch); err != nil {
		return fmt.Errorf("systemd: start %s: %w", unit, err)
	}
	select {
	case res := <-ch:
		if res != "done" {
			return fmt.Errorf("systemd: start %s: job %s", unit, res)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("systemd: start %s: %w", unit, ctx.Err())
	}
}

func isDBusError(err error, name string) bool {
	var e dbus.Error
	if errors.As(err, &e) {
		return e.Name == name
	}
	var pe *dbus.Error
	return errors.As(err, &pe) && pe.Name == name
}

// scopePlacement is one transient scope.
type scopePlacement struct {
	p      *systemdPlacer
	unit   string
	limits Limits
	cgroup string // the scope's cgroup path as systemd reports it ("" if unknown)

	mu       sync.Mutex // guards released, oomSeen
	released bool
	oomSeen  bool
}

// Release SIGKILLs what is left in the scope, stops it, waits for the job, and drops the
// reference that kept the unit loaded.
func (pl *scopePlacement) Release(ctx context.Context) error {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.released {
		return nil
	}
	if oom, err := pl.readOOM(ctx); err == nil {
		pl.oomSeen = oom
	}
	c := pl.p.conn
	// Fails harmlessly when the scope is already empty or gone.
	_ = c.KillUnitWithTarget(ctx, pl.unit, sddbus.All, int32(unix.SIGKILL))
	ch := make(chan string, 1)
	_, err := c.StopUnitContext(ctx, pl.unit, "replace", ch)
	switch {
	case isDBusError(err, "org.freedesktop.systemd1.NoSuchUnit"):
	case err != nil:
		return fmt.Errorf("systemd: stop %s: %w", pl.unit, err)
	default:
		select {
		case res := <-ch:
			if res != "done" {
				return fmt.Errorf("systemd: stop %s: job %s", pl.unit, res)
			}
		case <-ctx.Done():
			return fmt.Errorf("systemd: stop %s: %w", pl.unit, ctx.Err())
		}
	}
	err = pl.p.owner.Object(systemdService, systemdPath).CallWithContext(ctx, managerIface+".UnrefUnit", 0, pl.unit).Store()
	if err != nil && !isDBusError(err, "org.freedesktop.systemd1.NoSuchUnit") && !isDBusError(err, "org.freedesktop.systemd1.NotReferenced") {
		return fmt.Errorf("systemd: unref %s: %w", pl.unit, err)
	}
	pl.released = true
	return nil
}

// OOMKilled reads the memory counters of the scope's cgroup while it exists; after the
// tree has exited it asks systemd for the scope's Result ("oom-kill"), which systemd sets
// where it watches OOM events (cgroup v2). On cgroup v1 hosts, once the cgroup is gone, it
// is not knowable.
func (pl *scopePlacement) OOMKilled() (bool, error) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.released {
		return pl.oomSeen, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return pl.readOOM(ctx)
}

func (pl *scopePlacement) readOOM(ctx context.Context) (bool, error) {
	dir, version := pl.memoryDir()
	if dir != "" {
		if oom, err := readOOMKill(dir, version); err == nil && oom {
			return true, nil
		} else if err == nil {
			if _, serr := os.Stat(dir); serr == nil {
				return false, nil // still there, no OOM kill so far
			}
		}
	}
	v, err := pl.p.conn.GetUnitTypePropertyContext(ctx, pl.unit, "Scope", "Result")
	if err == nil {
		if res, _ := v.Value.Value().(string); res == "oom-kill" {
			return true, nil
		}
		if version == 2 {
			return false, nil
		}
	}
	return false, ErrNotKnowable
}

// memoryDir finds the scope's memory cgroup directory: on the v2 hierarchy if the memory
// controller is there, else on the v1 memory hierarchy.
func (pl *scopePlacement) memoryDir() (string, int) {
	if pl.cgroup == "" {
		return "", 0
	}
	for _, m := range pl.p.mounts {
		if m.v2 {
			if dir, err := hierarchyDir(m, pl.cgroup); err == nil {
				if _, err := os.Stat(filepath.Join(dir, "memory.events")); err == nil {
					return dir, 2
				}
			}
		}
	}
	for _, m := range pl.p.mounts {
		if !m.v2 && contains(m.controllers, "memory") {
			if dir, err := hierarchyDir(m, pl.cgroup); err == nil {
				return dir, 1
			}
		}
	}
	return "", 0
}

func (pl *scopePlacement) Describe() string {
	s := fmt.Sprintf("systemd scope %s in %s", pl.unit, pl.p.slice)
	if pl.cgroup != "" {
		s += " (cgroup " + pl.cgroup + ")"
	}
	return s + "; " + describeLimits(pl.limits)
}

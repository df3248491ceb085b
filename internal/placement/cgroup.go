package placement

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// cpuPeriodUS is the CFS period used for CPU quotas (the kernel's default, 100 ms).
const cpuPeriodUS = 100000

// cgroupLayout is where this process may create cgroups: next to (below) its own cgroup.
type cgroupLayout struct {
	version int // 1 or 2
	// parents maps a controller to the directory in which placements are created. On v2
	// every controller maps to the same directory; on v1 each to its own hierarchy.
	parents map[string]string
}

// required and optional controllers.
var (
	requiredControllers = []string{"memory", "pids"}
	optionalControllers = []string{"cpu"}
)

// cgroupPlacer places kernels in cgroups it creates itself.
type cgroupPlacer struct {
	skippedList
	layout   cgroupLayout
	instance string // suffix of every directory name (Options.Instance)
}

// NewCgroup returns the cgroup placer if this process can create cgroups with the memory
// and pids controllers below its own cgroup (a delegated subtree, or root on cgroup v1),
// else an error that says why not. It probes by creating and removing a directory.
func NewCgroup(opts Options) (Placer, error) {
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	layout, err := findLayout(parseMountinfo(mountinfo, opts.cgroupRoot()), parseProcCgroup(self))
	if err != nil {
		return nil, err
	}
	sweepDeadInstances(layout)
	return &cgroupPlacer{layout: layout, instance: opts.instance()}, nil
}

// sweepDeadInstances removes the empty cgroups that a klbr-core which died
// without releasing its placements left behind (their names end in
// "-p<pid>" and that pid is gone). A cgroup that still holds a process, or
// whose pid is alive (maybe reused), is left alone: this only tidies.
func sweepDeadInstances(layout cgroupLayout) {
	for _, parent := range layout.parents {
		ents, err := os.ReadDir(parent)
		if err != nil {
			continue
		}
		for _, e := range ents {
			name := e.Name()
			i := strings.LastIndex(name, "-p")
			if !e.IsDir() || !strings.HasPrefix(name, "klbr-") || i < 0 {
				continue
			}
			pid, err := strconv.Atoi(name[i+2:])
			if err != nil || pid <= 0 {
				continue
			}
			if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err == nil {
				continue
			}
			os.Remove(filepath.Join(parent, name)) // fails, harmlessly, while it holds a process
		}
	}
}

func (p *cgroupPlacer) Mode() Mode               { return ModeCgroup }
func (p *cgroupPlacer) Close() error             { return nil }
func (p *cgroupPlacer) KernelArgs(Spec) []string { return nil }

func (p *cgroupPlacer) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cgroup v%d below", p.layout.version)
	for _, c := range append(append([]string{}, requiredControllers...), optionalControllers...) {
		if dir, ok := p.layout.parents[c]; ok {
			fmt.Fprintf(&b, " %s:%s", c, dir)
		} else {
			fmt.Fprintf(&b, " %s:unavailable", c)
		}
	}
	return b.String()
}

// cgroupMount is one cgroup file system mounted under the root.
type cgroupMount struct {
	point       string   // mount point
	root        string   // the hierarchy path mounted there
	v2          bool     // cgroup2
	controllers []string // v1: the controllers of the hierarchy (and "name=…")
}

// parseMountinfo returns the cgroup mounts below root in /proc/self/mountinfo.
func parseMountinfo(b []byte, root string) []cgroupMount {
	var out []cgroupMount
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// 35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 {
			continue
		}
		point := unescapeMount(f[4])
		if point != root && !strings.HasPrefix(point, root+"/") {
			continue
		}
		m := cgroupMount{point: point, root: unescapeMount(f[3])}
		switch g[0] {
		case "cgroup2":
			m.v2 = true
		case "cgroup":
			for _, o := range strings.Split(g[2], ",") {
				if o != "rw" && o != "ro" {
					m.controllers = append(m.controllers, o)
				}
			}
		default:
			continue
		}
		out = append(out, m)
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// parseProcCgroup maps each v1 controller, and "" for v2, to this process's cgroup path.
func parseProcCgroup(b []byte) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out
}

// findLayout picks cgroup v2 if its hierarchy offers the required controllers to this
// process's cgroup, else v1 if each required controller has a hierarchy; and checks that
// directories can be created there.
func findLayout(mounts []cgroupMount, self map[string]string) (cgroupLayout, error) {
	var reasons []string
	for _, m := range mounts {
		if !m.v2 {
			continue
		}
		l, err := v2Layout(m, self[""])
		if err == nil {
			return l, nil
		}
		reasons = append(reasons, err.Error())
	}
	l, err := v1Layout(mounts, self)
	if err == nil {
		return l, nil
	}
	reasons = append(reasons, err.Error())
	return cgroupLayout{}, errors.New(strings.Join(reasons, "; "))
}

func hierarchyDir(m cgroupMount, path string) (string, error) {
	if path == "" {
		return "", fmt.Errorf("cgroup: this process has no cgroup in the hierarchy at %s", m.point)
	}
	rel, ok := strings.CutPrefix(path, m.root)
	if !ok && m.root != "/" {
		return "", fmt.Errorf("cgroup: own cgroup %s is outside what %s shows (%s)", path, m.point, m.root)
	}
	if m.root == "/" {
		rel = path
	}
	return filepath.Join(m.point, rel), nil
}

func v2Layout(m cgroupMount, path string) (cgroupLayout, error) {
	dir, err := hierarchyDir(m, path)
	if err != nil {
		return cgroupLayout{}, err
	}
	avail, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return cgroupLayout{}, fmt.Errorf("cgroup v2: %w", err)
	}
	have := strings.Fields(string(avail))
	for _, c := range requiredControllers {
		if !contains(have, c) {
			return cgroupLayout{}, fmt.Errorf("cgroup v2: controller %s is not available in %s (have %q)", c, dir, have)
		}
	}
	// Children only get controllers that the parent enables in cgroup.subtree_control,
	// which the kernel refuses while the parent itself holds processes (the "no internal
	// processes" rule): a delegated cgroup must hold the core in a leaf of its own.
	want := append([]string{}, requiredControllers...)
	for _, c := range optionalControllers {
		if contains(have, c) {
			want = append(want, c)
		}
	}
	enabled, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return cgroupLayout{}, fmt.Errorf("cgroup v2: %w", err)
	}
	var add []string
	for _, c := range want {
		if !contains(strings.Fields(string(enabled)), c) {
			add = append(add, "+"+c)
		}
	}
	if len(add) > 0 {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(add, " ")), 0); err != nil {
			return cgroupLayout{}, fmt.Errorf("cgroup v2: enable %s in %s: %w (a delegated cgroup must keep its own processes in a leaf)", strings.Join(add, " "), dir, err)
		}
	}
	if err := probeDir(dir); err != nil {
		return cgroupLayout{}, fmt.Errorf("cgroup v2: %w", err)
	}
	l := cgroupLayout{version: 2, parents: map[string]string{}}
	for _, c := range want {
		l.parents[c] = dir
	}
	return l, nil
}

func v1Layout(mounts []cgroupMount, self map[string]string) (cgroupLayout, error) {
	l := cgroupLayout{version: 1, parents: map[string]string{}}
	for _, c := range append(append([]string{}, requiredControllers...), optionalControllers...) {
		var dir string
		var err error = fmt.Errorf("cgroup v1: no %s hierarchy mounted", c)
		for _, m := range mounts {
			if !m.v2 && contains(m.controllers, c) {
				if dir, err = hierarchyDir(m, self[c]); err == nil {
					err = probeDir(dir)
				}
				break
			}
		}
		if err != nil {
			if contains(requiredControllers, c) {
				return cgroupLayout{}, err
			}
			continue
		}
		l.parents[c] = dir
	}
	return l, nil
}

// probeDir checks that a cgroup can be created in dir.
func probeDir(dir string) error {
	probe := filepath.Join(dir, fmt.Sprintf("klbr-probe-%d", os.Getpid()))
	if err := os.Mkdir(probe, 0o755); err != nil {
		return fmt.Errorf("cannot create cgroups in %s: %w", dir, err)
	}
	if err := unix.Rmdir(probe); err != nil {
		return fmt.Errorf("remove probe cgroup %s: %w", probe, err)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Place creates the placement's cgroup(s), sets the limits and moves pid in.
func (p *cgroupPlacer) Place(ctx context.Context, pid int, spec Spec) (Placement, error) {
	if err := spec.validate(); err != nil {
		return nil, err
	}
	name := escapeName(spec) + "-" + escapeComponent(p.instance)
	pl := &cgroupPlacement{version: p.layout.version, limits: spec.Limits, dirs: map[string]string{}}
	// One directory per distinct parent (v2: one; v1: one per hierarchy).
	for c, parent := range p.layout.parents {
		pl.dirs[c] = filepath.Join(parent, name)
	}
	for _, dir := range pl.uniqueDirs() {
		if _, err := os.Stat(dir); err == nil {
			// A leftover of the same name (a core that died and restarted its generations).
			if err := releaseDirs(ctx, []string{dir}, pl.version); err != nil {
				return nil, fmt.Errorf("cgroup: remove stale %s: %w", dir, err)
			}
		}
		if err := os.Mkdir(dir, 0o755); err != nil {
			_ = pl.Release(ctx)
			return nil, fmt.Errorf("cgroup: %w", err)
		}
		pl.created = append(pl.created, dir)
	}
	if err := pl.setLimits(); err != nil {
		_ = pl.Release(ctx)
		return nil, err
	}
	for _, dir := range pl.uniqueDirs() {
		if err := writeFile(dir, "cgroup.procs", strconv.Itoa(pid)); err != nil {
			_ = pl.Release(ctx)
			return nil, fmt.Errorf("cgroup: move pid %d: %w", pid, err)
		}
	}
	return pl, nil
}

// cgroupPlacement is one placed tree's cgroup(s).
type cgroupPlacement struct {
	version int
	limits  Limits
	dirs    map[string]string // controller → directory

	mu       sync.Mutex // guards created, released, oomSeen
	created  []string   // directories made, removed by Release
	released bool
	oomSeen  bool // the OOM state read just before the directories were removed
}

func (pl *cgroupPlacement) uniqueDirs() []string {
	var out []string
	for _, c := range append(append([]string{}, requiredControllers...), optionalControllers...) {
		if d, ok := pl.dirs[c]; ok && !contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

func (pl *cgroupPlacement) setLimits() error {
	l := pl.limits
	set := func(controller, file, value string, optional bool) error {
		dir, ok := pl.dirs[controller]
		if !ok {
			if optional {
				return nil
			}
			return fmt.Errorf("cgroup: controller %s unavailable", controller)
		}
		if err := writeFile(dir, file, value); err != nil {
			if optional && errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return fmt.Errorf("cgroup: %w", err)
		}
		return nil
	}
	if pl.version == 2 {
		mem, tasks, cpu := "max", "max", "max "+strconv.Itoa(cpuPeriodUS)
		if l.MemoryMaxBytes > 0 {
			mem = strconv.FormatInt(l.MemoryMaxBytes, 10)
		}
		if l.TasksMax > 0 {
			tasks = strconv.Itoa(l.TasksMax)
		}
		if l.CPUQuotaPercent > 0 {
			cpu = strconv.Itoa(l.CPUQuotaPercent*cpuPeriodUS/100) + " " + strconv.Itoa(cpuPeriodUS)
		}
		if err := set("memory", "memory.max", mem, false); err != nil {
			return err
		}
		if err := set("pids", "pids.max", tasks, false); err != nil {
			return err
		}
		if l.CPUQuotaPercent > 0 {
			if _, ok := pl.dirs["cpu"]; !ok {
				return errors.New("cgroup: a CPU quota is configured but the cpu controller is unavailable")
			}
		}
		return set("cpu", "cpu.max", cpu, true)
	}
	// v1: the "no limit" values are the files' defaults; write only what is set.
	if l.MemoryMaxBytes > 0 {
		v := strconv.FormatInt(l.MemoryMaxBytes, 10)
		if err := set("memory", "memory.limit_in_bytes", v, false); err != nil {
			return err
		}
		// With swap accounting, bound memory+swap too, so the tree cannot swap its way
		// past the limit (must not be below memory.limit_in_bytes, so set second).
		if err := set("memory", "memory.memsw.limit_in_bytes", v, true); err != nil {
			return err
		}
	}
	if l.TasksMax > 0 {
		if err := set("pids", "pids.max", strconv.Itoa(l.TasksMax), false); err != nil {
			return err
		}
	}
	if l.CPUQuotaPercent > 0 {
		if _, ok := pl.dirs["cpu"]; !ok {
			return errors.New("cgroup: a CPU quota is configured but the cpu controller is unavailable")
		}
		if err := set("cpu", "cpu.cfs_period_us", strconv.Itoa(cpuPeriodUS), false); err != nil {
			return err
		}
		if err := set("cpu", "cpu.cfs_quota_us", strconv.Itoa(l.CPUQuotaPercent*cpuPeriodUS/100), false); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(dir, name, value string) error {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", value, filepath.Join(dir, name), err)
	}
	return nil
}

// Release kills every process left in the cgroup(s) and removes them.
func (pl *cgroupPlacement) Release(ctx context.Context) error {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.released {
		return nil
	}
	if oom, err := pl.readOOM(); err == nil {
		pl.oomSeen = oom
	}
	if err := releaseDirs(ctx, pl.created, pl.version); err != nil {
		return err
	}
	pl.released = true
	return nil
}

// releaseDirs kills the processes in dirs until none is left, then removes the dirs.
func releaseDirs(ctx context.Context, dirs []string, version int) error {
	if len(dirs) == 0 {
		return nil
	}
	if version == 2 {
		// cgroup.kill (Linux 5.14) kills the whole subtree atomically, forks included.
		if err := writeFile(dirs[0], "cgroup.kill", "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
			// Older kernels: fall back to the loop below.
			_ = err
		}
	}
	pause := time.Millisecond
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := 0
		for _, dir := range dirs {
			pids, err := readPids(filepath.Join(dir, "cgroup.procs"))
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("cgroup: %w", err)
			}
			for _, pid := range pids {
				// A zombie (some kernels list one until its parent reaps it) needs no kill.
				if !isZombie(pid) && unix.Kill(pid, unix.SIGKILL) == nil {
					left++
				}
			}
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup: %d process(es) survived 10 s of SIGKILL in %v", left, dirs)
		}
		if err := sleepCtx(ctx, pause); err != nil {
			return err
		}
		pause = min(2*pause, 50*time.Millisecond)
	}
	// A killed process leaves its cgroup when it has exited; rmdir says EBUSY until then.
	for _, dir := range dirs {
		for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
			err := unix.Rmdir(dir)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
				return fmt.Errorf("cgroup: remove %s: %w", dir, err)
			}
			if err := sleepCtx(ctx, pause); err != nil {
				return err
			}
		}
	}
	return nil
}

func isZombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true // gone
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func readPids(path string) ([]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out, nil
}

// OOMKilled reads the memory controller's OOM-kill counter (after Release: the value read
// just before the cgroup was removed).
func (pl *cgroupPlacement) OOMKilled() (bool, error) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.released {
		return pl.oomSeen, nil
	}
	return pl.readOOM()
}

func (pl *cgroupPlacement) readOOM() (bool, error) {
	dir, ok := pl.dirs["memory"]
	if !ok {
		return false, ErrNotKnowable
	}
	return readOOMKill(dir, pl.version)
}

// readOOMKill reads the oom_kill counter of a memory cgroup directory: memory.events on v2,
// memory.oom_control on v1 (Linux 4.13+).
func readOOMKill(dir string, version int) (bool, error) {
	file := "memory.oom_control"
	if version == 2 {
		file = "memory.events"
	}
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return false, fmt.Errorf("cgroup: %w", err)
	}
	n, ok := keyedValue(b, "oom_kill")
	if !ok {
		return false, fmt.Errorf("cgroup: no oom_kill in %s: %w", filepath.Join(dir, file), ErrNotKnowable)
	}
	return n > 0, nil
}

// keyedValue reads "key value" lines (memory.events, memory.oom_control, pids.events).
func keyedValue(b []byte, key string) (int64, bool) {
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

func (pl *cgroupPlacement) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cgroup v%d %s; %s", pl.version, strings.Join(pl.uniqueDirs(), " "), describeLimits(pl.limits))
	if _, ok := pl.dirs["cpu"]; !ok {
		b.WriteString(" (no cpu controller: CPU not limited)")
	}
	return b.String()
}

func describeLimits(l Limits) string {
	f := func(v int64, unit string) string {
		if v <= 0 {
			return "unlimited"
		}
		return strconv.FormatInt(v, 10) + unit
	}
	return fmt.Sprintf("memory=%s tasks=%s cpu=%s", f(l.MemoryMaxBytes, "B"), f(int64(l.TasksMax), ""), f(int64(l.CPUQuotaPercent), "%"))
}

// escapeName is the spec's name with role and session escaped like systemd unit names
// (bytes other than ASCII letters, digits, '_' and '.' become \xNN; so "-" only separates),
// valid both as a unit name and as a cgroup directory name.
func escapeName(spec Spec) string {
	return "klbr-" + escapeComponent(spec.Role) + "-" + escapeComponent(spec.Session) + "-" + strconv.FormatInt(spec.Generation, 10)
}

func escapeComponent(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_',
			c == '.' && i > 0:
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, `\x%02x`, c)
		}
	}
	return b.String()
}

package kernel

import (
	"bytes"
	"os"
	"strconv"
)

// procEntry is what /proc/<pid>/stat says about one process.
type procEntry struct {
	pid, ppid int
	state     byte // R, S, D, Z, T, …
}

// parseStat parses the contents of /proc/<pid>/stat. The command name (field 2) may contain
// spaces and parentheses, so the fields after it are found from its last ')'.
func parseStat(b []byte) (procEntry, bool) {
	open := bytes.IndexByte(b, '(')
	end := bytes.LastIndexByte(b, ')')
	if open < 1 || end < open {
		return procEntry{}, false
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	if err != nil {
		return procEntry{}, false
	}
	rest := bytes.Fields(b[end+1:])
	if len(rest) < 2 || len(rest[0]) != 1 {
		return procEntry{}, false
	}
	ppid, err := strconv.Atoi(string(rest[1]))
	if err != nil {
		return procEntry{}, false
	}
	return procEntry{pid: pid, ppid: ppid, state: rest[0][0]}, true
}

// readProcs reads every process's stat under procRoot (normally "/proc"). Processes that
// vanish while it reads are skipped.
func readProcs(procRoot string) ([]procEntry, error) {
	dir, err := os.Open(procRoot)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	out := make([]procEntry, 0, len(names))
	for _, name := range names {
		if name == "" || name[0] < '0' || name[0] > '9' {
			continue
		}
		b, err := os.ReadFile(procRoot + "/" + name + "/stat")
		if err != nil {
			continue
		}
		if e, ok := parseStat(b); ok {
			out = append(out, e)
		}
	}
	return out, nil
}

// descendants returns the processes whose chain of parents leads to root (root excluded).
func descendants(procs []procEntry, root int) []procEntry {
	children := make(map[int][]procEntry, len(procs))
	for _, p := range procs {
		if p.pid != p.ppid {
			children[p.ppid] = append(children[p.ppid], p)
		}
	}
	var out []procEntry
	queue := []int{root}
	seen := map[int]bool{root: true}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range children[pid] {
			if seen[c.pid] {
				continue
			}
			seen[c.pid] = true
			out = append(out, c)
			queue = append(queue, c.pid)
		}
	}
	return out
}

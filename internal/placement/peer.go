package placement

import (
	"bytes"
	"os"
	"strconv"
	"strings"
)

// WorkerOf says why process pid is a klbr worker or a descendant of one, or "" when it is
// neither (or is gone). The operator and ingress sockets refuse such peers whatever their
// uid: a cell is not the operator.
//
// Two marks, either enough:
//   - its cgroup (cgroup and systemd-scope modes): a component of its cgroup path named
//     like a placement, klbr-<role>-<session>-<generation>…, that is not a unit of the
//     suite itself (klbr-core.service, klbr.slice). A worker cannot leave it: as root the
//     core drops workers to another uid, and Landlock keeps a same-uid worker from writing
//     any cgroup.procs.
//   - its ancestry (every mode): a klbr-kernel among its ancestors. klbr-kernel is child
//     subreaper, so an orphan of the tree is reparented to it, not away from it; the
//     sandbox's signal scope keeps a cell from killing its kernel. In rlimit mode without
//     Landlock ABI 6 a cell that kills its kernel leaves orphans that this cannot tell
//     from any other process of the daemon's uid (docs/operating.md says so).
func WorkerOf(pid int) string {
	if pid <= 0 {
		return ""
	}
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup"); err == nil {
		if c := placementInCgroups(b); c != "" {
			return "in the worker cgroup " + c
		}
	}
	p := pid
	for range 256 {
		ppid, comm, ok := statOf(p)
		if !ok || ppid <= 0 {
			return ""
		}
		if comm == "klbr-kernel" && p != pid {
			return "a descendant of klbr-kernel " + strconv.Itoa(p)
		}
		if ppid == 1 {
			return ""
		}
		p = ppid
	}
	return ""
}

// placementInCgroups returns the first component of a /proc/<pid>/cgroup file's paths that
// is named like a placement, or "".
func placementInCgroups(b []byte) string {
	for _, line := range bytes.Split(b, []byte("\n")) {
		_, path, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		_, path, _ = bytes.Cut(path, []byte(":"))
		for _, c := range strings.Split(string(path), "/") {
			if isPlacementName(c) {
				return c
			}
		}
	}
	return ""
}

// isPlacementName reports whether a cgroup directory or unit name is one a placer made.
func isPlacementName(c string) bool {
	if !strings.HasPrefix(c, "klbr-") || strings.HasSuffix(c, ".service") || strings.HasSuffix(c, ".slice") {
		return false
	}
	return strings.Count(c, "-") >= 3
}

// statOf returns the parent pid and command name of pid from /proc/<pid>/stat.
func statOf(pid int) (ppid int, comm string, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, "", false
	}
	return parseStatLine(b)
}

// parseStatLine reads the parent pid and command name from a /proc/<pid>/stat line. The
// command name is the process's own choice (prctl PR_SET_NAME) and may hold spaces and
// parentheses: it is what lies between the first '(' and the last ')'.
func parseStatLine(b []byte) (ppid int, comm string, ok bool) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return 0, "", false
	}
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 2 {
		return 0, "", false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, string(b[open+1 : end]), err == nil
}

package kernel

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// memoryCgroupOOMKills returns the oom_kill counter of the kernel's own memory cgroup (the
// placement's, which the child shares), and whether one was found. It looks at the standard
// mount points: cgroup v2 at /sys/fs/cgroup or /sys/fs/cgroup/unified, v1 at
// /sys/fs/cgroup/memory.
func memoryCgroupOOMKills() (int64, bool) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0, false
	}
	var candidates []string
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			candidates = append(candidates,
				filepath.Join("/sys/fs/cgroup", parts[2], "memory.events"),
				filepath.Join("/sys/fs/cgroup/unified", parts[2], "memory.events"))
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				candidates = append(candidates, filepath.Join("/sys/fs/cgroup/memory", parts[2], "memory.oom_control"))
			}
		}
	}
	for _, f := range candidates {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
					return n, true
				}
			}
		}
	}
	return 0, false
}

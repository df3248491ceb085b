package placement

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestIsPlacementName(t *testing.T) {
	for name, want := range map[string]bool{
		Spec{Role: "workbench", Session: "default", Generation: 3}.Name() + ".scope":    true,
		Spec{Role: "hooks", Session: "a-b", Generation: 1}.Name() + "-0123456789abcdef": true,
		Spec{Role: "command", Session: "x", Generation: 9}.Name():                       true,
		"klbr-core.service":    false,
		"klbr-discord.service": false,
		"klbr.slice":           false,
		"user@0.service":       false,
		"klbr-probe-123":       false,
	} {
		if got := isPlacementName(name); got != want {
			t.Errorf("isPlacementName(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestWorkerOfAncestry: a process below a klbr-kernel is a worker whatever its cgroup; the
// test process itself is not.
func TestWorkerOfAncestry(t *testing.T) {
	if w := WorkerOf(os.Getpid()); w != "" {
		t.Fatalf("the test process is taken for a worker: %s", w)
	}
	cmd := exec.Command(klbrKernel(t), "--", "sh", "-c", "sleep 30 & echo $!; wait")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var b [32]byte
	n, _ := out.Read(b[:])
	pid := strings.TrimSpace(string(b[:n]))
	var p int
	for _, c := range pid {
		p = p*10 + int(c-'0')
	}
	if w := WorkerOf(p); !strings.Contains(w, "klbr-kernel") {
		t.Fatalf("WorkerOf(grandchild %d) = %q, want a descendant of klbr-kernel", p, w)
	}
}

// FuzzParseStatLine: the stat line's command name is chosen by the process (a cell can
// name itself "x) 1 (klbr-kernel"); the parser never panics and takes the name between the
// first '(' and the last ')'. Seeds in testdata/fuzz/FuzzParseStatLine.
func FuzzParseStatLine(f *testing.F) {
	f.Add([]byte("123 (python3) S 100 123 123 0 -1 4194560"))
	f.Add([]byte("7 (x) 1 (klbr-kernel) S 1 7 7"))
	f.Add([]byte("1 () Z 0"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ppid, comm, ok := parseStatLine(b)
		if !ok {
			return
		}
		if ppid < 0 && !strings.Contains(string(b), "-") {
			t.Fatalf("negative ppid %d from %q", ppid, b)
		}
		if strings.Count(string(b), comm) == 0 {
			t.Fatalf("comm %q is not in %q", comm, b)
		}
	})
}

// FuzzPlacementInCgroups: a /proc/<pid>/cgroup file never panics the parser, and what it
// returns is a placement name.
func FuzzPlacementInCgroups(f *testing.F) {
	f.Add([]byte("0::/klbr.slice/klbr-workbench-default-3.scope\n"))
	f.Add([]byte("12:pids:/user.slice\n0::/system.slice/klbr-core.service\n"))
	f.Add([]byte("::::\n\n:"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if c := placementInCgroups(b); c != "" && !isPlacementName(c) {
			t.Fatalf("returned %q, not a placement name", c)
		}
	})
}

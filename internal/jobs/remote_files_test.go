package jobs

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/hosttest"
	"github.com/klbr-dev/klbr/internal/store"
)

// syncBuffer is a log sink the test reads while jobs write to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A job on a host with inputs= and outputs=: its inputs are copied from
// the workspace (no link followed) into its own directory there; the host's
// systemd kills it over memory_max, and it ends failed saying so; the
// files its globs match come back as artifacts (never a link or a special
// file); its end is one notice to the session, and the same inputs again
// send nothing.
func TestRemoteJobInputsAndOutputs(t *testing.T) {
	h := hosttest.Start(t)
	h.InstallKernel(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tg, err := config.ParseSSHTarget(h.SSH())
	if err != nil {
		t.Fatal(err)
	}
	eng, err := hosts.New(hosts.Config{ConnectTimeout: 2 * time.Second, Hosts: map[string]hosts.Host{"lab": {
		Name: "lab", Target: tg, IdentityFile: h.IdentityFile, KnownHostsFile: h.KnownHostsFile,
		MaxJobs: 4, MemoryMaxBytes: 64 << 20, TasksMax: 64, CPUQuotaPct: 100, Wall: time.Hour, WorkDir: h.WorkDir}}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	dir := t.TempDir()
	st, err := store.Open(ctx, dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Write(ctx, func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
		t.Fatal(err)
	}
	arts, err := artifacts.New(filepath.Join(dir, "artifacts"))
	if err != nil {
		t.Fatal(err)
	}
	ws := t.TempDir()
	secret := filepath.Join(t.TempDir(), "secret")
	for name, body := range map[string]string{"data/in.txt": "hello from the workspace\n", "src/a.py": "print(1)\n",
		"src/deep/b.py": "print(2)\n", "not-an-input.txt": "stays home\n"} {
		os.MkdirAll(filepath.Join(ws, filepath.Dir(name)), 0o755)
		if err := os.WriteFile(filepath.Join(ws, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(secret, []byte("klbr-core's secret\n"), 0o600)
	os.Symlink(secret, filepath.Join(ws, "src", "link.py"))
	logs := &syncBuffer{}
	m := New(Config{Store: st, Artifacts: arts, Workspace: ws, Hosts: eng, HostPoll: 50 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(logs, nil))})
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	t.Run("refused at once: a glob or an input that leaves its directory", func(t *testing.T) {
		for _, s := range []CommandSpec{
			{Outputs: []string{"../x"}}, {Outputs: []string{"/etc/*"}}, {Outputs: []string{"out/../../x"}},
			{Outputs: []string{"out/["}}, {Inputs: []string{"../secret"}}, {Inputs: []string{"/etc/passwd"}},
			{Inputs: []string{"output"}}, {Inputs: []string{"data/in.txt"}, Cwd: ws},
		} {
			s.Argv, s.Host = []string{"true"}, "lab"
			if _, err := m.Run(ctx, RunRequest{Session: "default", Spec: s}); err == nil {
				t.Fatalf("%+v was admitted", s)
			}
		}
	})

	hog := "import os\nos.makedirs('out/deep', exist_ok=True)\n" +
		"open('out/copy.txt', 'w').write(open('data/in.txt').read())\n" +
		"open('out/src.txt', 'w').write('\\n'.join(sorted(os.listdir('src'))))\n" +
		"open('out/deep/z.bin', 'wb').write(bytes(1000))\n" +
		"open('out/notes.md', 'w').write('not matched')\n" +
		"os.symlink('/etc/hostname', 'out/link.txt')\nos.mkfifo('out/fifo.txt')\n" +
		"b = []\nwhile True: b.append(bytearray(16 << 20))\n"
	j, err := m.Run(ctx, RunRequest{Session: "default", Spec: CommandSpec{Host: "lab", Argv: []string{"python3", "-c", hog},
		Inputs: []string{"data/in.txt", "src"}, Outputs: []string{"out/*.txt", "**/*.bin"}}})
	if err != nil {
		t.Fatal(err)
	}
	j, err = m.Wait(ctx, j.ID, 0, 90*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("job %s: %s", j.State, j.Error)
	// cgroup v2: the host's systemd says it was out of memory; v1 (this
	// lab, perhaps) cannot tell its OOM kill from another SIGKILL.
	if j.State != store.JobFailed || !strings.Contains(j.Error, "out of memory (MemoryMax)") && !strings.Contains(j.Error, "killed by signal 9 (SIGKILL: on the host, the kernel's OOM killer under MemoryMax") {
		t.Fatalf("job %s %q, want failed: killed over its memory", j.State, j.Error)
	}
	var res struct {
		Artifacts      []store.JobFile `json:"artifacts"`
		InputsSkipped  []string        `json:"inputs_skipped"`
		OutputsSkipped []string        `json:"outputs_skipped"`
	}
	if err := json.Unmarshal(j.Result, &res); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range res.Artifacts {
		p, err := arts.Path(strings.TrimPrefix(f.Artifact, "a"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil || int64(len(b)) != f.Size {
			t.Fatalf("%s: artifact %s: %v", f.Path, f.Artifact, err)
		}
		got[f.Path] = string(b)
	}
	want := map[string]string{"out/copy.txt": "hello from the workspace\n", "out/src.txt": "a.py\ndeep", "out/deep/z.bin": string(make([]byte, 1000))}
	if len(got) != len(want) {
		t.Fatalf("artifacts %v (result %s), want %v", res.Artifacts, j.Result, []string{"out/copy.txt", "out/src.txt", "out/deep/z.bin"})
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("artifact %s holds %q, want %q", k, got[k], v)
		}
	}
	if len(res.InputsSkipped) != 1 || !strings.HasPrefix(res.InputsSkipped[0], "src/link.py") {
		t.Fatalf("inputs skipped %q, want the link src/link.py", res.InputsSkipped)
	}
	notices := 0
	page, err := st.Records(ctx, "default", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range page {
		if r.Kind == "job.input" {
			notices++
			if !strings.Contains(string(r.Content), "Outputs: 3 files as artifacts") {
				t.Fatalf("the notice does not name the outputs: %s", r.Content)
			}
		}
	}
	if notices != 1 {
		t.Fatalf("%d job notices, want exactly 1", notices)
	}
	if units, _ := h.Units("klbr-job-*"); len(units) != 0 {
		out, _ := h.Enter("systemctl", "status", "--no-pager", "klbr-job-*").CombinedOutput()
		t.Fatalf("units left on the host: %v\n%s\n%s", units, out, logs)
	}

	t.Run("the same inputs again are not sent again", func(t *testing.T) {
		j, err := m.Run(ctx, RunRequest{Session: "default", Spec: CommandSpec{Host: "lab", Argv: []string{"cat", "data/in.txt"},
			Inputs: []string{"data/in.txt", "src"}, Outputs: []string{"nothing/*"}}})
		if err != nil {
			t.Fatal(err)
		}
		j, err = m.Wait(ctx, j.ID, 0, 60*time.Second)
		if err != nil || j.State != store.JobSucceeded || j.OutputPreview != "hello from the workspace\n" {
			t.Fatalf("job %s %q output %q (%v)", j.State, j.Error, j.OutputPreview, err)
		}
		var sent []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "inputs on the host") {
				sent = append(sent, l[strings.Index(l, "sent="):])
			}
		}
		if len(sent) != 2 || sent[0] == "sent=0" || sent[1] != "sent=0" {
			t.Fatalf("bytes sent for the inputs: %q; want the second run to send none", sent)
		}
	})
}

package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workbench"
)

// The jobs commands against a daemon that answers with fixed records.
func TestJobsCommands(t *testing.T) {
	dir, err := os.MkdirTemp("", "klbr-jobs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "control.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	due := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	started := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	running := store.Job{ID: 3, Kind: "command", Session: "default", State: store.JobRunning, Recovery: "manual", Runs: 1,
		Spec: json.RawMessage(`{"argv":["sh","-c","make test 2>&1 | tail"]}`), CreatedAt: started, StartedAt: &started,
		OutputPreview: "compiling\n", Host: "gpu"}
	pending := store.Job{ID: 4, Kind: "routine", Session: "default", State: store.JobPending, Recovery: "retry_safe",
		Spec: json.RawMessage(`{"entry":"klbr_skills.remind:say","host":"label:big"}`), Schedule: json.RawMessage(`{"at":1893553445000}`), TZ: "UTC",
		NextDue: &due, CreatedAt: started}
	var seen []string
	mux := http.NewServeMux()
	answer := func(w http.ResponseWriter, v any) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("GET /v1/jobs", func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.URL.RawQuery)
		answer(w, api.Jobs{Jobs: []store.Job{pending, running}})
	})
	mux.HandleFunc("GET /v1/jobs/3", func(w http.ResponseWriter, r *http.Request) { answer(w, running) })
	mux.HandleFunc("POST /v1/jobs/3/cancel", func(w http.ResponseWriter, r *http.Request) {
		c := running
		c.State, c.Error, c.FinishedAt = store.JobCancelled, "cancelled; its process tree was killed", &started
		answer(w, c)
	})
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		waiting := running
		waiting.Error = "waiting for host gpu, down since 2026-12-02T10:00:00Z (host gpu: host unreachable: timed out); its unit is reattached when the host answers"
		answer(w, api.Status{StartedAt: time.Now(), Jobs: &api.JobsStatus{Running: []store.Job{waiting}, NextWakeup: &due,
			Hosts: []hosts.Status{{Name: "gpu", MaxJobs: 4, Reserved: 1, Known: true, LastErr: "host gpu: host unreachable: timed out", DownSince: &started},
				{Name: "big", MaxJobs: 2, Known: true, Up: true}, {Name: "spare", MaxJobs: 2}}},
			WorkbenchHost: "gpu", WorkbenchLost: []workbench.Lost{{Session: "default", Generation: 3, At: started, Reason: "the workbench on host gpu was lost between cells: its SSH session ended"}}})
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	run := func(args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		env := Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errOut, Lookup: func(k string) (string, bool) {
			switch k {
			case "KLBR_CONTROL_SOCKET":
				return sock, true
			case "KLBR_DATA_DIR":
				return dir, true
			}
			return "", false
		}}
		if err := Run(context.Background(), args, env); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, errOut.String())
		}
		return out.String()
	}
	list := run("jobs", "default", "--state", "running")
	if seen[0] != "limit=100&session=default&state=running" {
		t.Errorf("query %q", seen[0])
	}
	lines := strings.Split(strings.TrimSpace(list), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID     KIND     STATE      SESSION    WHERE") || !strings.Contains(lines[0], "WHAT") ||
		!strings.HasPrefix(lines[1], "4 ") || !strings.Contains(lines[1], "due ") || !strings.Contains(lines[2], "make test 2>&1 | tail") {
		t.Errorf("list:\n%s", list)
	}
	// Where each runs: the host its attempt went to, the host a pending
	// job asks for.
	if !strings.Contains(lines[1], " default    label:big ") || !strings.Contains(lines[2], " default    gpu ") {
		t.Errorf("the list does not say where each job runs:\n%s", list)
	}
	var js api.Jobs
	if err := json.Unmarshal([]byte(run("jobs", "--json")), &js); err != nil || len(js.Jobs) != 2 {
		t.Errorf("--json: %v %+v", err, js)
	}
	if show := run("jobs", "show", "3"); !strings.Contains(show, "job 3: command, running") || !strings.Contains(show, "compiling") ||
		!strings.Contains(show, "\nhost: gpu\n") ||
		!strings.Contains(show, `"make test 2>&1 | tail"`) {
		t.Errorf("show:\n%s", show)
	}
	if c := run("jobs", "cancel", "3"); !strings.Contains(c, "cancelled") {
		t.Errorf("cancel: %s", c)
	}
	st := run("status")
	for _, want := range []string{"jobs: 1 running · next wakeup", "make", " default    gpu ", "waiting for host gpu, down since",
		"host gpu: DOWN since " + started.Local().Format(time.DateTime) + ": host gpu: host unreachable: timed out · jobs 1/4",
		"host big: up · jobs 0/2", "host spare: not contacted since the start",
		"workbench of default: generation 3 LOST at " + started.Local().Format(time.DateTime)} {
		if !strings.Contains(st, want) {
			t.Errorf("status lacks %q:\n%s", want, st)
		}
	}
}

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
	"github.com/klbr-dev/klbr/internal/store"
)

// The tree puts each child under its parent with its job and result.
func TestSessionTree(t *testing.T) {
	ss := []api.SessionStatus{
		{Session: store.Session{ID: "default", State: store.StateWaiting}},
		{Session: store.Session{ID: "child-1", ParentID: "default", State: store.StateWaiting}},
		{Session: store.Session{ID: "child-2", ParentID: "child-1", State: store.StateRunning}},
		{Session: store.Session{ID: "other", State: store.StateReady}},
	}
	js := []store.Job{
		{ID: 2, Kind: "child", Session: "child-1", State: store.JobRunning, Host: "gpu",
			Spec: json.RawMessage(`{"session":"child-2","delegate":["discord.send"],"workspace":{"mode":"worktree","kind":"copy","host":"gpu"}}`)},
		{ID: 1, Kind: "child", Session: "default", State: store.JobSucceeded, Spec: json.RawMessage(`{"session":"child-1"}`),
			Result: json.RawMessage(`{ "widgets": 3 }`)},
		{ID: 3, Kind: "command", Session: "default", State: store.JobRunning, Spec: json.RawMessage(`{"argv":["true"]}`)},
	}
	js[1].Budget = json.RawMessage(`{"tokens": 5000}`)
	roots := SessionTree(ss, js)
	if len(roots) != 2 || roots[0].ID != "default" || roots[1].ID != "other" {
		t.Fatalf("roots %+v", roots)
	}
	roots[0].Children[0].Usage = &store.Usage{Session: "child-1", Tokens: 1234, ModelRequests: 3}
	roots[0].Children[0].Children[0].Usage = &store.Usage{Session: "child-2", Tokens: 100, ModelRequests: 1}
	var b bytes.Buffer
	for _, r := range roots {
		printNode(&b, r, 0)
	}
	want := "default  waiting\n" +
		"  child-1  waiting  job 1 succeeded  used 1234 tokens, 3 model requests (1334 tokens, 4 model requests with its children)  budget {\"tokens\":5000}  result {\"widgets\":3}\n" +
		"    child-2  running  job 2 running on host gpu  used 100 tokens, 1 model requests  speaks discord.send\n" +
		"other  ready\n"
	if b.String() != want {
		t.Fatalf("printed\n%s\nwant\n%s", b.String(), want)
	}
}

// klbr-core sessions asks the daemon for each child's usage and prints it.
func TestSessionsCommandShowsUsage(t *testing.T) {
	dir, err := os.MkdirTemp("", "klbr-sessions-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "control.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	answer := func(w http.ResponseWriter, v any) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v)
	}
	var asked []string
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		answer(w, api.Status{StartedAt: time.Now(), Sessions: []api.SessionStatus{
			{Session: store.Session{ID: "default", State: store.StateWaiting}},
			{Session: store.Session{ID: "child-1", ParentID: "default", State: store.StateRunning}},
		}})
	})
	mux.HandleFunc("GET /v1/jobs", func(w http.ResponseWriter, r *http.Request) {
		answer(w, api.Jobs{Jobs: []store.Job{{ID: 1, Kind: "child", Session: "default", State: store.JobRunning,
			Spec: json.RawMessage(`{"session":"child-1"}`), Budget: json.RawMessage(`{"model_requests":9}`)}}})
	})
	mux.HandleFunc("GET /v1/sessions/{id}/usage", func(w http.ResponseWriter, r *http.Request) {
		asked = append(asked, r.PathValue("id"))
		answer(w, store.Usage{Session: r.PathValue("id"), Tokens: 42, ModelRequests: 2, Attempts: 1})
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
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
	if err := Run(context.Background(), []string{"sessions"}, env); err != nil {
		t.Fatalf("sessions: %v\n%s", err, errOut.String())
	}
	want := "default  waiting\n  child-1  running  job 1 running  used 42 tokens, 2 model requests  budget {\"model_requests\":9}\n"
	if out.String() != want || len(asked) != 1 || asked[0] != "child-1" {
		t.Fatalf("printed\n%s\nwant\n%s(usage asked for %q, want child-1 only)", out.String(), want, asked)
	}
}

// A mistyped command is answered with the commands it is close to.
func TestUnknownCommandSuggests(t *testing.T) {
	var out, errOut bytes.Buffer
	env := Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errOut, Lookup: func(string) (string, bool) { return "", false }}
	for arg, want := range map[string]string{"stauts": "status", "sned": "send", "relases": "releases"} {
		err := Run(context.Background(), []string{arg}, env)
		if err == nil || !strings.Contains(err.Error(), "Did you mean this?\n") || !strings.Contains(err.Error(), "\t"+want+"\n") {
			t.Errorf("%s: %v", arg, err)
		}
	}
	if err := Run(context.Background(), []string{"zzzzzz"}, env); err == nil || strings.Contains(err.Error(), "Did you mean") ||
		!strings.Contains(err.Error(), `unknown command "zzzzzz"`) {
		t.Errorf("far from any command: %v", err)
	}
}

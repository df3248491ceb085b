package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/citest"
)

// maintain sends the goal as an operator input with the maintenance flag.
func TestMaintainSendsTheFlag(t *testing.T) {
	dir, err := os.MkdirTemp("", "klbr-maint-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "control.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan api.SendRequest, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet { // the status send reads to say whether anyone answers
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"agent":"route local (m)"}`))
			return
		}
		var req api.SendRequest
		b, _ := io.ReadAll(r.Body)
		json.Unmarshal(b, &req)
		got <- req
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"session":"default","id":7,"event_id":9}`))
	})}
	go srv.Serve(l)
	defer srv.Close()
	os.WriteFile(filepath.Join(dir, "operator.token"), []byte("t"), 0o600)
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
	if err := Run(context.Background(), []string{"maintain", "default", "tidy the hooks"}, env); err != nil {
		t.Fatalf("maintain: %v (%s)", err, errOut.String())
	}
	req := <-got
	if !req.Maintenance || req.Text != "tidy the hooks" || strings.TrimSpace(out.String()) != "7" {
		t.Fatalf("sent %+v, printed %q", req, out.String())
	}
}

// releases diff A B prints the diff between two stored releases, by id prefix.
func TestReleasesDiff(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		citest.SkipOrFail(t, "git is not installed")
	}
	dir := t.TempDir()
	rel, _ := behavior.Open(filepath.Join(dir, "releases"))
	pub := func(soul string) string {
		src := t.TempDir()
		os.WriteFile(filepath.Join(src, "soul.md"), []byte(soul), 0o644)
		m, err := rel.Publish(os.DirFS(src))
		if err != nil {
			t.Fatal(err)
		}
		return m.ID
	}
	a, b := pub("# soul\nold line\n"), pub("# soul\nnew line\n")
	var out, errOut bytes.Buffer
	env := Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errOut, Lookup: func(k string) (string, bool) {
		if k == "KLBR_DATA_DIR" {
			return dir, true
		}
		return "", false
	}}
	if err := Run(context.Background(), []string{"releases", "diff", a[:10], b}, env); err != nil {
		t.Fatalf("%v: %s", err, errOut.String())
	}
	if d := out.String(); !strings.Contains(d, "-old line") || !strings.Contains(d, "+new line") || !strings.Contains(d, "a/soul.md") {
		t.Fatalf("diff:\n%s", d)
	}
}

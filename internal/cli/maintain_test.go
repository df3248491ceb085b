package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/api"
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

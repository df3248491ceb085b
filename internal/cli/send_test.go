package cli

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/spend"
)

// TestSendThatCannotTellPrintsTheKey: when the daemon reads the request and dies before it
// answers (it may have committed), send says it cannot tell and names the key to retry
// with; when nothing listens, it says nothing was stored.
func TestSendThatCannotTellPrintsTheKey(t *testing.T) {
	dir, err := os.MkdirTemp("", "klbr-send-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "control.sock")
	run := func() string {
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
		err := Run(context.Background(), []string{"send", "default", "hello", "--key", "k-42"}, env)
		if err == nil {
			t.Fatalf("send succeeded: %s", out.String())
		}
		return err.Error()
	}
	if msg := run(); !strings.Contains(msg, "not stored") {
		t.Errorf("with nothing listening: %q, want it to say nothing was stored", msg)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			http.ReadRequest(bufio.NewReader(c)) // the whole request, then death
			c.Close()
		}
	}()
	msg := run()
	if !strings.Contains(msg, "cannot tell") || !strings.Contains(msg, "--key k-42") {
		t.Errorf("after a request with no answer: %q, want 'cannot tell' and the key to retry with", msg)
	}
}

// send warns, as the browser's banner does, when nobody will answer: the
// agent does not run, or the session is held at a spend cap; another
// session's hold says nothing.
func TestSendSaysWhenNobodyAnswers(t *testing.T) {
	resets := time.Date(2030, 1, 2, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		st   api.Status
		want []string
	}{
		{"running", api.Status{Agent: "route local (m)"}, nil},
		{"no route", api.Status{Agent: "not running: no [routes.local] in klbr.toml; inputs are admitted and kept"},
			[]string{"nobody will answer: the agent is not running (no [routes.local]"}},
		{"seed defaults", api.Status{Agent: "route main (the server's model), fallback seed-8002, seed-8003 — no route configured: using seed defaults http://localhost:8001/v1 (then …); configure [routes.main] in /d/klbr.toml to choose"},
			[]string{"no route configured: it answers only if an OpenAI-compatible server runs at http://localhost:8001/v1", "[routes.main] in /d/klbr.toml", "klbr-core doctor"}},
		{"spend cap", api.Status{Agent: "route local (m)", Spend: &spend.State{Held: []spend.Hold{{Session: "default", Cap: "daily_usd", Resets: resets}}}},
			[]string{"nobody will answer until", "held at the daily_usd spend cap"}},
		{"another session's cap", api.Status{Agent: "route local (m)", Spend: &spend.State{Held: []spend.Hold{{Session: "other", Cap: "daily_usd", Resets: resets}}}}, nil},
	} {
		got := strings.Join(nobodyAnswers(tc.st, "default"), "\n")
		if len(tc.want) == 0 && got != "" {
			t.Errorf("%s: warned %q", tc.name, got)
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", tc.name, got, w)
			}
		}
	}
}

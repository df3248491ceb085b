package main

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Ctrl-C drains and says what it waits for; a second Ctrl-C stops now: the
// running cell is interrupted and recorded as cancelled, the process exits
// promptly, and an input admitted before is still there after a restart.
func TestSecondInterruptStopsNow(t *testing.T) {
	in := newInstance(t)
	in.must("init")
	srv := in.serve()
	in.must("send", "default", "keep me")

	cellDone := make(chan string, 1)
	go func() {
		_, errOut, _ := in.run(nil, "exec", "default", "import time\ntime.sleep(300)", "--timeout", "600s")
		cellDone <- errOut
	}()
	waitFor(t, 30*time.Second, "the cell to start", func() bool {
		return strings.Contains(in.must("tail", "default", "--json"), `"cell.started"`)
	})

	srv.cmd.Process.Signal(syscall.SIGINT)
	waitFor(t, 10*time.Second, "the drain to say what it waits for", func() bool {
		return strings.Contains(srv.log(), "waiting for 1 running cell")
	})
	log := srv.log()
	for _, want := range []string{"of session default", "at most", "Ctrl-C again stops now"} {
		if !strings.Contains(log, want) {
			t.Errorf("the drain's log lacks %q:\n%s", want, log)
		}
	}
	// Still draining: a long cell keeps it waiting.
	select {
	case err := <-srv.exited:
		t.Fatalf("exited on the first interrupt: %v\n%s", err, srv.log())
	case <-time.After(time.Second):
	}

	start := time.Now()
	srv.cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-srv.exited:
		if err != nil {
			t.Fatalf("exit after the second interrupt: %v\n%s", err, srv.log())
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("still running 5s after the second interrupt:\n%s", srv.log())
	}
	t.Logf("exited %s after the second interrupt", time.Since(start).Round(time.Millisecond))
	if !strings.Contains(srv.log(), "second interrupt: stopping now") {
		t.Errorf("the stop is not logged:\n%s", srv.log())
	}
	<-cellDone

	srv = in.serve()
	var texts []string
	cancelled := false
	for _, line := range strings.Split(strings.TrimSpace(in.must("tail", "default", "--json")), "\n") {
		var r struct {
			Kind, Lane string
			Content    json.RawMessage
		}
		json.Unmarshal([]byte(line), &r)
		switch {
		case r.Lane == "input":
			var c struct{ Text string }
			json.Unmarshal(r.Content, &c)
			texts = append(texts, c.Text)
		case r.Kind == "cell.finished":
			cancelled = strings.Contains(string(r.Content), `"cancelled"`)
			if !cancelled {
				t.Errorf("the interrupted cell is recorded as %s", r.Content)
			}
		}
	}
	if !cancelled {
		t.Errorf("no cell.finished record of the interrupted cell")
	}
	if len(texts) != 1 || texts[0] != "keep me" {
		t.Errorf("inputs after the restart: %q", texts)
	}
	srv.cmd.Process.Signal(syscall.SIGTERM)
	if err := srv.wait(t); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, limit time.Duration, what string, ok func() bool) {
	t.Helper()
	for end := time.Now().Add(limit); !ok(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

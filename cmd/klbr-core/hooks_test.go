package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Durable observers through the daemon: an observer of admitted inputs
// sends a message per input with its state; an observer of receipts that
// sends whenever a message is sent stops at the causal depth limit with a
// notice; status and /metrics show them; `hooks replay` replays with fake
// effects.
func TestObserversThroughTheDaemon(t *testing.T) {
	in := newInstance(t)
	in.must("init")
	srv := in.serve()
	initial := releases(t, in).Sessions[0].Release
	draft := filepath.Join(t.TempDir(), "draft")
	copyTree(t, filepath.Join(in.dir, "releases", initial, "tree"), draft)
	os.WriteFile(filepath.Join(draft, "klbr_hooks", "notes.py"), []byte(`
def count(inp):
    if not isinstance(inp, dict) or "event" not in inp:
        raise ValueError("observer input")
    n = inp["state"].get("n", 0) + 1
    return {"state": {"n": n}, "commands": [{"op": "local.send", "args": {"text": "input number %d" % n}}]}

def echo(inp):
    if not isinstance(inp, dict) or "event" not in inp:
        raise ValueError("observer input")
    return {"commands": [{"op": "local.send", "args": {"text": "echo of event %d" % inp["event"]["id"]}}]}
`), 0o644)
	init := filepath.Join(draft, "klbr_hooks", "__init__.py")
	b, _ := os.ReadFile(init)
	os.WriteFile(init, []byte(string(b)+"\nfrom . import notes\nSLOTS[\"notes.count\"] = notes.count\nSLOTS[\"notes.echo\"] = notes.echo\n"), 0o644)
	settings := filepath.Join(draft, "settings.toml")
	b, _ = os.ReadFile(settings)
	os.WriteFile(settings, []byte(string(b)+`
[[hooks.observers]]
handler = "notes.count"
events = ["input.accepted"]
state_version = 1

[[hooks.observers]]
handler = "notes.echo"
events = ["delivery.receipt"]
`), 0o644)
	id := strings.TrimSpace(in.must("publish", draft))
	in.must("activate", "default", "1", id)
	in.must("send", "default", "hello")
	deadline := time.Now().Add(30 * time.Second)
	var tail string
	for {
		tail = in.must("tail", "default")
		if strings.Contains(tail, "echo of event") && strings.Count(tail, "echo of event") >= 2 && strings.Contains(tail, "hooks.loop_limit") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no observer sends and loop limit:\n%s", tail)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(tail, "input number 1") {
		t.Fatalf("tail:\n%s", tail)
	}
	// input (0) -> count's send (1) -> echo (2) -> echo (3) -> refused.
	time.Sleep(300 * time.Millisecond)
	tail = in.must("tail", "default")
	if n := strings.Count(tail, "echo of event"); n != 2 {
		t.Errorf("%d echoes, want 2 before the depth limit of 3:\n%s", n, tail)
	}
	status := in.must("status")
	for _, want := range []string{"causal depth 3", "default observer notes.echo", "1 refused by the loop limits", "default observer notes.count"} {
		if !strings.Contains(status, want) {
			t.Errorf("status lacks %q:\n%s", want, status)
		}
	}
	_, metrics := get(t, srv.url+"metrics")
	for _, want := range []string{`klbr_observer_commands_total{handler="notes.echo",result="refused",session="default"} 1`,
		`klbr_hook_slot_invocations_total{kind="observer",slot="delivery.receipt"}`, `klbr_observer_backlog{handler="notes.count",session="default"} 0`,
		`klbr_observer_delivery_seconds_count{outcome="ok"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	before := strings.Count(in.must("tail", "default"), "local.sent")
	out := in.must("hooks", "replay", "default", "notes.count")
	if !strings.Contains(out, "replayed 1 events to notes.count (effects: fake)") || !strings.Contains(out, "input number 1") {
		t.Fatalf("replay: %s", out)
	}
	if after := strings.Count(in.must("tail", "default"), "local.sent"); after != before {
		t.Fatalf("a replay sent: %d local sends before, %d after", before, after)
	}
	in.must("stop")
	srv.wait(t)
}

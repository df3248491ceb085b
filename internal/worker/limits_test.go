package worker

import (
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/placement"
)

func TestMemoryHogIsStoppedByItsLimitAndRecorded(t *testing.T) {
	w, _ := start(t, opts{limits: placement.Limits{MemoryMaxBytes: 128 << 20}})
	o := run(t, w, "hog", "blocks = []\nwhile True:\n    blocks.append(bytearray(16 << 20))")
	if !o.Reset || o.Error == nil {
		t.Fatalf("outcome %+v", o)
	}
	// The limit either killed the worker (a reset that says so) or Python saw
	// MemoryError first; both leave the host alive and the cause recorded.
	if !strings.Contains(o.Error.Message, "memory") {
		t.Fatalf("the cause is not recorded: %+v", o.Error)
	}
	t.Logf("placement %s: %s", env.Placer.Mode(), o.Error.Message[:min(len(o.Error.Message), 200)])
}

func TestForkBombIsBounded(t *testing.T) {
	w, _ := start(t, opts{limits: placement.Limits{TasksMax: 40}})
	o := run(t, w, "bomb", `import os, time
made, refused = 0, 0
for i in range(200):
    try:
        pid = os.fork()
    except OSError:
        refused += 1
        continue
    if pid == 0:
        time.sleep(1000)
        os._exit(0)
    made += 1
(made, refused)`)
	if o.Status != "ok" || o.Value == nil {
		t.Fatalf("outcome %+v %+v", o.Status, o.Error)
	}
	v := strings.Trim(*o.Value, "()")
	parts := strings.Split(v, ",")
	if len(parts) != 2 || strings.TrimSpace(parts[1]) == "0" {
		t.Fatalf("no fork was refused under TasksMax 40: %s", *o.Value)
	}
	t.Logf("placement %s: (made, refused) = %s", env.Placer.Mode(), *o.Value)
}

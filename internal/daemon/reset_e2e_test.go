package daemon

import (
	"context"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// The operator's `reset --kernel` of a session whose cell runs (and would
// run for ever) does not wait on it: the cell is interrupted, the kernel is
// killed, and the session's next cell runs in a new generation.
func TestKernelResetInterruptsARunningCell(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c1", Code: "import asyncio\nmarker = 1\nprint('LOOPING', flush=True)\n" +
			"while True:\n    await asyncio.sleep(0.05)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "c2", Code: "print('AFTER RESET', 'marker' in globals(), flush=True)\nawait runtime.wait(None)"}}},
	)
	a := startJobsAgent(t, model)
	a.send("loop")
	a.eventually("the cell runs", func() bool { return a.cellSaid("default", "LOOPING") })
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if _, err := a.c.Reset(ctx, "default", "stuck", true); err != nil {
		t.Fatalf("reset --kernel of a session with a running cell: %v", err)
	}
	a.eventually("the next cell runs in a new kernel", func() bool { return a.cellSaid("default", "AFTER RESET False") })
	a.eventually("waiting", a.state(store.StateWaiting))
	if s := a.session(); s.KernelGen < 2 {
		t.Fatalf("kernel generation %d after the reset, want a new one", s.KernelGen)
	}
}

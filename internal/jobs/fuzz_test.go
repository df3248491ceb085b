package jobs

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/worker"
)

// A cron line from a cell parses or is refused; a parsed one's next
// deadline is always after the time asked about.
func FuzzCron(f *testing.F) {
	for _, s := range []string{"* * * * *", "0 7 * * 1-5", "*/15 9-17 * * *", "0 0 29 2 *", "5,10 1 1 1 0", "0 0 30 2 *", "1-59/7 * * * 7"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		c, err := parseCron(line)
		if err != nil {
			return
		}
		after := time.Date(2026, 12, 2, 10, 30, 0, 0, time.UTC)
		next := c.next(after, time.UTC)
		if !next.IsZero() && !next.After(after) {
			t.Fatalf("%q: next %v is not after %v", line, next, after)
		}
	})
}

// Whatever a cell sends as the arguments of a jobs request is decoded
// within bounds or refused with a RequestError; nothing panics.
func FuzzRequests(f *testing.F) {
	for _, seed := range []struct{ op, args string }{
		{"jobs.run", `{"argv":["true"],"timeout":5}`},
		{"jobs.run", `{"argv":[],"env":{"1x":"y"}}`},
		{"jobs.schedule", `{"entry":"klbr_skills.a:b","at":1900000000,"input":{"k":[1,2]}}`},
		{"jobs.schedule", `{"entry":"klbr_skills.a:b","cron":"0 7 * * 1-5","tz":"Europe/Berlin"}`},
		{"jobs.schedule", `{"entry":"a:b","every":-1}`},
		{"jobs.list", `{"state":"running","limit":5}`},
		{"jobs.get", `{"id":1}`},
		{"jobs.wait", `{"id":1,"timeout":0.01}`},
		{"jobs.cancel", `{"id":99}`},
	} {
		f.Add(seed.op, []byte(seed.args))
	}
	st, err := store.Open(context.Background(), f.TempDir(), store.Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	if err := st.Write(context.Background(), func(tx *store.Tx) error { _, err := tx.EnsureSession("default"); return err }); err != nil {
		f.Fatal(err)
	}
	m := New(Config{Store: st, Workspace: f.TempDir(), Tree: func(string) string { return "/nonexistent" }}) // never started: nothing runs
	f.Fuzz(func(t *testing.T, op string, args []byte) {
		if len(args) > 4*MaxArgs {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond) // jobs.wait waits
		defer cancel()
		out, err := m.handle(ctx, worker.Request{Op: op, Args: json.RawMessage(args)},
			caller{session: "default", release: release})
		if err != nil {
			if _, ok := err.(*worker.RequestError); !ok {
				t.Fatalf("%s %q: %T %v, want a RequestError", op, args, err, err)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("%s: answer %q is not JSON", op, out)
		}
	})
}

package history

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
)

// modelFunc is a summarizer answering with a function (a fake provider).
type modelFunc func(ctx context.Context, req provider.Request) (*provider.Response, error)

func (f modelFunc) Complete(ctx context.Context, req provider.Request) (*provider.Response, error) {
	return f(ctx, req)
}

func newStore(t testing.TB, items int) (*store.Store, store.ActiveContext) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Write(ctx, func(tx *store.Tx) error {
		if _, err := tx.EnsureSession("p"); err != nil {
			return err
		}
		for i := range items {
			if _, err := tx.Notice("p", "test.note", map[string]any{"text": fmt.Sprintf("note %d: %s", i, strings.Repeat("words ", 40))}, true); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ac, err := st.Active(ctx, "p", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return st, ac
}

func planOf(ac store.ActiveContext, n int) Plan {
	p := Plan{Session: "p", Epoch: ac.Epoch, Version: ac.Version, Reason: "test"}
	for _, e := range ac.Entries[:n] {
		p.Units = append(p.Units, Unit{Refs: []store.EntryRef{e.Ref()}, Tokens: 80})
	}
	return p
}

// A summarizer that errors, hangs past its deadline, returns nothing, or
// returns more than its source: the run is still replaced (by a degraded
// stub) within two requests, the notice says why, and nothing is lost.
func TestCompactionConvergesWhenTheSummarizerFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(ctx context.Context) (*provider.Response, error)
		want   string
	}{
		{"errors", func(context.Context) (*provider.Response, error) { return nil, errors.New("HTTP 500: upstream died") }, "request failed"},
		{"hangs", func(ctx context.Context) (*provider.Response, error) { <-ctx.Done(); return nil, ctx.Err() }, "no answer within"},
		{"empty", func(context.Context) (*provider.Response, error) { return &provider.Response{Content: "  "}, nil }, "returned nothing"},
		{"longer", func(context.Context) (*provider.Response, error) {
			return &provider.Response{Content: strings.Repeat("verbose ", 2000)}, nil
		}, "does not shrink"},
		{"cut off", func(context.Context) (*provider.Response, error) {
			return &provider.Response{Content: "half a summ", FinishReason: "length"}, nil
		}, "cut off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, ac := newStore(t, 8)
			var calls atomic.Int32
			c := New(Config{Store: st, Route: "main", Timeout: 50 * time.Millisecond,
				Model: modelFunc(func(ctx context.Context, req provider.Request) (*provider.Response, error) {
					calls.Add(1)
					if len(req.Tools) != 0 || req.MaxTokens <= 0 {
						t.Errorf("summary request with tools %v, max_tokens %d", req.Tools, req.MaxTokens)
					}
					return tc.answer(ctx)
				})})
			res, err := c.Compact(context.Background(), planOf(ac, 6))
			if err != nil {
				t.Fatal(err)
			}
			if res.Kind != store.SummaryDegraded || res.Attempts != MaxAttempts || calls.Load() != MaxAttempts {
				t.Fatalf("kind %s after %d attempts (%d requests), want degraded after %d", res.Kind, res.Attempts, calls.Load(), MaxAttempts)
			}
			if len(res.Problems) != 2 || !strings.Contains(res.Problems[1], tc.want) || res.Tokens >= res.Source {
				t.Fatalf("result %+v", res)
			}
			checkReplaced(t, st, res, 6)
		})
	}
}

// checkReplaced: the summary replaced exactly n entries, which its children
// return in order, and the coverage invariant holds.
func checkReplaced(t *testing.T, st *store.Store, res Result, n int) {
	t.Helper()
	ctx := context.Background()
	ac, err := st.Active(ctx, "p", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ac.Entries[0].Summary == nil || ac.Entries[0].Summary.ID != res.Summary || ac.Entries[0].Summary.Items != n {
		t.Fatalf("first entry %+v", ac.Entries[0])
	}
	kids, err := st.Children(ctx, store.SummaryRef(res.Summary))
	if err != nil || len(kids) != n {
		t.Fatalf("children %v %v", kids, err)
	}
	if err := st.CheckCoverage(ctx, "p", 0); err != nil {
		t.Fatal(err)
	}
}

// The happy path: one request, a normal summary, the source labelled by
// lane, and a context.compacted notice with the sizes.
func TestCompactionHappyPath(t *testing.T) {
	st, ac := newStore(t, 8)
	var source string
	var calls atomic.Int32
	c := New(Config{Store: st, Route: "main", ModelName: "m",
		Model: modelFunc(func(ctx context.Context, req provider.Request) (*provider.Response, error) {
			calls.Add(1)
			source = req.Messages[1].Content
			return &provider.Response{Content: "Notes 0 to 5 were written; nothing else happened."}, nil
		})})
	res, err := c.Compact(context.Background(), planOf(ac, 6))
	if err != nil || res.Kind != store.SummaryNormal || calls.Load() != 1 {
		t.Fatalf("%+v %v after %d requests", res, err, calls.Load())
	}
	if !strings.Contains(source, "[klbr notice test.note") || !strings.Contains(source, "note 5") || strings.Contains(source, "note 6") {
		t.Fatalf("source:\n%s", source)
	}
	checkReplaced(t, st, res, 6)
	d, err := st.Describe(context.Background(), store.SummaryRef(res.Summary))
	if err != nil || d.Summary.Model != "m" || d.Summary.Route != "main" {
		t.Fatalf("%+v %v", d, err)
	}
}

// A plan made against a version that moved is discarded, not committed.
func TestCompactionAgainstAStaleVersion(t *testing.T) {
	st, ac := newStore(t, 8)
	c := New(Config{Store: st})
	if _, err := c.Compact(context.Background(), planOf(ac, 3)); err != nil {
		t.Fatal(err)
	}
	_, err := c.Compact(context.Background(), planOf(ac, 6)) // the old version, overlapping
	if !errors.Is(err, store.ErrStaleContext) {
		t.Fatalf("stale plan: %v", err)
	}
	if err := st.CheckCoverage(context.Background(), "p", 0); err != nil {
		t.Fatal(err)
	}
}

package metrics

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/store"
)

// TestZeroValuedSeries: on an idle data directory with two sessions every
// per-session and per-kind series is present and 0 (an idle agent reads 0,
// not "no data"), worker events exist for both roles, and promtool accepts
// the exposition.
func TestZeroValuedSeries(t *testing.T) {
	st, err := store.Open(context.Background(), t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Write(context.Background(), func(tx *store.Tx) error {
		if err := tx.CreateSession("default", ""); err != nil {
			return err
		}
		return tx.CreateSession("other", "")
	}); err != nil {
		t.Fatal(err)
	}
	m := New(st, time.Now, slog.New(slog.DiscardHandler))
	m.WatchAgent(func() bool { return true }, func() []Backoff {
		return []Backoff{{Session: "other", State: "retrying", NextAt: time.Now(), InARow: 2}}
	})
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		`klbr_inbox_pending_inputs{session="default",source_kind="operator"} 0`,
		`klbr_inbox_pending_inputs{session="other",source_kind="discord"} 0`,
		`klbr_inbox_oldest_pending_age_seconds{session="default",source_kind="discord"} 0`,
		`klbr_delivery_reviews_held_total{fallback="false",session="default"} 0`,
		`klbr_delivery_reviews_held_total{fallback="true",session="other"} 0`,
		`klbr_worker_events_total{event="started",role="hooks"} 0`,
		`klbr_worker_events_total{event="reset",role="workbench"} 0`,
		`klbr_behavior_last_good_epoch{release="",session="default"} 0`,
		`klbr_attention_oldest_unanswered_age_seconds{session="default"} 0`,
		`klbr_session_blocked{reason="retrying",session="default"} 0`,
		`klbr_session_blocked{reason="retrying",session="other"} 1`,
		`klbr_session_blocked{reason="paused",session="other"} 0`,
		`klbr_storage_bytes{part="wal"}`,
		`klbr_storage_bytes{part="database"}`,
		`klbr_schema_version{readable_by="`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the exposition lacks %s", want)
		}
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		citest.SkipOrFail(t, "promtool not found (Debian: apt-get install -y prometheus)")
	}
	c := exec.Command(promtool, "check", "metrics")
	c.Stdin = bytes.NewReader(body)
	if out, err := c.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

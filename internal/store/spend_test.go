package store

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

func costp(f float64) *float64 { return &f }

// Each step commits its ledger row in its own transaction: by session,
// tree (the root), route and purpose, with the cost as given.
func TestRecordStepCommitsItsLedgerRow(t *testing.T) {
	s := newStore(t)
	sp, err := spawn(t, s, NewChild{Parent: "default", Task: "t"})
	if err != nil {
		t.Fatal(err)
	}
	n := func(i int) *int { return &i }
	mustWrite(t, s, func(tx *Tx) error {
		for _, sess := range []string{"default", sp.Session} {
			attempt, _, err := tx.StartAttempt(NewAttempt{Session: sess, WakeReason: "input"})
			if err != nil {
				return err
			}
			for i, st := range []StepResult{
				{State: "completed", Text: "a", Route: "paid", Usage: StepUsage{Prompt: n(1000), Completion: n(100), CacheRead: n(800)},
					CostUSD: costp(0.5), CostSource: CostPrice},
				{State: "completed", Text: "b", Route: "router", Usage: StepUsage{Prompt: n(10), Completion: n(1)},
					CostUSD: costp(0.25), CostSource: CostReported},
				{State: "failed", Error: "down", Route: "local"},
			} {
				st.Session, st.Attempt, st.Ordinal, st.Started = sess, attempt, i+1, time.Now()
				if _, err := tx.RecordStep(st); err != nil {
					return err
				}
			}
		}
		return tx.RecordSpend(SpendEntry{Session: sp.Session, Route: "paid", Purpose: "summary", Prompt: 50, CostUSD: costp(0.125), CostSource: CostPrice}, 0)
	})
	total, err := s.SpendSince(t.Context(), time.Time{})
	if err != nil || total.Requests != 7 || total.USD != 1.625 || total.Tokens != 2*1111+50 || total.Unpriced != 2 || total.Cached != 1600 {
		t.Fatalf("total %+v, %v", total, err)
	}
	check := func(group string, want map[string]float64) {
		t.Helper()
		rows, err := s.SpendBy(t.Context(), group, time.Time{}, time.UTC)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, r := range rows {
			got[r.Key] = r.USD
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("by %s: %v, want %v", group, got, want)
		}
	}
	check("route", map[string]float64{"paid": 1.125, "router": 0.5, "local": 0})
	check("purpose", map[string]float64{"turn": 1.5, "summary": 0.125})
	check("session", map[string]float64{"default": 0.75, sp.Session: 0.875})
	check("tree", map[string]float64{"default": 1.625})
	check("day", map[string]float64{time.Now().UTC().Format(time.DateOnly): 1.625})
	if _, err := s.SpendBy(t.Context(), "week", time.Time{}, time.UTC); err == nil {
		t.Error("spend by week is not refused")
	}
}

// A day of the ledger is a calendar day in the caps' time zone.
func TestSpendByDayInTimeZone(t *testing.T) {
	dir := t.TempDir()
	at := time.Date(2026, 3, 1, 23, 30, 0, 0, time.UTC) // 2 March 00:30 in Berlin
	s := openTest(t, dir, Options{Clock: func() time.Time { return at }})
	mustWrite(t, s, func(tx *Tx) error {
		return tx.RecordSpend(SpendEntry{Route: "r", Purpose: "test", CostUSD: costp(1), CostSource: CostPrice}, 0)
	})
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skip("no tzdata:", err)
	}
	for loc, want := range map[*time.Location]string{time.UTC: "2026-03-01", berlin: "2026-03-02"} {
		rows, err := s.SpendBy(t.Context(), "day", time.Time{}, loc)
		if err != nil || len(rows) != 1 || rows[0].Key != want {
			t.Errorf("in %v: %+v, %v; want %s", loc, rows, err, want)
		}
	}
}

// An operator's cap outlives the store that recorded it.
func TestSpendCapSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, Options{})
	mustWrite(t, s, func(tx *Tx) error { return tx.SetSpendCap("daily", 5) })
	mustWrite(t, s, func(tx *Tx) error { return tx.SetSpendCap("daily", 7.5) })
	s.Close()
	s2 := openTest(t, dir, Options{})
	caps, err := s2.SpendCaps(t.Context())
	if err != nil || caps["daily"] != 7.5 || len(caps) != 1 {
		t.Fatalf("caps after reopen %v, %v", caps, err)
	}
	if err := s2.Write(t.Context(), func(tx *Tx) error { return tx.SetSpendCap("weekly", 1) }); err == nil {
		t.Fatal("a weekly cap was stored")
	}
}

// childSteps records steps with usage and cost forever, printing each step's
// id only after its commit returned.
func childSteps(dir string) {
	s, err := Open(context.Background(), dir, Options{})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	out := bufio.NewWriter(os.Stdout)
	var attempt int64
	if err := s.Write(context.Background(), func(tx *Tx) (err error) {
		attempt, _, err = tx.StartAttempt(NewAttempt{Session: "default", WakeReason: "input"})
		return err
	}); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	for i := 1; ; i++ {
		p, c := 100+i%7, 10+i%3
		var id int64
		err := s.Write(context.Background(), func(tx *Tx) (err error) {
			id, err = tx.RecordStep(StepResult{Session: "default", Attempt: attempt, Ordinal: i, Started: time.Now(), Route: "r",
				State: "completed", Usage: StepUsage{Prompt: &p, Completion: &c}, CostUSD: costp(float64(p+c) / 1e6), CostSource: CostPrice})
			return err
		})
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Fprintf(out, "%d\n", id)
		out.Flush()
	}
}

// After a SIGKILL in the middle of recording steps, the ledger equals the
// sum of the recorded steps: no step without its row, no row without its
// step.
func TestSpendLedgerMatchesStepsAfterSIGKILL(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, Options{})
	mustWrite(t, s, func(tx *Tx) error { _, err := tx.EnsureSession("default"); return err })
	s.Close()

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KLBR_STORE_CHILD=steps", "KLBR_STORE_DIR="+dir)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	acked := 0
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		acked++
		if acked == 150 {
			cmd.Process.Signal(syscall.SIGKILL)
			break
		}
	}
	cmd.Wait()
	if acked < 150 {
		t.Fatalf("child acknowledged only %d steps", acked)
	}
	s2 := openTest(t, dir, Options{})
	var steps, stepTokens, rows, rowTokens, orphans int64
	var rowUSD float64
	s2.rdb.QueryRow(`SELECT count(*), SUM(prompt_tokens + completion_tokens) FROM model_steps`).Scan(&steps, &stepTokens)
	s2.rdb.QueryRow(`SELECT count(*), SUM(prompt_tokens + completion_tokens), SUM(cost_usd) FROM spend`).Scan(&rows, &rowTokens, &rowUSD)
	s2.rdb.QueryRow(`SELECT count(*) FROM model_steps m WHERE NOT EXISTS (SELECT 1 FROM spend WHERE step_id = m.id)`).Scan(&orphans)
	if steps < int64(acked) || rows != steps || rowTokens != stepTokens || orphans != 0 || math.Abs(rowUSD-float64(stepTokens)/1e6) > 1e-9 {
		t.Fatalf("after SIGKILL: %d steps (%d acknowledged, %d tokens), %d ledger rows (%d tokens, $%v), %d steps without a row",
			steps, acked, stepTokens, rows, rowTokens, rowUSD, orphans)
	}
	total, err := s2.SpendSince(t.Context(), time.Time{})
	if err != nil || total.Tokens != stepTokens {
		t.Fatalf("SpendSince %+v, %v; want %d tokens", total, err, stepTokens)
	}
}

// A step that ended before its request left the host (interrupted while
// it waited at a spend cap) cost nothing and is no request: it has no
// ledger row. A sent request that failed without usage still has one.
func TestUnsentStepHasNoLedgerRow(t *testing.T) {
	s := newStore(t)
	mustWrite(t, s, func(tx *Tx) error {
		attempt, _, err := tx.StartAttempt(NewAttempt{Session: "default", WakeReason: "input"})
		if err != nil {
			return err
		}
		for i, st := range []StepResult{
			{State: "interrupted", Error: "new input", Route: "main", NotSent: true},
			{State: "failed", Error: "502", Route: "main"},
		} {
			st.Session, st.Attempt, st.Ordinal, st.Started = "default", attempt, i+1, time.Now()
			if _, err := tx.RecordStep(st); err != nil {
				return err
			}
		}
		return nil
	})
	total, err := s.SpendSince(t.Context(), time.Time{})
	if err != nil || total.Requests != 1 || total.Unpriced != 1 {
		t.Fatalf("ledger %+v, %v; want the failed request only", total, err)
	}
}

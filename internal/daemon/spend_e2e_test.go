package daemon

import (
	"database/sql"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// costUsage is a scripted usage object whose provider reports its cost.
func costUsage(prompt, completion int, usd float64) map[string]any {
	return map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion, "cost": usd}
}

// metricValue is the value of the sample named by series (name{labels}) in
// a /metrics body, or NaN when absent.
func metricValue(body, series string) float64 {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return math.NaN()
}

// ledgerAgainstSteps reads the ledger's rows and sums beside the recorded
// model steps' usage, from the daemon's database file.
func ledgerAgainstSteps(t *testing.T, data string) (rows, steps int, ledgerTokens, stepTokens int64, usd float64) {
	t.Helper()
	db := openRO(t, data)
	defer db.Close()
	q := func(query string, dest ...any) {
		t.Helper()
		if err := db.QueryRow(query).Scan(dest...); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
	}
	q(`SELECT count(*), COALESCE(SUM(prompt_tokens + completion_tokens), 0), COALESCE(SUM(cost_usd), 0) FROM spend`, &rows, &ledgerTokens, &usd)
	var st sql.NullInt64
	q(`SELECT count(*), SUM(COALESCE(prompt_tokens, 0) + COALESCE(completion_tokens, 0)) FROM model_steps WHERE state = 'completed'`, &steps, &st)
	return rows, steps, ledgerTokens, st.Int64, usd
}

// A daily cap reached in the middle of a session stops its next model
// request: status shows "spend cap: daily_usd, resets <the next midnight
// in the cap's zone>", an input sent meanwhile is admitted, and raising
// the cap through the operator API resumes the session at once. The
// ledger equals the recorded steps, and /metrics counts the spend.
func TestDailyCapHoldsSessionUntilRaised(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	const step = 0.03
	model.Then(
		modeltest.Reply{Usage: costUsage(100, 20, step), Calls: []modeltest.Call{{ID: "c1", Code: "print('one')"}}},
		// After this one the day holds 0.06 of 0.05: the next request waits.
		modeltest.Reply{Usage: costUsage(100, 20, step), Calls: []modeltest.Call{{ID: "c2", Code: "print('two')"}}},
	)
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Usage: costUsage(100, 20, step), Calls: []modeltest.Call{{ID: "cw", Code: "await runtime.wait(None)"}}}
	})
	a := startAgent(t, model, "\n[spend]\ndaily_usd = 0.05\ntime_zone = \"UTC\"\n")
	a.send("count to two")
	a.eventually("the session is held at the daily cap", func() bool {
		s := a.session()
		return s.Retry != nil && s.Retry.State == RetryWaitingSpend
	})
	s := a.session()
	now := time.Now().UTC()
	midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
	if !strings.HasPrefix(s.Retry.LastError, "spend cap: daily_usd, resets "+midnight.Format("2006-01-02 15:04")) ||
		!s.Retry.NextAt.Equal(midnight) || !strings.Contains(s.Retry.Fix, "klbr-core spend cap daily") {
		t.Fatalf("held session's status: %+v; want spend cap: daily_usd, resets %s", s.Retry, midnight)
	}
	st, err := a.c.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Spend == nil || len(st.Spend.Held) != 1 || st.Spend.Held[0].Session != "default" || math.Abs(st.Spend.DayUSD-2*step) > 1e-9 ||
		len(st.Spend.Warned) != 1 || st.Spend.Warned[0] != "daily_usd" {
		t.Fatalf("status' spend: %+v", st.Spend)
	}
	m := a.scrape()
	for series, want := range map[string]float64{
		`klbr_spend_held_sessions`:                                                         1,
		`klbr_spend_warning{cap="daily_usd"}`:                                              1,
		`klbr_spend_period_usd{period="day"}`:                                              2 * step,
		`klbr_spend_usd_total{purpose="turn",route="main"}`:                                2 * step,
		`klbr_spend_tokens_total{purpose="turn",route="main"}`:                             240,
		`klbr_session_backoff_next_timestamp_seconds{session="default",state="spend_cap"}`: float64(midnight.Unix()),
	} {
		if got := metricValue(m, series); math.Abs(got-want) > 1e-9 {
			t.Errorf("/metrics %s = %v, want %v", series, got, want)
		}
	}
	if warn := a.kinds(store.LaneNotice, "spend.warning"); len(warn) != 1 || !strings.Contains(string(warn[0].Content), "daily_usd") {
		t.Fatalf("spend.warning notices: %+v", warn)
	}
	// No request starts while held; an input is admitted all the same.
	a.send("are you there?")
	time.Sleep(time.Second)
	if n := model.Count(); n != 2 {
		t.Fatalf("%d model requests at the cap, want 2", n)
	}
	if in := a.kinds(store.LaneInput, ""); len(in) != 2 {
		t.Fatalf("%d input records, want 2: the input sent at the cap was not admitted\n%s", len(in), a.dump())
	}

	out, err := a.c.SetSpendCap(t.Context(), "daily", 1)
	if err != nil {
		t.Fatal(err)
	}
	if out.State == nil || out.State.DailyUSD == nil || *out.State.DailyUSD != 1 {
		t.Fatalf("the raised cap's answer: %+v", out.State)
	}
	a.eventually("the session resumes and reads the input sent at the cap", func() bool {
		for _, r := range model.Requests() {
			for _, msg := range r.Messages {
				if content(msg) == "are you there?" {
					return true
				}
			}
		}
		return false
	})
	a.eventually("the session waits again", a.state(store.StateWaiting))
	if r := a.session().Retry; r != nil && r.State == RetryWaitingSpend {
		t.Fatalf("still held after the cap was raised: %+v", r)
	}

	n := model.Count()
	rows, steps, ledgerTok, stepTok, usd := ledgerAgainstSteps(t, a.data)
	if rows != n || steps != n || ledgerTok != stepTok || ledgerTok != int64(120*n) || math.Abs(usd-float64(n)*step) > 1e-9 {
		t.Fatalf("ledger %d rows, %d tokens, $%v; steps %d with %d tokens; %d requests", rows, ledgerTok, usd, steps, stepTok, n)
	}
	sp, err := a.c.Spend(t.Context(), "route", time.Time{})
	if err != nil || sp.Total.Requests != int64(n) || math.Abs(sp.Total.USD-usd) > 1e-9 {
		t.Fatalf("GET /v1/spend total %+v, %v; want %d requests, $%v", sp.Total, err, n, usd)
	}
	if got := metricValue(a.scrape(), `klbr_spend_usd_total{purpose="turn",route="main"}`); math.Abs(got-usd) > 1e-9 {
		t.Fatalf("klbr_spend_usd_total %v, the ledger %v", got, usd)
	}
}

// GET /v1/spend groups the ledger by session, tree, route, purpose and
// day in the caps' time zone: a child's requests are its own session's
// and its root's tree; since leaves out what came before; an unknown
// grouping is refused with the ones there are.
func TestSpendAPIGroupsTheLedger(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Usage: costUsage(100, 10, 0.25), Calls: []modeltest.Call{{ID: "r1", Code: "child = await agents.spawn(task='spend')\n" +
			"await runtime.wait(None, reason=f'child {child.id}')"}}},
		modeltest.Reply{Usage: costUsage(40, 10, 0.125), Calls: []modeltest.Call{{ID: "k1", Code: "print('SPENT')\nawait runtime.wait(None)"}}},
	)
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Usage: costUsage(10, 0, 0.5), Calls: []modeltest.Call{{ID: "rw", Code: "await runtime.wait(None)"}}}
	})
	a := startAgentsAgent(t, model, "[spend]\ntime_zone = \"UTC\"\n")
	started := time.Now()
	a.send("delegate")
	a.eventually("the child asked once and the root waits", func() bool {
		return model.Count() >= 2 && a.session().State == store.StateWaiting
	})
	a.eventually("the child's session waits or ended", func() bool {
		cs, err := a.c.Session(t.Context(), "child-1")
		return err == nil && (cs.State == store.StateWaiting || cs.State == store.StateStopped)
	})
	// The root's requests: the first ($0.25) and any after it ($0.50 each).
	rows, _, _, _, usd := ledgerAgainstSteps(t, a.data)
	rootUSD := usd - 0.125
	check := func(by string, since time.Time, want map[string]float64) {
		t.Helper()
		sp, err := a.c.Spend(t.Context(), by, since)
		if err != nil {
			t.Fatalf("by %s: %v", by, err)
		}
		got := map[string]float64{}
		var sum float64
		var n int64
		for _, g := range sp.Groups {
			got[g.Key] = g.USD
			sum += g.USD
			n += g.Requests
		}
		if len(got) != len(want) {
			t.Fatalf("by %s: %v, want %v", by, got, want)
		}
		for k, v := range want {
			if math.Abs(got[k]-v) > 1e-9 {
				t.Fatalf("by %s: %v, want %v", by, got, want)
			}
		}
		if sp.By != by || math.Abs(sp.Total.USD-sum) > 1e-9 || sp.Total.Requests != n {
			t.Fatalf("by %s: total %+v is not the groups' sum ($%v, %d requests)", by, sp.Total, sum, n)
		}
	}
	check("session", time.Time{}, map[string]float64{"default": rootUSD, "child-1": 0.125})
	check("tree", time.Time{}, map[string]float64{"default": usd})
	check("route", time.Time{}, map[string]float64{"main": usd})
	check("purpose", time.Time{}, map[string]float64{"turn": usd})
	check("day", time.Time{}, map[string]float64{time.Now().UTC().Format(time.DateOnly): usd})
	check("route", started.Add(-time.Minute), map[string]float64{"main": usd})
	check("route", time.Now().Add(time.Hour), map[string]float64{})
	if rows != model.Count() {
		t.Fatalf("%d ledger rows, %d requests", rows, model.Count())
	}
	if _, err := a.c.Spend(t.Context(), "week", time.Time{}); err == nil || !strings.Contains(err.Error(), "day route session tree purpose") {
		t.Fatalf("by week: %v; want refused naming the groupings", err)
	}
}

// A cell reads the ledger and the caps with from klbr import spend, as
// klbr-core spend does, and cannot change them: the request that commits
// a step's row has committed it before the step's cell runs.
func TestCellReadsSpend(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(modeltest.Reply{Usage: costUsage(100, 20, 0.25), Calls: []modeltest.Call{{ID: "c1", Code: "from klbr import spend, host\n" +
		"s = await spend.summary(by='purpose')\n" +
		"print('SPEND', s.by, s.total.requests, s.total.usd, [(g.key, g.usd) for g in s], s.state['daily_usd_cap'], s.state['time_zone'])\n" +
		"try:\n    await host.request('spend.set_cap', {'name': 'daily', 'usd': 100})\nexcept Exception as e:\n    print('REFUSED', e)"}}})
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{ID: "cw", Code: "await runtime.wait(None)"}}}
	})
	a := startAgent(t, model, "\n[spend]\ndaily_usd = 3.5\ntime_zone = \"UTC\"\n")
	a.send("what did you spend?")
	a.eventually("the cell's output reached the model", func() bool { return model.Count() >= 2 })
	got := lastMessage(model.Requests()[1])
	if !strings.Contains(got, "SPEND purpose 1 0.25 [('turn', 0.25)] 3.5 UTC") {
		t.Fatalf("the cell read %q", got)
	}
	if !strings.Contains(got, "REFUSED") || !strings.Contains(got, "read-only") {
		t.Fatalf("a cell's spend.set_cap: %q, want refused", got)
	}
	if caps, err := a.c.Status(t.Context()); err != nil || caps.Spend == nil || caps.Spend.DailyUSD == nil || *caps.Spend.DailyUSD != 3.5 {
		t.Fatalf("the daily cap after the cell: %+v, %v", caps.Spend, err)
	}
}

// agents.max_spawns_per_day through the daemon: the second spawn of the
// day is refused, naming the cap and the next midnight of [spend]
// time_zone.
func TestSpawnsPerDayRefusedThroughTheDaemon(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "await agents.spawn(task='one')\n" +
		"try:\n    await agents.spawn(task='two')\n    print('SPAWNED')\nexcept Exception as e:\n    print('REFUSED', e)\n" +
		"await runtime.wait(None)"}}})
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{ID: "w", Code: "await runtime.wait(None)"}}}
	})
	a := startAgentsAgent(t, model, "[agents]\nmax_spawns_per_day = 1\n[spend]\ntime_zone = \"UTC\"\n")
	a.send("fan out")
	now := time.Now().UTC()
	midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
	a.eventually("the second spawn's outcome is recorded", func() bool {
		for _, r := range a.kinds(store.LaneCell, "cell.finished") {
			if strings.Contains(string(r.Content), "REFUSED") || strings.Contains(string(r.Content), "SPAWNED") {
				return true
			}
		}
		return false
	})
	var out string
	for _, r := range a.kinds(store.LaneCell, "cell.finished") {
		out += string(r.Content)
	}
	if !strings.Contains(out, "REFUSED") || !strings.Contains(out, "agents.max_spawns_per_day = 1") ||
		!strings.Contains(out, "resets "+midnight.Format("2006-01-02 15:04 MST")) {
		t.Fatalf("the second spawn of the day: %s", out)
	}
}

// A daily cap reached mid-session holds the session until midnight in the
// cap's time zone: the daemon's clock (injected) moved past it resumes the
// session with no operator, and the new day counts from nothing. Held
// again the next day, raising the cap resumes it at once.
func TestDailyCapResetsAtMidnightInItsZone(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	const step = 0.03
	model.Otherwise(func(n int) modeltest.Reply {
		if n > 4 {
			return modeltest.Reply{Usage: costUsage(100, 20, step), Calls: []modeltest.Call{{ID: "cw", Code: "await runtime.wait(None)"}}}
		}
		return modeltest.Reply{Usage: costUsage(100, 20, step), Calls: []modeltest.Call{{ID: fmt.Sprintf("c%d", n), Code: fmt.Sprintf("print(%d)", n)}}}
	})
	zone, err := time.LoadLocation("Asia/Kathmandu") // UTC+05:45: its midnight is no UTC hour
	if err != nil {
		citest.SkipOrFail(t, "no zoneinfo for Asia/Kathmandu: "+err.Error())
	}
	now := time.Now().In(zone)
	midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, zone)
	clock := filepath.Join(t.TempDir(), "clock")
	setTestClock(t, clock, midnight.Add(-5*time.Minute))
	requirePython(t)
	data, env := instance(t)
	a := startAgentAt(t, model, "\n[spend]\ndaily_usd = 0.05\ntime_zone = \"Asia/Kathmandu\"\n", "", data, append(env, testClockEnv+"="+clock))

	a.send("count")
	a.eventually("the session is held at the daily cap", func() bool {
		s := a.session()
		return s.Retry != nil && s.Retry.State == RetryWaitingSpend
	})
	want := "spend cap: daily_usd, resets " + midnight.Format("2006-01-02 15:04 MST")
	if r := a.session().Retry; !strings.HasPrefix(r.LastError, want) || !r.NextAt.Equal(midnight) {
		t.Fatalf("held session's status: %+v; want %q at %s", r, want, midnight)
	}
	time.Sleep(500 * time.Millisecond)
	if n := model.Count(); n != 2 {
		t.Fatalf("%d model requests at the cap, want 2", n)
	}

	// Past midnight in Kathmandu: the next day's spend starts at nothing.
	setTestClock(t, clock, midnight.Add(time.Minute))
	a.eventually("the session resumes by itself and is held again the next day", func() bool {
		s := a.session()
		return model.Count() == 4 && s.Retry != nil && s.Retry.State == RetryWaitingSpend && s.Retry.NextAt.Equal(midnight.AddDate(0, 0, 1))
	})
	st, err := a.c.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Spend == nil || !st.Spend.DayStart.Equal(midnight) || math.Abs(st.Spend.DayUSD-2*step) > 1e-9 {
		t.Fatalf("the new day's spend: %+v; want $%v since %s", st.Spend, 2*step, midnight)
	}

	// The operator raises the cap: the session resumes at once.
	if _, err := a.c.SetSpendCap(t.Context(), "daily", 1); err != nil {
		t.Fatal(err)
	}
	a.eventually("the session resumes and waits", func() bool { return model.Count() == 5 && a.session().State == store.StateWaiting })
	if r := a.session().Retry; r != nil && r.State == RetryWaitingSpend {
		t.Fatalf("still held after the cap was raised: %+v", r)
	}
}

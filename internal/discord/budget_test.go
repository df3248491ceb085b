package discord

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/store"
)

func TestInvalidBudgetCountsRefusalsInTenMinutes(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	b := newInvalidBudget(0)
	b.now = func() time.Time { return now }
	answer := func(st int, scope string) *http.Response {
		r := &http.Response{StatusCode: st, Header: http.Header{}}
		if scope != "" {
			r.Header.Set("X-RateLimit-Scope", scope)
		}
		return r
	}
	for range 4999 {
		b.record(answer(403, ""))
	}
	b.record(answer(200, ""))
	b.record(answer(404, ""))
	b.record(answer(429, "shared")) // Discord does not count a shared-scope 429
	if !b.allow(false) || b.count() != 4999 {
		t.Fatalf("count %d; non-essential allowed %v", b.count(), b.allow(false))
	}
	b.record(answer(401, ""))
	if b.allow(false) || !b.allow(true) {
		t.Fatalf("at 5,000: non-essential %v (want stopped), essential %v (want allowed)", b.allow(false), b.allow(true))
	}
	now = now.Add(5 * time.Minute)
	for range 4000 {
		b.record(answer(429, "user"))
	}
	if b.allow(true) {
		t.Fatalf("at %d invalid answers an essential call was allowed", b.count())
	}
	now = now.Add(5*time.Minute + time.Second) // the first 5,000 left the window
	if b.count() != 4000 || !b.allow(false) {
		t.Fatalf("after the window moved: count %d, non-essential %v", b.count(), b.allow(false))
	}
}

// Refused requests use up the budget: the probe stops asking at the soft
// mark while a send (essential) still goes out; past the hard mark a send is
// not made and is recorded failed, with nothing delivered.
func TestTheProbeStopsBeforeTheInvalidRequestBudgetIsSpent(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	fake.SetOnRequest(func(r *http.Request) int {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/channels/50/") {
			return 403
		}
		return 0
	})
	runTransportWith(t, fake, c.socket, func(cfg *Config) {
		cfg.InvalidRequestLimit = 20
		cfg.Probe = ProbeLimits{Interval: 20 * time.Millisecond, Channels: 5, Active: time.Hour, Grace: time.Millisecond}
	})
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("14001", "50", "7", "5", "probe me"))
	waitFor(t, "the message", func() bool { return len(pending(t, c)) == 1 })
	waitFor(t, "the probe refused 10 times", func() bool { inv, _ := fake.Invalid(); return inv >= 10 })
	time.Sleep(500 * time.Millisecond) // 25 more probe ticks
	if n := fake.Requests("GET /api/v9/channels/50/messages"); n != 10 {
		t.Fatalf("%d probes of channel 50, want 10: the probe went on past half the budget", n)
	}
	conv, err := c.store.ConversationByRef(t.Context(), "discord:50")
	if err != nil {
		t.Fatal(err)
	}
	e := enqueueSend(t, c, conv.Alias, "x1/1", "still speaking", 0)
	if got := settled(t, c, e.ID); got.State != store.EffectConfirmed {
		t.Fatalf("send %s (%s): an essential call was stopped at the soft mark", got.State, got.Error)
	}
	// Eight more refusals reach the hard mark (18 of 20).
	fake.SetOnRequest(func(r *http.Request) int { return 403 })
	for i := range 8 {
		e := enqueueSend(t, c, conv.Alias, "x2/"+string(rune('a'+i)), "refused", 0)
		settled(t, c, e.ID)
	}
	before := fake.Requests("POST")
	e = enqueueSend(t, c, conv.Alias, "x3/1", "not made", 0)
	got := settled(t, c, e.ID)
	if got.State != store.EffectFailed || got.ErrorCode != "invalid_request_budget" || fake.Requests("POST") != before {
		t.Fatalf("past the hard mark: %s %s (%d requests made); want failed invalid_request_budget and none made", got.State, got.ErrorCode, fake.Requests("POST")-before)
	}
}

// Discord's bucket headers are honored (discordgo reads X-RateLimit-*):
// sends past a bucket's remaining wait for its reset instead of drawing 429s,
// which count against the invalid-request budget.
func TestSendsWaitForTheBucketInsteadOfDrawing429s(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	fake.SetBucket(2, 500*time.Millisecond)
	runTransportWith(t, fake, c.socket, func(cfg *Config) { cfg.Probe.Interval = -1 })
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("15001", "20", "", "5", "talk to me"))
	waitFor(t, "the DM", func() bool { return len(pending(t, c)) == 1 })
	var ids []int64
	for i := range 5 {
		ids = append(ids, enqueueSend(t, c, "d1", "x1/"+string(rune('a'+i)), "part "+string(rune('a'+i)), 0).ID)
	}
	for _, id := range ids {
		if got := settled(t, c, id); got.State != store.EffectConfirmed {
			t.Fatalf("effect %d %s (%s)", id, got.State, got.Error)
		}
	}
	if inv, limited := fake.Invalid(); inv != 0 || limited != 0 {
		t.Fatalf("%d invalid answers, %d from the bucket: the bucket headers were not honored", inv, limited)
	}
	if n := len(fake.Sent()); n != 5 {
		t.Fatalf("%d messages, want 5", n)
	}
}

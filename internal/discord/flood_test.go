package discord

import (
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/store"
)

// inputBodies reads the contents of the events behind the pending inputs of
// conversation conv (the store's own file, read-only).
func inputContents(t *testing.T, c *core, conv string) []string {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(c.dir, store.FileName)+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT e.content FROM inputs i JOIN events e ON e.id = i.event_id WHERE i.conversation = ? ORDER BY i.id`, conv)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		rows.Scan(&s)
		out = append(out, s)
	}
	return out
}

// 500 messages from one author in a minute do not delay a DM from another
// author: the flood passes the per-author bucket up to its burst (and its
// slow refill), the DM does not wait behind the rest; what is past the rate
// is counted and recorded by one notice naming the message ids, never
// dropped silently; the operator is never limited; and once the burst is
// over the author is heard again: nothing dead-ends.
func TestAOneAuthorFloodDoesNotDelayADM(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	const burst = 20
	runTransportWith(t, fake, c.socket, func(cfg *Config) {
		cfg.Probe.Interval = -1
		cfg.Flood = FloodLimits{AuthorBurst: burst, AuthorPerMinute: 60, ChannelBurst: 1000, ChannelPerMinute: 1000, Quiet: 400 * time.Millisecond}
		cfg.Operator = "8"
	})
	began := time.Now()
	for i := range 500 {
		fake.Dispatch("MESSAGE_CREATE", discordtest.Message(fmt.Sprint(20001+i), "50", "7", "5", fmt.Sprint("spam ", i)))
	}
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("20600", "60", "", "6", "a question, in a DM"))
	// A loaded machine takes a while to dispatch the flood: the author's
	// bucket refills one token a second meanwhile.
	refilled := int(time.Since(began).Seconds()) + 1
	var before int
	waitFor(t, "the DM", func() bool {
		for i, p := range pending(t, c) {
			if p.Conversation == "discord:60" {
				before = i
				return true
			}
		}
		return false
	})
	if before > burst+refilled+2 {
		t.Fatalf("%d flood messages were admitted ahead of the DM, want at most the burst (%d) and %d refilled", before, burst, refilled)
	}
	// The operator is never limited.
	for i := range 100 {
		fake.Dispatch("MESSAGE_CREATE", discordtest.Message(fmt.Sprint(20700+i), "51", "7", "8", fmt.Sprint("operator ", i)))
	}
	waitFor(t, "the operator's messages", func() bool { return count(pending(t, c), "discord:51") == 100 })
	waitFor(t, "the burst's notice", func() bool { return count(pending(t, c), "discord:gateway") == 1 })
	admitted := count(pending(t, c), "discord:50")
	limited := coreMetricEventually(t, c, "klbr_discord_rate_limited_messages_total", func(v float64) bool { return int(v)+admitted >= 500 })
	if admitted < burst || admitted > 100 || admitted+int(limited) != 500 {
		t.Fatalf("%d of the flood admitted, %v rate-limited: want the burst admitted and the rest counted (500 in all)", admitted, limited)
	}
	notice := inputContents(t, c, "discord:gateway")
	if len(notice) != 1 || !strings.Contains(notice[0], fmt.Sprintf("rate-limited: %d messages in channel 50", 500-admitted)) ||
		!strings.Contains(notice[0], "20500") || !strings.Contains(notice[0], "user5 (5)") {
		t.Fatalf("notice %q: want the count, the channel, the ids and the author", notice)
	}
	if n := coreMetricEventually(t, c, "klbr_discord_rate_limit_bursts_total", func(v float64) bool { return v == 1 }); n != 1 {
		t.Fatalf("klbr_discord_rate_limit_bursts_total = %v, want one notice", n)
	}
	// The burst is over: the author is heard again.
	time.Sleep(1100 * time.Millisecond) // a token refills (60 a minute)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("21000", "50", "7", "5", "sorry about that"))
	waitFor(t, "the author heard again", func() bool { return count(pending(t, c), "discord:50") == admitted+1 })
}

func count(ps []store.PendingInput, conv string) int {
	n := 0
	for _, p := range ps {
		if p.Conversation == conv {
			n++
		}
	}
	return n
}

// coreMetricEventually waits until the core's metric satisfies ok (the
// transport reports its counts with each claim).
func coreMetricEventually(t *testing.T, c *core, name string, ok func(float64) bool) float64 {
	t.Helper()
	var v float64
	waitFor(t, name, func() bool { v = coreMetric(t, c, name); return ok(v) })
	return v
}

// A burst still open when klbr-discord stops (its quiet time not yet over)
// is recorded as a notice before the transport ends: the refusals do not go
// with its memory.
func TestAnOpenBurstIsRecordedWhenTheTransportStops(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	stop := runTransportStoppable(t, fake, c.socket, func(cfg *Config) {
		cfg.Probe.Interval = -1
		cfg.Flood = FloodLimits{AuthorBurst: 5, AuthorPerMinute: 1, ChannelBurst: 1000, ChannelPerMinute: 1000, Quiet: time.Hour}
	})
	for i := range 8 {
		fake.Dispatch("MESSAGE_CREATE", discordtest.Message(fmt.Sprint(30001+i), "50", "7", "5", fmt.Sprint("chatter ", i)))
	}
	// The gateway's events are handled in order: once this one is admitted,
	// the eight were decided.
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("30100", "51", "7", "6", "someone else"))
	waitFor(t, "the marker", func() bool { return count(pending(t, c), "discord:51") == 1 })
	if n := count(pending(t, c), "discord:gateway"); n != 0 {
		t.Fatalf("%d notices before the stop, with an hour's quiet time", n)
	}
	stop()
	notice := inputContents(t, c, "discord:gateway")
	if len(notice) != 1 || !strings.Contains(notice[0], "rate-limited: 3 messages in channel 50 (ids 30006 to 30008)") {
		t.Fatalf("notices after the stop: %q, want one naming the 3 refused", notice)
	}
}

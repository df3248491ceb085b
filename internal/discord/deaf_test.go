package discord

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/session"
)

// coreMetric reads one series of the core's Discord collector.
func coreMetric(t *testing.T, c *core, name string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c.server.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range mfs {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			m := f.GetMetric()[0]
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return -1
}

// A connection that acknowledges heartbeats and delivers nothing while the
// channels move (Hermes #78881, #109521) is found by the probe, dropped and
// resumed, and the gap backfilled from history: every message is admitted
// exactly once, a late live duplicate included, and the recovery is counted.
// A healthy connection is never dropped.
func TestADeafConnectionIsFoundAndItsGapBackfilledOnce(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	runTransportWith(t, fake, c.socket, func(cfg *Config) {
		cfg.Probe = ProbeLimits{Interval: 150 * time.Millisecond, Channels: 5, Active: time.Hour, Grace: 300 * time.Millisecond}
	})
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("12001", "50", "7", "5", "morning"))
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("12002", "60", "", "6", "hi there"))
	waitFor(t, "the live messages", func() bool { return len(pending(t, c)) == 2 })
	time.Sleep(time.Second) // several probes of a healthy connection
	if _, resumes := fake.Counts(); resumes != 0 {
		t.Fatalf("%d resumes: the probe dropped a healthy connection", resumes)
	}

	fake.SetDeaf(true)
	var gap []map[string]any
	for i := range 4 {
		m := discordtest.Message(fmt.Sprint(12010+i), "50", "7", "5", fmt.Sprint("while deaf ", i))
		gap = append(gap, m)
		fake.Dispatch("MESSAGE_CREATE", m)
	}
	dm := discordtest.Message("12020", "60", "", "6", "are you there?")
	gap = append(gap, dm)
	fake.Dispatch("MESSAGE_CREATE", dm)
	waitFor(t, "the gap backfilled", func() bool { return len(pending(t, c)) == 7 })
	waitFor(t, "the deaf connection resumed", func() bool { _, r := fake.Counts(); return r >= 1 })
	// The healed connection delivers one of them again, live.
	waitFor(t, "the resumed connection", fake.Connected)
	fake.Dispatch("MESSAGE_CREATE", gap[1])
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("12030", "50", "7", "5", "after"))
	waitFor(t, "the message after", func() bool { return len(pending(t, c)) >= 8 })
	time.Sleep(600 * time.Millisecond) // later probes, a late duplicate
	if n := len(pending(t, c)); n != 8 {
		t.Fatalf("%d inputs, want 8: a message was admitted twice or lost", n)
	}
	items, _ := c.store.AttentionItems(context.Background(), session.DefaultID, nil, 50)
	if len(items) != 2 {
		t.Fatalf("%d attention items, want one per DM message (2)", len(items))
	}
	waitFor(t, "klbr_discord_gap_recoveries_total = 1", func() bool { return coreMetric(t, c, "klbr_discord_gap_recoveries_total") == 1 })
	if _, resumes := fake.Counts(); resumes != 1 {
		t.Fatalf("%d resumes, want the one recovery", resumes)
	}
}

package discord

import (
	"context"
	"encoding/json"
	"sort"
	"sync"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
)

// A gateway connection can go deaf: it acknowledges heartbeats and delivers
// nothing while the channels it watches move (Hermes #78881, #109521:
// "connected, online, intermittently deaf" for hours). Heartbeats cannot
// see it. The probe can: every ProbeLimits.Interval it asks REST for the
// newest message (GET /channels/{id}/messages?limit=1) of the few most
// recently active channels and compares it with the newest one the gateway
// delivered. A message older than Grace that the gateway never delivered
// means the connection is deaf: the transport drops it (Run resumes at the
// resume URL) and backfills each such channel after the newest message it
// saw (GET /channels/{id}/messages?after=), admitted once like every
// delivery. Each recovery counts in klbr_discord_gap_recoveries_total.

// ProbeLimits bounds the deafness probe.
type ProbeLimits struct {
	Interval time.Duration // between probes (0: 60 s; negative: off)
	Channels int           // channels asked per probe, the most recently active first (0: 5)
	Active   time.Duration // a channel is probed while its last message is this recent (0: 1 h)
	Grace    time.Duration // a message this old that the gateway did not deliver is a gap (0: 15 s)
}

func (p ProbeLimits) withDefaults() ProbeLimits {
	if p.Interval == 0 {
		p.Interval = time.Minute
	}
	if p.Channels <= 0 {
		p.Channels = 5
	}
	if p.Active <= 0 {
		p.Active = time.Hour
	}
	if p.Grace <= 0 {
		p.Grace = 15 * time.Second
	}
	return p
}

// maxWatched bounds the channels the watch remembers; the least recently
// active is forgotten first.
const maxWatched = 1024

type watched struct {
	ref    ingressapi.ConversationRef
	newest string    // the newest message id delivered (or read back)
	active time.Time // when a message was last admitted from it
}

// watch remembers, per channel, the newest message the transport saw.
type watch struct {
	mu sync.Mutex
	ch map[string]*watched
}

func newWatch() *watch { return &watch{ch: map[string]*watched{}} }

// track marks a channel active now (adding it), newest at least id.
func (w *watch) track(ref ingressapi.ConversationRef, id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.ch[ref.ChannelID]
	if c == nil {
		if len(w.ch) >= maxWatched {
			var oldest string
			for k, v := range w.ch {
				if oldest == "" || v.active.Before(w.ch[oldest].active) {
					oldest = k
				}
			}
			delete(w.ch, oldest)
		}
		c = &watched{ref: ref}
		w.ch[ref.ChannelID] = c
	}
	c.active = time.Now()
	if id != "" && snowflakeLess(c.newest, id) {
		c.newest = id
	}
}

// seen advances a tracked channel's newest message id.
func (w *watch) seen(channel, id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c := w.ch[channel]; c != nil && snowflakeLess(c.newest, id) {
		c.newest = id
	}
}

// newestAll returns the newest message id seen of any channel.
func (w *watch) newestAll() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var n string
	for _, c := range w.ch {
		if snowflakeLess(n, c.newest) {
			n = c.newest
		}
	}
	return n
}

func (w *watch) newest(channel string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c := w.ch[channel]; c != nil {
		return c.newest
	}
	return ""
}

// pick returns up to n channels active within window, most recent first.
func (w *watch) pick(n int, window time.Duration) []ingressapi.ConversationRef {
	w.mu.Lock()
	defer w.mu.Unlock()
	var cs []*watched
	for _, c := range w.ch {
		if time.Since(c.active) < window && c.newest != "" {
			cs = append(cs, c)
		}
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].active.After(cs[j].active) })
	out := make([]ingressapi.ConversationRef, 0, min(n, len(cs)))
	for _, c := range cs[:min(n, len(cs))] {
		out = append(out, c.ref)
	}
	return out
}

// probeLoop runs the deafness probe until ctx ends.
func (t *transport) probeLoop(ctx context.Context, gw *Gateway) {
	p := t.cfg.Probe.withDefaults()
	if p.Interval < 0 {
		return
	}
	tick := time.NewTicker(p.Interval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
		if t.connected.Load() {
			t.probe(ctx, gw, p)
		}
	}
}

// probe compares the newest message of the most recently active channels
// with what the gateway delivered, and recovers from a gap.
func (t *transport) probe(ctx context.Context, gw *Gateway, p ProbeLimits) {
	type gap struct {
		ref   ingressapi.ConversationRef
		after string
	}
	var gaps []gap
	for _, ref := range t.watch.pick(p.Channels, p.Active) {
		if ctx.Err() != nil {
			return
		}
		if !t.budget.allow(false) {
			t.log.Warn("probe: skipped: too many requests were refused recently (the invalid-request budget)", "invalid_requests", t.budget.count())
			return
		}
		raw, err := historyRaw(t.rest, ref.ChannelID, 1, "", "", discordgo.WithContext(nonEssential(ctx)))
		if err != nil || len(raw) == 0 {
			if err != nil {
				t.log.Debug("probe: reading a channel's newest message", "channel", ref.ChannelID, "error", classify(err).Error())
			}
			continue
		}
		id, at, ok := newestOf(raw[0])
		seen := t.watch.newest(ref.ChannelID) // now, not when picked: a delivery meanwhile counts
		if ok && snowflakeLess(seen, id) && time.Since(at) >= p.Grace {
			gaps = append(gaps, gap{ref, seen})
		}
	}
	if len(gaps) == 0 {
		return
	}
	t.gapRecoveries.Add(1)
	chans := make([]string, len(gaps))
	for i, g := range gaps {
		chans[i] = g.ref.ChannelID
	}
	t.log.Warn("gateway: channels moved without a delivery: the connection is deaf; resuming and backfilling", "channels", chans)
	gw.Reconnect("no events while watched channels moved")
	mark := gaps[0].after // where the transport last heard of the deaf channels
	for _, g := range gaps[1:] {
		if snowflakeLess(g.after, mark) {
			mark = g.after
		}
	}
	t.rediscover.request(mark, "while the gateway connection was deaf")
	for _, g := range gaps {
		n, _, err := t.catchUp(ctx, g.ref, g.after, true, "while the gateway connection was deaf")
		if err != nil {
			t.log.Warn("probe: backfilling a channel", "channel", g.ref.ChannelID, "error", classify(err).Error())
			continue
		}
		t.log.Info("probe: backfilled", "channel", g.ref.ChannelID, "messages", n)
	}
}

// newestOf reads a history message's id and time (its timestamp, else the
// id's).
func newestOf(raw json.RawMessage) (id string, at time.Time, ok bool) {
	var m struct {
		ID        string    `json:"id"`
		Timestamp time.Time `json:"timestamp"`
	}
	if len(raw) > MaxEventBytes || json.Unmarshal(raw, &m) != nil || !snowflake(m.ID) {
		return "", time.Time{}, false
	}
	if m.Timestamp.IsZero() {
		m.Timestamp = snowflakeTime(m.ID)
	}
	return m.ID, m.Timestamp, true
}

// eventChannel reads a MESSAGE_CREATE's id and channel id.
func eventChannel(data []byte) (id, channel string, ok bool) {
	var m struct {
		ID        string `json:"id"`
		ChannelID string `json:"channel_id"`
	}
	if len(data) > MaxEventBytes || json.Unmarshal(data, &m) != nil || !snowflake(m.ID) || !snowflake(m.ChannelID) {
		return "", "", false
	}
	return m.ID, m.ChannelID, true
}

package discord

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
)

// Floods. One author can post hundreds of messages a minute (a script, a
// paste split by the client, a raid), and every one of them would become an
// input the model reads and a row ahead of everyone else's. So live messages
// pass two token buckets before admission: one per author and one per guild
// channel (threads count as their own channel), each with a bounded burst and
// a steady rate. A message past either is not admitted: it is counted as
// rate-limited (klbr_discord_rate_limited_messages_total), and when the burst
// ends (no refusal for FloodLimits.Quiet, or after maxBurstSpan) one notice
// is admitted that says who, where, how many and which message ids, so the
// messages can be read back with history: nothing is dropped silently. The
// operator (discord.operator_user_id) is never limited, and DMs go through a
// lane of their own to admission, so a flood in a guild channel never delays
// a DM. An author has two buckets: one for what they address to the agent
// (DMs and mentions) and one for the rest, so their chatter in a busy
// channel never costs them a DM. A burst still open when the transport stops
// is admitted as a notice before it ends. Backfills (start, deaf recovery, thread read-back) are bounded by
// their page and are not limited, but a message the limiter refused live
// stays refused when a backfill reads it again.

// FloodLimits bounds the admission of live messages.
type FloodLimits struct {
	AuthorBurst, AuthorPerMinute   int           // per author (0: 20 and 30)
	ChannelBurst, ChannelPerMinute int           // per guild channel or thread (0: 60 and 120)
	Quiet                          time.Duration // a burst ends after this long without a refusal (0: 30 s)
	Off                            bool          // no limits (a benchmark's baseline)
}

func (l FloodLimits) withDefaults() FloodLimits {
	if l.AuthorBurst <= 0 {
		l.AuthorBurst = 20
	}
	if l.AuthorPerMinute <= 0 {
		l.AuthorPerMinute = 30
	}
	if l.ChannelBurst <= 0 {
		l.ChannelBurst = 60
	}
	if l.ChannelPerMinute <= 0 {
		l.ChannelPerMinute = 120
	}
	if l.Quiet <= 0 {
		l.Quiet = 30 * time.Second
	}
	return l
}

// maxFloodKeys bounds the buckets remembered; a full bucket is the same as
// none and is forgotten first.
const maxFloodKeys = 10000

// maxBurstSpan bounds one burst: a flood that goes on longer gets a notice
// this often, so the agent is not left in the dark for hours.
const maxBurstSpan = 10 * time.Minute

type tokenBucket struct {
	tokens float64
	at     time.Time
}

// burst is one run of refusals for one key.
type burst struct {
	scope, key     string   // "author" or "channel", and its id
	author, name   string   // the first refused message's author
	channels       []string // where its messages were, the first maxBurstChannels
	first, last    string   // message ids refused, oldest and newest
	count          int
	started, later time.Time // first and latest refusal
}

// flood is the limiter. It is used by the gateway's goroutine and the
// flush loop.
type flood struct {
	lim      FloodLimits
	operator string
	now      func() time.Time

	mu      sync.Mutex
	buckets map[string]*tokenBucket // "a<id>" authors' other messages, "d<id>" their DMs and mentions, "c<id>" channels
	bursts  map[string]*burst       // by bucket key
	// decided remembers the latest messages' decisions: a message the
	// gateway delivers twice (a replay, a re-dispatch) is decided once.
	decided map[string]bool
	order   []string // decided's keys, oldest first
}

// maxDecided bounds the decisions remembered.
const maxDecided = 4096

func newFlood(lim FloodLimits, operator string) *flood {
	return &flood{lim: lim.withDefaults(), operator: operator, now: time.Now, buckets: map[string]*tokenBucket{}, bursts: map[string]*burst{},
		decided: map[string]bool{}}
}

// allow reports whether m may be admitted now; a refusal is added to its
// burst (first says it is the message's first decision: a repeat is
// decided as before and counted nowhere).
func (f *flood) allow(m ingressapi.Message) (ok, first bool) {
	if f.lim.Off || m.Mode == ingressapi.ModeGap || (f.operator != "" && m.AuthorID == f.operator) {
		return true, true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if d, seen := f.decided[m.MessageID]; seen {
		return d, false
	}
	ok = f.decideLocked(m)
	if len(f.order) >= maxDecided {
		delete(f.decided, f.order[0])
		f.order = f.order[1:]
	}
	f.decided[m.MessageID] = ok
	f.order = append(f.order, m.MessageID)
	return ok, true
}

// refused reports whether the limiter refused message id (among the latest
// decisions it remembers). A backfill skips such a message: the burst's
// notice names it already, and reading it back from history must not let
// a flood past the limit a page at a time.
func (f *flood) refused(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	ok, seen := f.decided[id]
	return seen && !ok
}

func (f *flood) decideLocked(m ingressapi.Message) bool {
	now := f.now()
	ak := "a" + m.AuthorID
	if m.Mode == ingressapi.ModeDM || m.Mode == ingressapi.ModeMention {
		ak = "d" + m.AuthorID
	}
	a := f.bucketLocked(ak, f.lim.AuthorBurst, f.lim.AuthorPerMinute, now)
	var c *tokenBucket
	ck := ""
	if m.ChannelKind != ingressapi.KindDM {
		ck = "c" + m.ChannelID
		c = f.bucketLocked(ck, f.lim.ChannelBurst, f.lim.ChannelPerMinute, now)
	}
	switch {
	case a.tokens < 1:
		f.refuseLocked(ak, "author", m.AuthorID, m, now)
		return false
	case c != nil && c.tokens < 1:
		f.refuseLocked(ck, "channel", m.ChannelID, m, now)
		return false
	}
	a.tokens--
	if c != nil {
		c.tokens--
	}
	return true
}

// bucketLocked returns key's bucket refilled to now.
func (f *flood) bucketLocked(key string, burst, perMinute int, now time.Time) *tokenBucket {
	b := f.buckets[key]
	if b == nil {
		if len(f.buckets) >= maxFloodKeys {
			f.forgetLocked(now)
		}
		b = &tokenBucket{tokens: float64(burst), at: now}
		f.buckets[key] = b
		return b
	}
	if d := now.Sub(b.at); d > 0 {
		b.tokens = min(float64(burst), b.tokens+d.Minutes()*float64(perMinute))
		b.at = now
	}
	return b
}

// forgetLocked drops the buckets that are full (the same as none); if none
// is, an arbitrary one with no open burst.
func (f *flood) forgetLocked(now time.Time) {
	for k, b := range f.buckets {
		full := float64(f.lim.AuthorBurst)
		per := f.lim.AuthorPerMinute
		if k[0] == 'c' {
			full, per = float64(f.lim.ChannelBurst), f.lim.ChannelPerMinute
		}
		if b.tokens+now.Sub(b.at).Minutes()*float64(per) >= full {
			delete(f.buckets, k)
		}
	}
	if len(f.buckets) < maxFloodKeys {
		return
	}
	for k := range f.buckets {
		if f.bursts[k] == nil {
			delete(f.buckets, k)
			return
		}
	}
}

func (f *flood) refuseLocked(key, scope, id string, m ingressapi.Message, now time.Time) {
	b := f.bursts[key]
	if b == nil {
		b = &burst{scope: scope, key: id, author: m.AuthorID, name: m.AuthorName, first: m.MessageID, started: now}
		f.bursts[key] = b
	}
	if len(b.channels) < maxBurstChannels && !slices.Contains(b.channels, m.ChannelID) {
		b.channels = append(b.channels, m.ChannelID)
	}
	b.count++
	b.later = now
	if snowflakeLess(m.MessageID, b.first) {
		b.first = m.MessageID
	}
	if snowflakeLess(b.last, m.MessageID) {
		b.last = m.MessageID
	}
}

// maxBurstChannels bounds the channels a notice names.
const maxBurstChannels = 8

// ended takes the bursts that are over: quiet for Quiet, or open for
// maxBurstSpan (a new burst starts with the next refusal); all says every
// burst is over (the transport stops).
func (f *flood) ended(all bool) []burst {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	var out []burst
	for k, b := range f.bursts {
		if all || now.Sub(b.later) >= f.lim.Quiet || now.Sub(b.started) >= maxBurstSpan {
			out = append(out, *b)
			delete(f.bursts, k)
		}
	}
	return out
}

// notice is the input that records a burst.
func (b burst) notice(lim FloodLimits) ingressapi.Message {
	who := "author " + b.key
	if b.name != "" {
		who = b.name + " (" + b.key + ")"
	}
	rate := fmt.Sprintf("the per-author limit (%d at once, %d a minute) for %s", lim.AuthorBurst, lim.AuthorPerMinute, who)
	where := "channel " + strings.Join(b.channels, ", ")
	if len(b.channels) > 1 {
		where = "channels " + strings.Join(b.channels, ", ")
	}
	if b.scope == "channel" {
		rate = fmt.Sprintf("the per-channel limit (%d at once, %d a minute) for channel %s", lim.ChannelBurst, lim.ChannelPerMinute, b.key)
	}
	return ingressapi.Message{MessageID: "r" + strconv.FormatInt(time.Now().UnixNano(), 10), Mode: ingressapi.ModeGap, OccurredAt: time.Now(),
		Content: fmt.Sprintf("[klbr-discord] rate-limited: %d messages in %s (ids %s to %s) were not admitted: past %s. "+
			"They are still there: read them with history(after=…) if they matter.", b.count, where, b.first, b.last, rate)}
}

// floodLoop admits a notice for each burst that ended.
func (t *transport) floodLoop(ctx context.Context) {
	tick := time.NewTicker(min(time.Second, t.flood.lim.Quiet/2))
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
		for _, b := range t.flood.ended(false) {
			t.floodBursts.Add(1)
			t.log.Warn("a flood was rate-limited", "scope", b.scope, "id", b.key, "channels", b.channels, "messages", b.count)
			t.enqueue(ctx, b.notice(t.flood.lim))
		}
	}
}

// floodFlush admits a notice for each burst still open when the transport
// stops (within a few seconds: klbr-core may be down too), so that no
// refusal goes unrecorded with the transport's memory.
func (t *transport) floodFlush() {
	bs := t.flood.ended(true)
	if len(bs) == 0 {
		return
	}
	notices := make([]ingressapi.Message, len(bs))
	for i, b := range bs {
		t.floodBursts.Add(1)
		t.log.Warn("a flood was rate-limited (the transport stops)", "scope", b.scope, "id", b.key, "channels", b.channels, "messages", b.count)
		notices[i] = b.notice(t.flood.lim)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	t.admit(ctx, notices, false)
}

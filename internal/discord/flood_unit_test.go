package discord

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
)

// The limiter on an injected clock: a burst then the steady rate, per
// author and per channel; DMs have no channel bucket; the operator and gap
// notices pass; a repeated delivery is decided once; a burst ends after the
// quiet time (or its longest span) with one notice naming its ids.
func TestFloodLimiter(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	f := newFlood(FloodLimits{AuthorBurst: 3, AuthorPerMinute: 6, ChannelBurst: 5, ChannelPerMinute: 60, Quiet: 10 * time.Second}, "8")
	f.now = func() time.Time { return now }
	next := 100
	m := func(author, channel, kind string) ingressapi.Message {
		next++
		return ingressapi.Message{MessageID: fmt.Sprint(next), AuthorID: author, AuthorName: "user" + author, ChannelID: channel, ChannelKind: kind, Mode: ingressapi.ModeAmbient}
	}
	allow := func(msg ingressapi.Message) bool { ok, _ := f.allow(msg); return ok }
	tests := []struct {
		name string
		msg  ingressapi.Message
		want bool
	}{
		{"burst 1", m("5", "50", "channel"), true},
		{"burst 2", m("5", "50", "channel"), true},
		{"burst 3", m("5", "50", "channel"), true},
		{"past the author's burst", m("5", "50", "channel"), false},
		{"another author, same channel", m("6", "50", "channel"), true},
		{"the operator", m("8", "50", "channel"), true},
		{"a DM from someone else", m("7", "60", "dm"), true},
		{"the channel's burst (4 of 5 taken)", m("9", "50", "channel"), true},
		{"past the channel's burst", m("10", "50", "channel"), false},
		{"a gap notice", ingressapi.Message{MessageID: "g1", Mode: ingressapi.ModeGap}, true},
	}
	for _, tt := range tests {
		if got := allow(tt.msg); got != tt.want {
			t.Errorf("%s: allowed %v, want %v", tt.name, got, tt.want)
		}
	}
	// A repeat of a refused message is refused again, and counted nowhere.
	refused := ingressapi.Message{MessageID: "104", AuthorID: "5", ChannelID: "50", ChannelKind: "channel", Mode: ingressapi.ModeAmbient}
	if ok, first := f.allow(refused); ok || first {
		t.Fatalf("a repeat: allowed %v, first %v", ok, first)
	}
	if ends := f.ended(false); len(ends) != 0 {
		t.Fatalf("bursts ended while they go on: %+v", ends)
	}
	now = now.Add(10 * time.Second) // one token back (6 a minute), and quiet
	ends := f.ended(false)
	if len(ends) != 2 {
		t.Fatalf("%d bursts ended, want the author's and the channel's", len(ends))
	}
	for _, b := range ends {
		n := b.notice(f.lim)
		switch b.scope {
		case "author":
			if b.count != 1 || b.first != "104" || !strings.Contains(n.Content, "per-author limit (3 at once, 6 a minute) for user5 (5)") {
				t.Errorf("the author's burst: %+v: %s", b, n.Content)
			}
		case "channel":
			if b.count != 1 || !strings.Contains(n.Content, "per-channel limit (5 at once, 60 a minute) for channel 50") {
				t.Errorf("the channel's burst: %+v: %s", b, n.Content)
			}
		}
		if n.Mode != ingressapi.ModeGap {
			t.Errorf("a notice of mode %q", n.Mode)
		}
	}
	if !allow(m("5", "51", "channel")) {
		t.Fatal("the author is not heard again once a token refilled")
	}
	// A flood that never pauses is reported every maxBurstSpan.
	for i := 0; i < 700; i++ {
		allow(m("11", "52", "channel"))
		now = now.Add(time.Second)
		if i == 100 && len(f.ended(false)) != 0 {
			t.Fatal("a burst ended while refusals went on")
		}
	}
	if ends := f.ended(false); len(ends) != 1 || ends[0].key != "11" {
		t.Fatalf("a long flood's burst did not end at its longest span: %+v", ends)
	}
}

// An author's chatter past their bucket never costs them a DM or a mention
// (those have a bucket of their own, itself limited); a burst's notice
// names every channel it spanned; the transport's stop takes the bursts
// still open.
func TestAnAuthorsChatterDoesNotCostTheirDMs(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	f := newFlood(FloodLimits{AuthorBurst: 2, AuthorPerMinute: 1, ChannelBurst: 100, ChannelPerMinute: 100, Quiet: time.Hour}, "")
	f.now = func() time.Time { return now }
	next := 100
	m := func(channel, kind, mode string) ingressapi.Message {
		next++
		return ingressapi.Message{MessageID: fmt.Sprint(next), AuthorID: "5", AuthorName: "user5", ChannelID: channel, ChannelKind: kind, Mode: mode}
	}
	allow := func(msg ingressapi.Message) bool { ok, _ := f.allow(msg); return ok }
	for i, ch := range []string{"50", "51", "50", "51"} {
		if got, want := allow(m(ch, "channel", ingressapi.ModeAmbient)), i < 2; got != want {
			t.Fatalf("chatter %d: allowed %v, want %v", i, got, want)
		}
	}
	if !allow(m("60", "dm", ingressapi.ModeDM)) || !allow(m("50", "channel", ingressapi.ModeMention)) {
		t.Fatal("a DM or mention after the author's chatter was refused")
	}
	if allow(m("60", "dm", ingressapi.ModeDM)) {
		t.Fatal("a third DM at once passed: DMs and mentions are limited too")
	}
	if ends := f.ended(false); len(ends) != 0 {
		t.Fatalf("bursts ended while quiet is an hour: %+v", ends)
	}
	ends := f.ended(true)
	if len(ends) != 2 {
		t.Fatalf("the stop took %d bursts, want the chatter's and the DMs'", len(ends))
	}
	var chatter burst
	for _, b := range ends {
		if b.count == 2 {
			chatter = b
		}
	}
	if n := chatter.notice(f.lim).Content; !strings.Contains(n, "2 messages in channels 50, 51") {
		t.Fatalf("the chatter's notice %q does not name both channels", n)
	}
	if len(f.ended(true)) != 0 {
		t.Fatal("a burst was taken twice")
	}
}

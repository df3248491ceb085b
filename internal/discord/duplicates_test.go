package discord

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
)

// A message the gateway delivers many times on one connection (a catch-up
// that re-dispatched one message 24 times), and messages that arrive both
// from the backfill and live, are each admitted once, with one item.
func TestAMessageThatArrivesTwiceIsAdmittedOnce(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(runCtx, Config{Token: testToken, APIBase: fake.APIBase(), IngressSocket: c.socket})
	}()
	waitFor(t, "the gateway session", fake.Connected)
	dm := discordtest.Message("11001", "40", "", "5", "are you there?")
	for range 24 {
		fake.Dispatch("MESSAGE_CREATE", dm)
	}
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("11002", "40", "", "5", "after the repeats"))
	waitFor(t, "both messages", func() bool { return len(pending(t, c)) == 2 })

	// klbr-discord restarts; what came meanwhile is backfilled while the
	// gateway also delivers it live.
	cancel()
	<-done
	waitFor(t, "the gateway closed", func() bool { return !fake.Connected() })
	missed := []map[string]any{}
	for i := range 5 {
		m := discordtest.Message(fmt.Sprint(11010+i), "40", "", "5", fmt.Sprint("missed ", i))
		missed = append(missed, m)
		fake.Dispatch("MESSAGE_CREATE", m) // into the channel's history; nobody is connected
	}
	runTransport(t, fake, c.socket)
	for _, m := range missed {
		fake.Dispatch("MESSAGE_CREATE", m) // and live, racing the backfill
	}
	waitFor(t, "the missed messages", func() bool { return len(pending(t, c)) == 7 })
	time.Sleep(300 * time.Millisecond) // a late duplicate would show now
	if n := len(pending(t, c)); n != 7 {
		t.Fatalf("%d inputs, want 7: a message was admitted twice", n)
	}
	items, _ := c.store.AttentionItems(context.Background(), session.DefaultID, nil, 50)
	if len(items) != 7 {
		t.Fatalf("%d attention items, want one per DM message (7)", len(items))
	}
}

// A send answered 500, 502 or 504 after Discord created the message is not
// sent again: the retry carries the same nonce with enforce_nonce, and
// Discord answers it with the message it made. One message each.
func TestServerErrorsAfterCreateAreSettledByTheNonce(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	var mu sync.Mutex
	failWith := map[string]int{} // text → status to answer its first create with
	fake.AfterAccept = func(s discordtest.Sent) int {
		mu.Lock()
		defer mu.Unlock()
		st := failWith[s.Content]
		delete(failWith, s.Content)
		return st
	}
	runTransport(t, fake, c.socket)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("12001", "50", "", "5", "hi"))
	waitFor(t, "the DM", func() bool { return len(pending(t, c)) == 1 })
	for i, st := range []int{500, 502, 504} {
		t.Run(fmt.Sprint(st), func(t *testing.T) {
			text := fmt.Sprintf("answered %d", st)
			mu.Lock()
			failWith[text] = st
			mu.Unlock()
			e := settled(t, c, enqueueSend(t, c, "d1", fmt.Sprintf("x12/%d", i), text, 0).ID)
			var same []discordtest.Sent
			for _, s := range fake.Sent() {
				if s.Content == text {
					same = append(same, s)
				}
			}
			if e.State != store.EffectConfirmed || len(same) != 1 || e.MessageID != same[0].ID || e.Attempts != 1 {
				t.Fatalf("effect %+v; Discord holds %d messages with its text", e, len(same))
			}
		})
	}
}

// A send whose answer is lost and whose evidence is ambiguous is unknown,
// never retried blindly; when its nonce shows up later (the gateway's echo,
// lagging), the transport settles it confirmed.
func TestAnUnknownSendIsSettledLaterByItsNonce(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	var mu sync.Mutex
	// Once broken, Discord makes the message and answers 502, then answers
	// every retry 502 before looking at it.
	var broken bool
	tries := map[string]int{}
	fake.AfterAccept = func(discordtest.Sent) int {
		mu.Lock()
		defer mu.Unlock()
		if broken {
			return 502
		}
		return 0
	}
	fake.OnSend = func(ch, nonce string) (int, float64) {
		mu.Lock()
		defer mu.Unlock()
		if tries[nonce]++; broken && tries[nonce] > 1 {
			return 502, 0
		}
		return 0, 0
	}
	runTransport(t, fake, c.socket)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("13001", "60", "", "5", "hi"))
	waitFor(t, "the DM", func() bool { return len(pending(t, c)) == 1 })
	// The agent said "ok" a moment ago: text alone cannot tell which is which.
	first := settled(t, c, enqueueSend(t, c, "d1", "x13/0", "ok", 0).ID)
	if first.State != store.EffectConfirmed {
		t.Fatalf("the first ok: %+v", first)
	}
	mu.Lock()
	broken = true
	mu.Unlock()
	fake.SetDeferEchoes(true)
	e := settled(t, c, enqueueSend(t, c, "d1", "x13/1", "ok", 0).ID)
	if e.State != store.EffectUnknown {
		t.Fatalf("the second ok is %s (%s), want unknown: two messages of ours carry its text", e.State, e.Error)
	}
	if n := len(fake.Sent()); n != 2 {
		t.Fatalf("Discord holds %d messages, want 2 (no blind retry made a third)", n)
	}
	fake.ReleaseEchoes()
	waitFor(t, "the unknown send settled by its nonce", func() bool {
		got, _ := c.store.Effect(context.Background(), e.ID)
		return got.State == store.EffectConfirmed
	})
	got, _ := c.store.Effect(context.Background(), e.ID)
	if got.MessageID != fake.Sent()[1].ID || !strings.Contains(got.Evidence, "nonce") {
		t.Fatalf("settled as %+v, want Discord's second message by its nonce", got)
	}
}

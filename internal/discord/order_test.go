package discord

import (
	"fmt"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/discordtest"
)

// Messages that arrive between the gateway's READY and the first hello wait
// for the hello: admitted before it, the first would start its channel's
// backfill cursor, and the hello's backfill would read the rest (still
// queued) as messages that arrived while klbr-discord was not connected,
// with a false gap notice when they fill a page. (It failed in CI under
// load, when the hello came late.)
func TestMessagesBeforeTheFirstHelloAreNotABackfill(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	release := make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	runTransportWith(t, fake, slowHello(t, c.socket, release), func(cfg *Config) {
		cfg.Probe.Interval = -1
		cfg.Flood = FloodLimits{AuthorBurst: 1000, AuthorPerMinute: 1000, ChannelBurst: 1000, ChannelPerMinute: 1000}
	})
	const n = 150
	for i := range n {
		fake.Dispatch("MESSAGE_CREATE", discordtest.Message(fmt.Sprint(40001+i), "50", "7", fmt.Sprint(5+i%7), fmt.Sprint("chatter ", i)))
	}
	time.Sleep(500 * time.Millisecond) // time enough to admit them, were admission not waiting
	if got := count(pending(t, c), "discord:50"); got != 0 {
		t.Errorf("%d messages admitted before the first hello", got)
	}
	close(release)
	released = true
	waitFor(t, "the messages", func() bool { return count(pending(t, c), "discord:50") == n })
	time.Sleep(300 * time.Millisecond) // a backfill, were one started, has read by now
	if reads := fake.Requests("GET /api/v9/channels/50/messages"); reads != 0 {
		t.Errorf("channel 50's history was read %d times: the live messages were taken for a backfill", reads)
	}
	if notices := inputContents(t, c, "discord:gateway"); len(notices) != 0 {
		t.Fatalf("notices %q: want none (nothing was missed)", notices)
	}
	if got := count(pending(t, c), "discord:50"); got != n {
		t.Fatalf("%d of %d admitted", got, n)
	}
}

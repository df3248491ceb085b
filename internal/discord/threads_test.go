package discord

import (
	"context"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/store"
)

// A thread created after startup, and a forum post whose opening message
// was written before the bot could join, both under watched channels, are
// joined and their messages admitted (OpenClaw #7918: no events from new
// threads until a restart). A thread under an unwatched channel is not
// joined, nor is an archived one.
func TestMessagesInThreadsCreatedAfterStartupArrive(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	runTransportWith(t, fake, c.socket, func(cfg *Config) {
		cfg.Channels = []string{"70", "80"}
		cfg.Probe.Interval = -1
	})
	fake.CreateThread("13001", "70", "7", false, nil)
	waitFor(t, "the thread joined", func() bool { return fake.ThreadJoins("13001") == 1 })
	mention := discordtest.Message("13002", "13001", "7", "5", "<@99> look at this thread")
	mention["mentions"] = []any{map[string]any{"id": "99"}}
	fake.Dispatch("MESSAGE_CREATE", mention)

	fake.CreateThread("13010", "80", "7", true, discordtest.Message("13010", "13010", "7", "6", "forum post: the build is red"))
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("13011", "13010", "7", "5", "a reply in the post"))

	fake.CreateThread("13020", "71", "7", false, nil) // not watched
	waitFor(t, "the thread messages", func() bool { return len(pending(t, c)) == 3 })
	ctx := context.Background()
	for _, id := range []string{"13001", "13010"} {
		conv, err := c.store.ConversationByRef(ctx, "discord:"+id)
		if err != nil {
			convs, _ := c.store.Conversations(ctx)
			t.Fatalf("thread %s: %v (conversations %+v)", id, err, convs)
		}
		if conv.Kind != "thread" {
			t.Errorf("thread %s is a %q conversation", id, conv.Kind)
		}
	}
	items, _ := c.store.AttentionItems(ctx, "default", []string{string(store.ItemPending)}, 10)
	if len(items) != 1 || items[0].MessageID != "13002" {
		t.Fatalf("items %+v, want the mention in the thread", items)
	}
	time.Sleep(300 * time.Millisecond)
	if n := fake.ThreadJoins("13020"); n != 0 {
		t.Fatalf("a thread under an unwatched channel was joined %d times", n)
	}
	if n := len(pending(t, c)); n != 3 {
		t.Fatalf("%d inputs, want 3", n)
	}
}

package discord

import (
	"context"
	"sync"
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

// Threads that existed before klbr-discord started (made while it was not
// running, or before it ever joined them) are found at start with GET
// /guilds/{id}/threads/active, joined when the bot is not a member yet, and
// read back from where the store last saw them; each message is admitted
// once across restarts. An archived thread is neither joined nor read; a
// thread under an unwatched channel is not joined.
func TestThreadsThatExistedBeforeStartAreJoinedAndReadBack(t *testing.T) {
	dir := t.TempDir()
	c := startCore(t, dir)
	fake := discordtest.New("99")
	defer fake.Close()
	fake.AddGuild("7")
	watched := func(cfg *Config) {
		cfg.Channels = []string{"70"}
		cfg.Probe.Interval = -1
	}
	stop := runTransportStoppable(t, fake, c.socket, watched)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("14000", "70", "7", "5", "in the channel"))
	fake.CreateThread("14001", "70", "7", false, nil)
	waitFor(t, "the live thread joined", func() bool { return fake.ThreadJoins("14001") == 1 })
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("14002", "14001", "7", "5", "in the live thread"))
	waitFor(t, "two inputs", func() bool { return len(pending(t, c)) == 2 })
	stop()

	// While klbr-discord is down: the joined thread moves, a thread is made
	// (the bot not in it) and talked in, one is archived, one is unwatched.
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("14003", "14001", "7", "6", "while you were away"))
	fake.AddThread("14010", "70", "7", false)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("14010", "14010", "7", "6", "a thread made while you were away"))
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("14011", "14010", "7", "5", "and a reply in it"))
	fake.AddThread("14020", "70", "7", true)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("14021", "14020", "7", "5", "in an archived thread"))
	fake.AddThread("14030", "71", "7", false)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("14031", "14030", "7", "5", "under an unwatched channel"))

	stop = runTransportStoppable(t, fake, c.socket, watched)
	waitFor(t, "the threads read back", func() bool { return len(pending(t, c)) == 5 })
	if n := fake.ThreadJoins("14010"); n != 1 {
		t.Fatalf("the thread made while away was joined %d times, want 1", n)
	}
	// Live messages in the found thread pass the parent's filter now.
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("14012", "14010", "7", "5", "live in the found thread"))
	waitFor(t, "the live message in the found thread", func() bool { return len(pending(t, c)) == 6 })
	stop()

	stop = runTransportStoppable(t, fake, c.socket, watched)
	time.Sleep(500 * time.Millisecond)
	stop()
	if n := len(pending(t, c)); n != 6 {
		t.Fatalf("%d inputs after a second restart, want 6: a message was admitted twice", n)
	}
	for id, want := range map[string]int{"14001": 1, "14010": 1, "14020": 0, "14030": 0} {
		if n := fake.ThreadJoins(id); n != want {
			t.Errorf("thread %s joined %d times, want %d", id, n, want)
		}
	}
	conv, err := c.store.ConversationByRef(context.Background(), "discord:14010")
	if err != nil || conv.Kind != "thread" {
		t.Fatalf("the found thread's conversation: %+v, %v", conv, err)
	}
}

// runTransportStoppable runs the transport until the returned stop is
// called (or the test ends): a klbr-discord restart within one test.
func runTransportStoppable(t *testing.T, fake *discordtest.Fake, socket string, adjust func(*Config)) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		cfg := Config{Token: testToken, APIBase: fake.APIBase(), IngressSocket: socket}
		if adjust != nil {
			adjust(&cfg)
		}
		Run(ctx, cfg)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
			waitFor(t, "the gateway closed", func() bool { return !fake.Connected() })
		})
	}
	t.Cleanup(stop)
	waitFor(t, "the gateway session", fake.Connected)
	return stop
}

// A thread made while the transport was not hearing the gateway (the
// session lost between a disconnect and the new session, or a connection
// gone deaf) announced itself to nobody: its THREAD_CREATE is gone with the
// session. After the new session, or the deaf connection's recovery, the
// transport asks for the guild's active threads again, joins the new one
// and reads back what was said in it meanwhile: a mention there wakes the
// agent. Archived threads are still never joined.
func TestThreadsMadeWhileTheGatewayWasLostAreFoundAfterIt(t *testing.T) {
	for _, tc := range []struct {
		name  string
		probe ProbeLimits
		lose  func(*discordtest.Fake)
		back  func(*discordtest.Fake)
	}{
		{"session lost", ProbeLimits{Interval: -1},
			func(f *discordtest.Fake) { f.SetUnreachable(true); f.Disconnect(true) },
			func(f *discordtest.Fake) { f.SetUnreachable(false) }},
		{"deaf connection", ProbeLimits{Interval: 150 * time.Millisecond, Channels: 5, Active: time.Hour, Grace: 300 * time.Millisecond},
			func(f *discordtest.Fake) { f.SetDeaf(true) },
			func(f *discordtest.Fake) { // the parent moves: the probe can tell
				f.Dispatch("MESSAGE_CREATE", discordtest.Message("15030", "70", "7", "6", "anyone?"))
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startCore(t, t.TempDir())
			fake := discordtest.New("99")
			defer fake.Close()
			fake.AddGuild("7")
			runTransportWith(t, fake, c.socket, func(cfg *Config) {
				cfg.Channels = []string{"70"}
				cfg.Probe = tc.probe
			})
			fake.Dispatch("MESSAGE_CREATE", discordtest.Message("15000", "70", "7", "5", "before"))
			waitFor(t, "the first message", func() bool { return len(pending(t, c)) == 1 })

			tc.lose(fake)
			fake.CreateThread("15010", "70", "7", false, nil)
			mention := discordtest.Message("15011", "15010", "7", "5", "<@99> over here, in the new thread")
			mention["mentions"] = []any{map[string]any{"id": "99"}}
			fake.Dispatch("MESSAGE_CREATE", mention)
			fake.CreateThread("15020", "70", "7", false, nil)
			fake.ArchiveThread("15020")
			tc.back(fake)

			ctx := context.Background()
			waitFor(t, "the mention in the new thread wakes the agent", func() bool {
				items, _ := c.store.AttentionItems(ctx, "default", []string{string(store.ItemPending)}, 10)
				return len(items) == 1 && items[0].MessageID == "15011"
			})
			if n := fake.ThreadJoins("15010"); n != 1 {
				t.Fatalf("the new thread was joined %d times, want 1", n)
			}
			waitFor(t, "the gateway back", fake.Connected)
			live := discordtest.Message("15012", "15010", "7", "6", "<@99> and live in the found thread")
			live["mentions"] = []any{map[string]any{"id": "99"}}
			fake.Dispatch("MESSAGE_CREATE", live)
			waitFor(t, "the live mention in the found thread", func() bool {
				items, _ := c.store.AttentionItems(ctx, "default", []string{string(store.ItemPending)}, 10)
				return len(items) == 2
			})
			if n := fake.ThreadJoins("15020"); n != 0 {
				t.Fatalf("an archived thread was joined %d times", n)
			}
			conv, err := c.store.ConversationByRef(ctx, "discord:15010")
			if err != nil || conv.Kind != "thread" {
				t.Fatalf("the found thread's conversation: %+v, %v", conv, err)
			}
			// Once at start, once after the loss: not at every probe or resume.
			if n := fake.Requests("GET /api/v9/guilds/7/threads/active"); n != 2 {
				t.Fatalf("the active threads were listed %d times, want 2", n)
			}
		})
	}
}

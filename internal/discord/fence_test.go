package discord

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
)

// TestSecondTransportIsRefused: with one klbr-discord delivering, a second
// one for the same klbr-core (another process) is refused at its hello and
// stops with an error that says why, while the first keeps delivering;
// every send reaches Discord exactly once.
func TestSecondTransportIsRefused(t *testing.T) {
	c := startCore(t, t.TempDir())
	fake := discordtest.New("99")
	defer fake.Close()
	first := startChild(t, fake, c.socket)
	waitFor(t, "the first transport's gateway session", fake.Connected)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("6001", "60", "", "5", "ping"))
	waitFor(t, "the DM", func() bool { return len(pending(t, c)) == 1 })
	items, _ := c.store.AttentionItems(context.Background(), session.DefaultID, nil, 10)
	if e := settled(t, c, enqueueSend(t, c, "d1", "f1/1", "one", items[0].ID).ID); e.State != store.EffectConfirmed {
		t.Fatalf("the first transport's send: %+v", e)
	}

	second := exec.Command(os.Args[0], "-test.run=^$")
	second.Env = append(os.Environ(), "KLBR_DISCORD_CHILD=1", "KLBR_DISCORD_API="+fake.APIBase(), "KLBR_INGRESS_SOCKET="+c.socket)
	var out bytes.Buffer
	second.Stderr = &out
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- second.Wait() }()
	select {
	case err := <-exited:
		if err == nil {
			t.Fatalf("the second transport exited cleanly:\n%s", out.String())
		}
	case <-time.After(30 * time.Second):
		second.Process.Kill()
		<-exited
		t.Fatalf("the second transport was not refused:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "another klbr-discord") {
		t.Errorf("the refusal does not say why:\n%s", out.String())
	}
	if first.ProcessState != nil {
		t.Fatal("the first transport stopped")
	}
	e := settled(t, c, enqueueSend(t, c, "d1", "f1/2", "two", 0).ID)
	if e.State != store.EffectConfirmed {
		t.Fatalf("after the refusal the first transport's send is %+v", e)
	}
	if n := len(fake.Sent()); n != 2 {
		t.Fatalf("Discord saw %d messages, want 2 (each send once)", n)
	}
}

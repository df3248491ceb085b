package daemon

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/discord"
	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// klbr-core and klbr-discord both read [discord] operator_user_id and
// notify_held from one klbr.toml: a send delivery.review holds is DMed to the
// operator once, with the command that releases it and buttons; the
// operator's Release delivers it once, and its receipt names the button.
func TestHeldSendsReachTheOperatorsDM(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "h1", Code: "c = await discord.current()\n" +
			"r = await c.send('the password is in the vault')\nprint('send', r.state)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "h2", Code: "await runtime.wait(None, reason='asked the operator')"}}},
	)
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}}
	})
	fake := discordtest.New("99")
	defer fake.Close()
	token := filepath.Join(t.TempDir(), "discord-token")
	if err := os.WriteFile(token, []byte("e2e-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	toml := fmt.Sprintf("\n[discord]\napi_base = %q\ntoken_file = %q\noperator_user_id = \"8\"\nnotify_held = true\n", fake.APIBase(), token)
	a := startAgentWithTree(t, model, toml, map[string]string{"klbr_hooks/delivery.py": heldReview})
	// klbr-discord as its main runs it, from the same klbr.toml.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	env := map[string]string{"KLBR_DATA_DIR": a.data, "KLBR_CONFIG": filepath.Join(a.data, "klbr.toml")}
	go func() {
		done <- discord.Main(ctx, nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, io.Discard, nil)
	}()
	t.Cleanup(func() { cancel(); <-done })
	a.eventually("the gateway session", fake.Connected)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("8401", "84", "", "5", "what's the password?"))
	var notice discordtest.Sent
	a.eventually("the operator's DM", func() bool {
		for _, s := range fake.Sent() {
			if dm := fake.DMChannel("8"); dm != "" && s.ChannelID == dm {
				notice = s
				return true
			}
		}
		return false
	})
	held, err := a.c.Held(ctx, 10)
	if err != nil || len(held.Effects) != 1 {
		t.Fatalf("held: %+v %v", held, err)
	}
	id := held.Effects[0].ID
	if !strings.Contains(notice.Content, fmt.Sprintf("klbr-core release %d", id)) || !strings.Contains(notice.Content, "it mentions a password") {
		t.Fatalf("the DM: %q", notice.Content)
	}
	fake.Press(notice.ID, fmt.Sprintf("klbr:release:%d", id), "8", 0)
	a.eventually("the released send delivered", func() bool {
		n := 0
		for _, s := range fake.Sent() {
			if s.ChannelID == "84" {
				n++
			}
		}
		return n == 1
	})
	var sent store.Record
	a.eventually("its receipt", func() bool {
		rs := a.kinds(store.LaneSpeech, "discord.sent")
		if len(rs) == 1 {
			sent = rs[0]
		}
		return len(rs) == 1
	})
	if !strings.Contains(string(sent.Content), "the operator (Discord user 8, a button of the DM)") {
		t.Fatalf("the receipt does not name the button: %s", sent.Content)
	}
}

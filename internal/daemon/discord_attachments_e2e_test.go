package daemon

import (
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// A DM with two attachments: the model's view of it lists each (alias,
// name, type, size), and a cell reads them as item.attachments.
func TestTheModelAndACellSeeAMessagesAttachments(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "a1", Code: "it = (await (await discord.current()).items())[0]\n" +
			"print('atts', [(a.alias, a.filename, a.content_type, a.size) for a in it.attachments])\n" +
			"try:\n    await it.attachments[0].read()\nexcept discord.HostError as e:\n    print('read', e.code)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "a2", Code: "await runtime.wait(None, reason='looked')"}}},
	)
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}}
	})
	a := startAgent(t, model, "")
	fake := discordtest.New("99")
	defer fake.Close()
	startTransport(t, fake, a.data)
	a.eventually("the gateway session", fake.Connected)
	m := discordtest.Message("8401", "84", "", "5", "what is wrong here?")
	m["attachments"] = []any{
		map[string]any{"id": "8402", "filename": "screenshot.png", "content_type": "image/png", "size": 1536000,
			"url": "https://cdn.discordapp.com/attachments/84/8402/screenshot.png?ex=1&is=2&hm=3"},
		map[string]any{"id": "8403", "filename": "build.log", "size": 300, "url": "https://cdn.discordapp.com/attachments/84/8403/build.log"},
	}
	fake.Dispatch("MESSAGE_CREATE", m)
	var cell string
	a.eventually("the cell's outcome", func() bool {
		for _, r := range a.kinds(store.LaneCell, "cell.finished") {
			if strings.Contains(string(r.Content), "atts") {
				cell = string(r.Content)
			}
		}
		return cell != ""
	})
	if !strings.Contains(cell, `atts [('a1', 'screenshot.png', 'image/png', 1536000), ('a2', 'build.log', None, 300)]`) || !strings.Contains(cell, "read unavailable") {
		t.Fatalf("the cell saw %s", cell)
	}
	first := model.Requests()[0].Messages
	var seen string
	for _, msg := range first {
		if c := content(msg); strings.Contains(c, "what is wrong here?") {
			seen = c
		}
	}
	if !strings.Contains(seen, `[attachment a1: "screenshot.png", "image/png", 1.5 MiB]`) ||
		!strings.Contains(seen, `[attachment a2: "build.log", "unknown type", 300 B]`) {
		t.Fatalf("the model saw %q", seen)
	}
	if strings.Contains(seen, "cdn.discordapp.com") {
		t.Fatalf("the model saw the attachment's CDN link: %q", seen)
	}
}

package daemon

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// A DM with two attachments: the model's view of it lists each (alias,
// name, type, size), and a cell reads them as item.attachments: the
// bytes, the text of a text file and a read-only copy to open.
func TestTheModelAndACellSeeAMessagesAttachments(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "a1", Code: "it = (await (await discord.current()).items())[0]\n" +
			"print('atts', [(a.alias, a.filename, a.content_type, a.size) for a in it.attachments])\n" +
			"png, log = it.attachments\nb = await png.read()\nprint('read', len(b), b[:4])\n" +
			"print('text', repr(log.text))\nimport os\n" +
			"print('path', open(log.path).read() == log.text, os.access(log.path, os.W_OK), log.path.startswith(os.environ['TMPDIR']))\n" +
			"try:\n    png.text\nexcept ValueError as e:\n    print('png text:', e)"}}},
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
	png := append([]byte("\x89PNG"), bytes.Repeat([]byte{7}, 1536000-4)...)
	log := bytes.Repeat([]byte("error: x\n"), 34)[:300]
	m["attachments"] = []any{
		fake.Attachment("8402", "84", "8401", "screenshot.png", "image/png", png, time.Hour),
		fake.Attachment("8403", "84", "8401", "build.log", "", log, time.Hour),
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
	if !strings.Contains(cell, `atts [('a1', 'screenshot.png', 'image/png', 1536000), ('a2', 'build.log', None, 300)]`) ||
		!strings.Contains(cell, `read 1536000 b'\\x89PNG'`) || !strings.Contains(cell, `text 'error: x\\nerror: x`) ||
		!strings.Contains(cell, "path True False True") || !strings.Contains(cell, "png text: attachment a1") {
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
	if strings.Contains(seen, fake.APIBase()[:strings.Index(fake.APIBase(), "/api")]) || strings.Contains(seen, "hm=") {
		t.Fatalf("the model saw the attachment's CDN link: %q", seen)
	}
}

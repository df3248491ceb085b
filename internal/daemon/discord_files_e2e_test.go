package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// A cell sends files from its workspace, and passes on an attachment it was
// shown, with a message: the message goes out once, as multipart/form-data,
// with the files' bytes as they were when it was asked, and its receipt is
// confirmed. An attachment of a message it was not shown is not found. A link (to a file outside
// the workspace), a path outside it, eleven files and more than 10 MiB are
// each refused before anything is recorded or sent, saying why.
func TestACellSendsFilesFromItsWorkspace(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	code := "import os\n" +
		"open('report.txt', 'w').write('all green\\n')\n" +
		"open('shot.png', 'wb').write(b'\\x89PNG\\r\\n\\x1a\\n' + bytes(300))\n" +
		"os.symlink('/etc/hostname', 'evil.txt')\n" +
		"with open('big.bin', 'wb') as f:\n    f.truncate(11 << 20)\n" +
		"c = await discord.current()\n" +
		"photo = (await c.items())[0].attachments[0]\n" +
		"r = await c.send('here are the logs', files=['report.txt', 'shot.png', photo])\n" +
		"open('report.txt', 'w').write('changed after the send\\n')\n" +
		"print('sent', r.state, r.delivered, [(f.filename, f.size, f.attachment_id) for f in r.files])\n" +
		"for name, fs in (('evil', ['evil.txt']), ('outside', ['../x']), ('big', ['big.bin']), ('eleven', ['report.txt'] * 11), ('forged', [discord.Attachment({'id': '1', 'alias': 'a9'}, '8601')])):\n" +
		"    try:\n        await c.send('x', files=fs)\n    except (discord.HostError, ValueError) as e:\n        print(name, getattr(e, 'code', 'ValueError'), e)\n"
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "f1", Code: code}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "f2", Code: "await runtime.wait(None, reason='sent')"}}},
	)
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}}
	})
	requirePython(t)
	data, env := instance(t)
	// A workspace apart from the data directory: cells may not make
	// entries in a directory on the way to it (Landlock).
	ws := filepath.Join(filepath.Dir(data), "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, e := range env {
		if strings.HasPrefix(e, "KLBR_WORKSPACE=") {
			env[i] = "KLBR_WORKSPACE=" + ws
		}
	}
	a := startAgentAt(t, model, "", "", data, env)
	fake := discordtest.New("99")
	defer fake.Close()
	startTransport(t, fake, a.data)
	a.eventually("the gateway session", fake.Connected)
	dm := discordtest.Message("8601", "86", "", "5", "send me the logs, and this photo back")
	dm["attachments"] = []any{fake.Attachment("8602", "86", "8601", "photo.jpg", "image/jpeg", []byte("\xff\xd8\xff\xe0 a photo"), time.Hour)}
	fake.Dispatch("MESSAGE_CREATE", dm)
	var cell string
	a.eventually("the cell's outcome", func() bool {
		for _, r := range a.kinds(store.LaneCell, "cell.finished") {
			if strings.Contains(string(r.Content), "sent ") {
				cell = string(r.Content)
			}
		}
		return cell != ""
	})
	for _, want := range []string{"sent confirmed True", "evil invalid", "symbolic link", "outside invalid", "big too_large", "10 MiB", "eleven ValueError", "forged not_found"} {
		if !strings.Contains(cell, want) {
			t.Errorf("the cell's output lacks %q:\n%s", want, cell)
		}
	}
	var withFiles []discordtest.Sent
	for _, s := range fake.Sent() {
		if len(s.Files) > 0 {
			withFiles = append(withFiles, s)
		}
	}
	if len(fake.Sent()) != 1 || len(withFiles) != 1 {
		t.Fatalf("Discord holds %d messages (%d with files), want the one send", len(fake.Sent()), len(withFiles))
	}
	s := withFiles[0]
	if s.Content != "here are the logs" || len(s.Files) != 3 || s.Files[0].Name != "report.txt" || string(s.Files[0].Data) != "all green\n" ||
		s.Files[1].Name != "shot.png" || s.Files[1].ContentType != "image/png" || len(s.Files[1].Data) != 308 ||
		s.Files[2].Name != "photo.jpg" || string(s.Files[2].Data) != "\xff\xd8\xff\xe0 a photo" {
		t.Fatalf("Discord got %q with %d files: %+v", s.Content, len(s.Files), s.Files)
	}
	// The receipt names each file with the attachment id Discord gave it,
	// to the cell and in the stored discord.sent record.
	want := fmt.Sprintf("[('report.txt', 10, '%[1]s0'), ('shot.png', 308, '%[1]s1'), ('photo.jpg', 12, '%[1]s2')]", s.ID)
	if !strings.Contains(cell, want) {
		t.Errorf("the cell's receipt does not name the files as %s:\n%s", want, cell)
	}
	var rec struct {
		Files []struct {
			Filename     string `json:"filename"`
			Size         int64  `json:"size"`
			AttachmentID string `json:"attachment_id"`
		} `json:"files"`
	}
	sent := a.kinds(store.LaneSpeech, "discord.sent")
	if len(sent) != 1 || json.Unmarshal(sent[0].Content, &rec) != nil || len(rec.Files) != 3 ||
		rec.Files[0].Filename != "report.txt" || rec.Files[0].Size != 10 || rec.Files[0].AttachmentID != s.ID+"0" ||
		rec.Files[2].Filename != "photo.jpg" || rec.Files[2].AttachmentID != s.ID+"2" {
		t.Fatalf("the stored receipt does not name the files: %d records, %+v", len(sent), rec)
	}
}

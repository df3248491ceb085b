package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/hosttest"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// A cell on a workbench on a worker host (KLBR_REMOTE_PLACEMENT) sends
// files=['report.txt', <an absolute path>]: klbr-core reads them from the
// host's copy of the workspace (its unit's directory there), not its own
// workspace, which holds another report.txt, and Discord gets their bytes
// with one receipt. The directory is the cell's to write, and the host's
// read runs as the login: a link to another unit's file, a link in a middle
// component, a path out of the directory are refused and nothing of them
// is sent; the 10 MiB are checked before anything goes out.
func TestACellOnAWorkerHostSendsFilesFromItsWorkspace(t *testing.T) {
	h := hosttest.StartWorker(t)
	b, err := os.ReadFile(filepath.Join(kernelDir(t), "klbr-kernel"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.BinDir, "klbr-kernel"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	// Another unit's directory on the host, readable by the login.
	other := filepath.Join(h.WorkDir, "klbr-job-99-1.service")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	const secret = "another unit's secret\n"
	if err := os.WriteFile(filepath.Join(other, "secret"), []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	model := modeltest.New()
	defer model.Close()
	code := "import os\n" +
		"open('report.txt', 'w').write('written on the host\\n')\n" +
		"os.makedirs('sub', exist_ok=True)\n" +
		"open('sub/notes.txt', 'w').write('notes\\n')\n" +
		fmt.Sprintf("os.symlink(%q, 'evil.txt')\n", filepath.Join(other, "secret")) +
		fmt.Sprintf("os.symlink(%q, 'other')\n", other) +
		"with open('big.bin', 'wb') as f:\n    f.truncate(11 << 20)\n" +
		"with open('half.bin', 'wb') as f:\n    f.truncate(6 << 20)\n" +
		"c = await discord.current()\n" +
		"r = await c.send('the report', files=['report.txt', os.path.abspath('sub/notes.txt')])\n" +
		"print('sent', r.state, r.delivered, [(f.filename, f.size) for f in r.files])\n" +
		"for name, fs in (('evil', ['evil.txt']), ('middle', ['other/secret']), ('big', ['big.bin']), ('sum', ['half.bin', 'half.bin']), ('outside', ['../klbr-job-99-1.service/secret'])):\n" +
		"    try:\n        await c.send('x', files=fs)\n    except discord.HostError as e:\n        print(name, e.code, e)\n"
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "f1", Code: code}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "f2", Code: "await runtime.wait(None, reason='done')"}}},
	)
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{Code: "await runtime.wait(None)"}}}
	})
	hostTOML := fmt.Sprintf("[hosts.lab]\nssh = %q\nidentity_file = %q\nknown_hosts_file = %q\nwork_dir = %q\nmanager = %q\n",
		h.SSH(), h.IdentityFile, h.KnownHostsFile, h.WorkDir, h.Manager)
	a := startAgentTOML(t, "", route("main", model, "")+hostTOML, "KLBR_REMOTE_PLACEMENT=lab")
	// klbr-core's workspace has a report.txt of its own.
	if err := os.WriteFile(filepath.Join(filepath.Dir(a.data), "report.txt"), []byte("klbr-core's local copy\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fake := discordtest.New("99")
	defer fake.Close()
	startTransport(t, fake, a.data)
	a.eventually("the gateway session", fake.Connected)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("8701", "87", "", "5", "send me the report"))
	var cell string
	a.eventually("the cell's outcome", func() bool {
		for _, r := range a.kinds(store.LaneCell, "cell.finished") {
			if s := string(r.Content); strings.Contains(s, "sent ") {
				cell = s
			}
		}
		return cell != ""
	})
	for _, want := range []string{"sent confirmed True [('report.txt', 20), ('notes.txt', 6)]",
		"evil invalid", "symbolic link", "middle invalid", "big too_large", "sum too_large", "10 MiB", "outside invalid", "not a file in the workspace"} {
		if !strings.Contains(cell, want) {
			t.Errorf("the cell's output lacks %q:\n%s", want, cell)
		}
	}
	sent := fake.Sent()
	if len(sent) != 1 {
		t.Fatalf("Discord holds %d messages, want the one send: %+v", len(sent), sent)
	}
	s := sent[0]
	if s.Content != "the report" || len(s.Files) != 2 || s.Files[0].Name != "report.txt" || string(s.Files[0].Data) != "written on the host\n" ||
		s.Files[1].Name != "notes.txt" || string(s.Files[1].Data) != "notes\n" {
		t.Fatalf("Discord got %q with %d files: %+v", s.Content, len(s.Files), s.Files)
	}
	var rec struct {
		Files []struct {
			Filename     string `json:"filename"`
			AttachmentID string `json:"attachment_id"`
		} `json:"files"`
	}
	recs := a.kinds(store.LaneSpeech, "discord.sent")
	if len(recs) != 1 || json.Unmarshal(recs[0].Content, &rec) != nil || len(rec.Files) != 2 || rec.Files[1].AttachmentID != s.ID+"1" {
		t.Fatalf("want one receipt naming both files: %d records, %+v", len(recs), rec)
	}
}

// A child spawned on a worker host, delegated discord.send, sends a file of
// its copy of the workspace there (WORK_DIR/klbr-ws-…): Discord gets the
// copy's bytes, which the child changed, not the parent's file; a link in
// the copy to another unit's file is refused.
func TestAChildOnAWorkerHostSendsAFileFromItsCopy(t *testing.T) {
	h, ws := remoteChildLab(t)
	other := filepath.Join(h.WorkDir, "klbr-job-99-1.service")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "secret"), []byte("another unit's secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	model := modeltest.New()
	defer model.Close()
	var mu sync.Mutex
	rootN, childN := 0, 0
	model.Answer(func(n int, req modeltest.Request) modeltest.Reply {
		mu.Lock()
		defer mu.Unlock()
		wait := modeltest.Reply{Calls: []modeltest.Call{{ID: fmt.Sprintf("w%d", n), Code: "await runtime.wait(None, reason='idle')"}}}
		for _, m := range req.Messages {
			if strings.Contains(content(m), "TASK-ON-HOST") && m["role"] == "user" {
				childN++
				if childN > 1 {
					return modeltest.Reply{Calls: []modeltest.Call{{ID: fmt.Sprintf("k%d", n), Code: "await agents.finish({'sent': True})"}}}
				}
				return modeltest.Reply{Calls: []modeltest.Call{{ID: "k1", Code: "import os\n" +
					"open('notes.txt', 'a').write('from the child\\n')\n" +
					fmt.Sprintf("os.symlink(%q, 'evil.txt')\n", filepath.Join(other, "secret")) +
					"c = (await discord.conversations())[0]\n" +
					"r = await c.send('from the child', files=['notes.txt'])\n" +
					"print('CHILD SENT', r.state, [(f.filename, f.size) for f in r.files])\n" +
					"try:\n    await c.send('x', files=['evil.txt'])\nexcept discord.HostError as e:\n    print('EVIL', e.code, e)\n"}}}
			}
		}
		rootN++
		if rootN == 1 {
			return modeltest.Reply{Calls: []modeltest.Call{{ID: "r1", Code: "c = await agents.spawn(task='TASK-ON-HOST: send the notes', host='lab', delegate=['discord.send'])\nprint('SPAWNED', c.id)"}}}
		}
		return wait
	})
	a, _ := startRemoteChildAgent(t, h, model, ws)
	fake := discordtest.New("99")
	defer fake.Close()
	startTransport(t, fake, a.data)
	a.eventually("the gateway session", fake.Connected)
	fake.Dispatch("MESSAGE_CREATE", discordtest.Message("8801", "88", "", "5", "have a child send the notes"))
	a.eventually("the child's send", func() bool { return a.cellSaid("child-1", "EVIL ") })
	if !a.cellSaid("child-1", "CHILD SENT confirmed [('notes.txt', 20)]") || !a.cellSaid("child-1", "EVIL invalid") || !a.cellSaid("child-1", "symbolic link") {
		t.Fatalf("the child's cell:\n%v", a.sessionRecords("child-1"))
	}
	sent := fake.Sent()
	if len(sent) != 1 || len(sent[0].Files) != 1 || sent[0].Files[0].Name != "notes.txt" || string(sent[0].Files[0].Data) != "root\nfrom the child\n" {
		t.Fatalf("Discord got %+v", sent)
	}
}

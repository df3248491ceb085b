package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/discordtest"
	"github.com/klbr-dev/klbr/internal/hosttest"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// A cell on a workbench on a worker host (KLBR_REMOTE_PLACEMENT) names
// files=['report.txt']: the file it wrote is in the host's copy of the
// workspace. klbr-core's own workspace holds another report.txt; sending
// that one would send what the cell never wrote. The send is refused,
// saying why and what to do instead, and nothing reaches Discord.
func TestASendFromAWorkbenchOnAWorkerHostSendsNoLocalFile(t *testing.T) {
	h := hosttest.StartWorker(t)
	b, err := os.ReadFile(filepath.Join(kernelDir(t), "klbr-kernel"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.BinDir, "klbr-kernel"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	model := modeltest.New()
	defer model.Close()
	code := "open('report.txt', 'w').write('written on the host\\n')\n" +
		"c = await discord.current()\n" +
		"try:\n    r = await c.send('the report', files=['report.txt'])\n    print('sent', r.state)\n" +
		"except discord.HostError as e:\n    print('refused', e.code, e)\n"
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
			if s := string(r.Content); strings.Contains(s, "sent ") || strings.Contains(s, "refused ") {
				cell = s
			}
		}
		return cell != ""
	})
	for _, s := range fake.Sent() {
		for _, f := range s.Files {
			t.Errorf("Discord got %q with %s: %q", s.Content, f.Name, f.Data)
		}
	}
	for _, want := range []string{"refused unsupported", "worker host lab", "nothing was sent"} {
		if !strings.Contains(cell, want) {
			t.Errorf("the cell's output lacks %q:\n%s", want, cell)
		}
	}
}

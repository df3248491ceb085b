package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/store"
)

// noPrefixBreaks fails the test when an agent request does not extend the
// one before it byte for byte (what a provider's prompt cache needs).
func noPrefixBreaks(t *testing.T, reqs []modeltest.Request) {
	t.Helper()
	if breaks := prefixBreaks(reqs); len(breaks) > 0 {
		t.Fatalf("%d of %d requests changed the previous one's prefix:\n%s", len(breaks), len(reqs), strings.Join(breaks, "\n"))
	}
}

// A maintenance goal brings the maintenance skill into the context right
// after the goal, where it stays: the system message is the same for the
// maintenance turn and the plain turn after it, and each request extends
// the one before.
func TestMaintenanceSkillKeepsThePrefix(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "m1", Code: "print('tidy')"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "m2", Code: "await runtime.wait(None)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "m3", Code: "await runtime.wait(None)"}}},
	)
	a := startAgent(t, model, "")
	if _, err := a.c.Send(a.t.Context(), "default", api.SendRequest{Text: "tidy the hooks", SourceKey: "maint-1", Maintenance: true}); err != nil {
		t.Fatal(err)
	}
	a.eventually("the maintenance turn", func() bool { return model.Count() == 2 && a.session().State == store.StateWaiting })
	a.send("just chat")
	a.eventually("the plain turn", func() bool { return model.Count() == 3 })
	reqs := model.Requests()
	noPrefixBreaks(t, reqs)
	msgs := reqs[0].Messages
	if len(msgs) < 3 || content(msgs[1]) != "[maintenance goal] tidy the hooks" || !strings.Contains(content(msgs[2]), "# maintenance") ||
		strings.Contains(content(msgs[0]), "# maintenance") {
		t.Fatalf("the maintenance turn's first request: %v", msgs)
	}
}

// A managed skill added in the middle of a session does not change the
// system message: the changed index follows the history as a message of
// its own, and each request extends the one before.
func TestSkillIndexChangeKeepsThePrefix(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	var data string
	model.Answer(func(n int, req modeltest.Request) modeltest.Reply {
		switch n {
		case 1:
			// A skill appears between the first and the second request.
			dir := filepath.Join(data, "skills", "mine")
			os.MkdirAll(dir, 0o755)
			os.WriteFile(filepath.Join(dir, "SKILL.md"), []byte("# mine\nThe agent's own helper.\n"), 0o644)
			return modeltest.Reply{Calls: []modeltest.Call{{ID: "s1", Code: "print('one')"}}}
		case 2:
			return modeltest.Reply{Calls: []modeltest.Call{{ID: "s2", Code: "print('two')"}}}
		}
		return modeltest.Reply{Calls: []modeltest.Call{{ID: "sw", Code: "await runtime.wait(None)"}}}
	})
	a := startAgent(t, model, "")
	data = a.data
	a.send("work a while")
	a.eventually("the session waits", func() bool { return model.Count() >= 3 && a.session().State == store.StateWaiting })
	reqs := model.Requests()
	noPrefixBreaks(t, reqs)
	last := reqs[len(reqs)-1].Messages
	found := false
	for _, m := range last[1:] {
		found = found || strings.Contains(content(m), "- mine: The agent's own helper.")
	}
	if !found || strings.Contains(content(last[0]), "- mine:") {
		t.Fatalf("the new skill is not in the history after the system message: %v", last)
	}
}

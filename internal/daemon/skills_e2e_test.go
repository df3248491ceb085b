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

// "Self-improvement survives amnesia": the agent writes klbr_skills/greet.py
// and a test for it in a draft, publishes and activates it; the next
// workbench generation imports it; after a daemon restart it still does; and
// the model's contract message lists it.
func TestSkillAsCodeSurvivesAmnesia(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	write := `d = await behavior.draft()
await d.write("klbr_skills/greet.py", '"""Greets someone by name."""\ndef hello(name):\n    return "hello " + name\n')
await d.write("tests/test_greet.py", "import unittest\nfrom klbr_skills import greet\n\nclass T(unittest.TestCase):\n    def test_hello(self):\n        self.assertEqual(greet.hello('x'), 'hello x')\n")
pub = await behavior.publish(d)
r = await behavior.activate(pub, reason="a greeting skill")
print("kind", r.kind)`
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "w1", Code: write}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "u1", Code: "import klbr_skills.greet as g\nprint(g.hello('operator'), g.__file__)\nst = await behavior.status()\nprint('validation', st.validation['ok'], st.validation['own_tests']['passed'])"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "z1", Code: "await runtime.wait(None)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "u2", Code: "import klbr_skills.greet as g, klbr_skills.mine as m\nprint(g.hello('again'), m.VALUE)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "z2", Code: "await runtime.wait(None)"}}},
	)
	a := startAgent(t, model, "")
	a.send("learn to greet")
	a.eventually("the session waits", func() bool { return model.Count() == 3 && a.session().State == store.StateWaiting })
	out := cellOutputs(a)
	if !strings.Contains(out, "kind workbench") || !strings.Contains(out, "hello operator") || !strings.Contains(out, "/runtime/skillpkg/") ||
		!strings.Contains(out, "validation True True") {
		t.Fatalf("cells:\n%s", out)
	}
	// An attempt keeps the release it started under: its prompt too.
	if sys := content(model.Requests()[2].Messages[0]); strings.Contains(sys, "klbr_skills.greet") || !strings.Contains(sys, "- maintenance:") {
		t.Fatalf("the first attempt's contract message:\n%s", sys)
	}

	// A managed skill with code, outside any release: the same namespace.
	mine := filepath.Join(a.data, "skills", "mine")
	os.MkdirAll(mine, 0o755)
	os.WriteFile(filepath.Join(mine, "SKILL.md"), []byte("# mine\nThe agent's own helper.\n"), 0o644)
	os.WriteFile(filepath.Join(mine, "__init__.py"), []byte("\"\"\"My own helper module.\"\"\"\nVALUE = 7\n"), 0o644)
	a.kill()
	a.start()
	a.send("greet again")
	a.eventually("the second greeting", func() bool { return strings.Contains(cellOutputs(a), "hello again 7") })
	if sys := content(model.Requests()[3].Messages[0]); !strings.Contains(sys, "- klbr_skills.greet: Greets someone by name.") ||
		!strings.Contains(sys, "- mine: The agent's own helper.") || !strings.Contains(sys, "- klbr_skills.mine: My own helper module.") {
		t.Fatalf("the contract message does not index the skill:\n%s", sys)
	}
	if !strings.Contains(a.d.String(), "klbr_skills.greet") && !strings.Contains(a.d.String(), "msg=skills") {
		t.Fatalf("the daemon did not log the skill index at start:\n%s", a.d)
	}
}

func cellOutputs(a *agent) string {
	var b strings.Builder
	for _, r := range a.kinds(store.LaneCell, "cell.finished") {
		b.Write(r.Content)
		b.WriteString("\n")
	}
	return b.String()
}

// A maintenance goal (klbr-core maintain, or the browser's flag) brings the
// maintenance skill body right after it; a plain input does not, and the
// contract message never carries it (TestMaintenanceSkillKeepsThePrefix).
func TestMaintenanceTurnCarriesTheSkill(t *testing.T) {
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "m1", Code: "await runtime.wait(None)"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "m2", Code: "await runtime.wait(None)"}}},
	)
	a := startAgent(t, model, "")
	if _, err := a.c.Send(a.t.Context(), "default", api.SendRequest{Text: "tidy the hooks", SourceKey: "maint-1", Maintenance: true}); err != nil {
		t.Fatal(err)
	}
	a.eventually("the maintenance turn", func() bool { return model.Count() == 1 && a.session().State == store.StateWaiting })
	a.send("just chat")
	a.eventually("the plain turn", func() bool { return model.Count() == 2 })
	reqs := model.Requests()
	user, skill := content(reqs[0].Messages[1]), content(reqs[0].Messages[2])
	if !strings.Contains(skill, "Maintenance turn") || !strings.Contains(skill, "# maintenance") || user != "[maintenance goal] tidy the hooks" {
		t.Fatalf("maintenance turn: user %q, then %q…", user, skill[:min(len(skill), 300)])
	}
	n := 0
	for _, m := range reqs[1].Messages {
		if strings.Contains(content(m), "Maintenance turn") {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("the plain turn's request carries the maintenance skill %d times, want once (after its goal)", n)
	}
}

package hosts

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/hosttest"
)

// A job on a host sees its own directory and nothing else of klbr's there:
// not another job's directory (both run as the same login uid, so the
// directories' 0700 does not part them), not the rest of the work root,
// not the login's home (its authorized key, its caches), and not the
// service manager (the system bus, systemd's private socket), through
// which the login's polkit rule would let it start units of its choice.
func TestJobSeesOnlyItsOwnDirectory(t *testing.T) {
	h := hosttest.Start(t)
	e := labEngine(t, h, nil)
	ctx := ctxT(t)
	// A file of the host's klbr, in the work root beside the jobs' directories.
	if err := os.WriteFile(filepath.Join(h.WorkDir, "klbr-state"), []byte("host-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const victim, thief = "klbr-job-901-1.service", "klbr-job-902-1.service"
	if _, err := e.Start(ctx, "lab", Unit{Name: victim, Argv: []string{"sh", "-c", "echo victim-secret > secret; sleep 60"}}); err != nil {
		t.Fatal(err)
	}
	victimDir := filepath.Join(h.WorkDir, victim)
	for deadline := ctx; ; {
		if b, _ := os.ReadFile(filepath.Join(victimDir, "secret")); string(b) == "victim-secret\n" {
			break
		}
		if deadline.Err() != nil {
			t.Fatal("the victim job never wrote its file")
		}
	}
	probe := strings.Join([]string{
		"cat " + filepath.Join(victimDir, "secret") + " 2>/dev/null && echo LEAK:victim",
		"ls -A " + victimDir + " 2>/dev/null | grep -q . && echo LEAK:victim-dir",
		"cat " + filepath.Join(h.WorkDir, "klbr-state") + " 2>/dev/null && echo LEAK:work-root",
		"ls -A \"$HOME\" 2>/dev/null | grep -q . && echo LEAK:home",
		"ls -A /root 2>/dev/null | grep -q . && echo LEAK:root-home",
		"systemctl list-units >/dev/null 2>&1 && echo LEAK:systemd",
		"echo mine > own && cat own",
	}, "\n")
	if _, err := e.Start(ctx, "lab", Unit{Name: thief, Argv: []string{"sh", "-c", probe}}); err != nil {
		t.Fatal(err)
	}
	st := waitEnded(t, e, thief)
	var out strings.Builder
	if _, err := e.Output(ctx, "lab", thief, 1<<16, &out); err != nil {
		t.Fatal(err)
	}
	if code, why := st.Outcome(); code != 0 {
		t.Fatalf("the probe failed: %s\n%s", why, out.String())
	}
	if strings.Contains(out.String(), "LEAK") || strings.TrimSpace(out.String()) != "mine" {
		t.Fatalf("a job reached what is not its own (want only \"mine\"):\n%s", out.String())
	}
	for _, u := range []string{victim, thief} {
		e.Stop(ctx, "lab", u)
		if err := e.Collect(ctx, "lab", u); err != nil {
			t.Fatal(err)
		}
	}
}

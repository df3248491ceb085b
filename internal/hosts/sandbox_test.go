package hosts

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// A confined job (klbr-kernel's Landlock around it, as around a local
// job) can write only its own directory, and cannot reach another job's
// directory even by the way its mount namespace leaves open: the other
// job's processes, /proc/PID/root (same uid). Nor the login's home, nor the
// tree cache, nor the rest of the work root.
func TestConfinedJobReachesOnlyItsOwnDirectory(t *testing.T) {
	h := hosttest.Start(t)
	h.InstallKernel(t)
	e := labEngine(t, h, nil)
	ctx := ctxT(t)
	if err := os.MkdirAll(filepath.Join(h.WorkDir, "cache", "0123"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.WorkDir, "cache", "0123", "tree"), []byte("cached\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A file of another program of the host in its /tmp (the harness's work
	// root is under /tmp too, as a host's work_dir may be).
	if err := os.WriteFile("/tmp/klbr-host-tmp-912", []byte("host-tmp\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove("/tmp/klbr-host-tmp-912")
	const victim, thief = "klbr-job-911-1.service", "klbr-job-912-1.service"
	if _, err := e.Start(ctx, "lab", Unit{Name: victim, Confine: true, Argv: []string{"sh", "-c", "echo victim-secret > secret; exec sleep 60"}}); err != nil {
		t.Fatal(err)
	}
	victimDir := filepath.Join(h.WorkDir, victim)
	var pid int
	for {
		st, err := e.State(ctx, "lab", victim)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(filepath.Join(victimDir, "secret")); string(b) == "victim-secret\n" && st[0].MainPID > 0 {
			pid = st[0].MainPID
			break
		}
		if ctx.Err() != nil || st[0].Ended() {
			t.Fatalf("the victim job never wrote its file: %+v", st[0])
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Every process of the victim's unit: its klbr-kernel and the sleep.
	procs, err := h.Enter("sh", "-c", "cg=$(systemctl show -p ControlGroup --value "+victim+"); cat /sys/fs/cgroup$cg/cgroup.procs 2>/dev/null || cat /sys/fs/cgroup/systemd$cg/cgroup.procs").Output()
	if err != nil || len(strings.Fields(string(procs))) == 0 {
		t.Fatalf("the victim's processes: %q %v (main pid %d)", procs, err, pid)
	}
	var probe []string
	for _, p := range strings.Fields(string(procs)) {
		// The pids are the host's (the lab's PID namespace is the host's own).
		probe = append(probe, "cat /proc/"+p+"/root"+filepath.Join(victimDir, "secret")+" 2>/dev/null && echo LEAK:proc-root-"+p)
	}
	probe = append(probe,
		"cat "+filepath.Join(victimDir, "secret")+" 2>/dev/null && echo LEAK:victim",
		"cat "+filepath.Join(h.WorkDir, "cache", "0123", "tree")+" 2>/dev/null && echo LEAK:cache",
		"ls -A \"$HOME\" 2>/dev/null | grep -q . && echo LEAK:home",
		"cat /tmp/klbr-host-tmp-912 2>/dev/null && echo LEAK:host-tmp",
		"(echo x > /tmp/klbr-leak-912) 2>/dev/null && echo LEAK:write-tmp",
		"(echo x > /var/tmp/klbr-leak-912) 2>/dev/null && echo LEAK:write-var-tmp",
		"echo x > \"$TMPDIR/t\" && echo tmp-ok",
		"echo mine > own && cat own",
	)
	if _, err := e.Start(ctx, "lab", Unit{Name: thief, Confine: true, Argv: []string{"sh", "-c", strings.Join(probe, "\n")}}); err != nil {
		t.Fatal(err)
	}
	st := waitEnded(t, e, thief)
	var out strings.Builder
	if _, err := e.Output(ctx, "lab", thief, 1<<16, &out); err != nil {
		t.Fatal(err)
	}
	os.Remove("/tmp/klbr-leak-912")
	os.Remove("/var/tmp/klbr-leak-912")
	if code, why := st.Outcome(); code != 0 {
		t.Fatalf("the probe failed: %s\n%s", why, out.String())
	}
	if strings.Contains(out.String(), "LEAK") || strings.TrimSpace(out.String()) != "tmp-ok\nmine" {
		t.Fatalf("a confined job reached what is not its own (want only \"tmp-ok\", \"mine\"):\n%s", out.String())
	}
	for _, u := range []string{victim, thief} {
		e.Stop(ctx, "lab", u)
		if err := e.Collect(ctx, "lab", u); err != nil {
			t.Fatal(err)
		}
	}
}

// A confined unit on a host without klbr-kernel is not started, and the
// error says what to install.
func TestConfinedJobNeedsKlbrKernel(t *testing.T) {
	h := hosttest.Start(t)
	e := labEngine(t, h, nil)
	ctx := ctxT(t)
	const unit = "klbr-job-913-1.service"
	_, err := e.Start(ctx, "lab", Unit{Name: unit, Confine: true, Argv: []string{"true"}})
	if !errors.Is(err, ErrNoKernel) || !strings.Contains(err.Error(), "install klbr") {
		t.Fatalf("got %v, want ErrNoKernel with what to install", err)
	}
	if st, _ := e.State(ctx, "lab", unit); st[0].Exists() {
		t.Fatal("the unit was started without klbr-kernel")
	}
}

// A job's output file is in its own directory, which it may write: one it
// replaced with a link to a file out of its reach (another job's) is not
// read through the link when its output is brought back.
func TestJobOutputIsNotReadThroughALink(t *testing.T) {
	h := hosttest.Start(t)
	h.InstallKernel(t)
	e := labEngine(t, h, nil)
	ctx := ctxT(t)
	other := filepath.Join(h.WorkDir, "klbr-job-921-1.service")
	if err := os.MkdirAll(other, 0o700); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(other, "secret")
	if err := os.WriteFile(secret, []byte("s3cr3t of another job\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const u = "klbr-job-922-1.service"
	if _, err := e.Start(ctx, "lab", Unit{Name: u, Confine: true, Argv: []string{"sh", "-c", "echo before; rm -f output; ln -s " + secret + " output"}}); err != nil {
		t.Fatal(err)
	}
	waitEnded(t, e, u)
	if _, err := os.Readlink(filepath.Join(h.WorkDir, u, "output")); err != nil {
		t.Fatalf("the job did not put its link: %v", err)
	}
	var out strings.Builder
	if _, err := e.Output(ctx, "lab", u, 1<<16, &out); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "s3cr3t") {
		t.Fatalf("the job's output was read through its link to another job's file: %q", out.String())
	}
	if err := e.Collect(ctx, "lab", u); err != nil {
		t.Fatal(err)
	}
}

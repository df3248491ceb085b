package hosts

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/hosttest"
)

// A job's devices are the host's and it may write them (Landlock grants /dev
// whole, for GPUs and the like), but it shares no file there with another
// job: /dev/shm, where any login may make files, is the unit's own (a job's
// file there is not seen by a job running at the same time, nor left in the
// host's /dev/shm), and a root login's job makes no file in /dev itself.
// Each job can still use its own /dev/shm (Python's multiprocessing keeps
// its semaphores there).
func TestJobsDoNotShareDevShm(t *testing.T) {
	h := hosttest.Start(t)
	h.InstallKernel(t)
	e := labEngine(t, h, nil)
	ctx := ctxT(t)
	name := "klbr-shm-" + strings.TrimPrefix(h.Addr, "10.")
	t.Cleanup(func() { os.Remove("/dev/shm/" + name); os.Remove("/dev/" + name) })
	const writer, reader = "klbr-job-921-1.service", "klbr-job-922-1.service"
	if _, err := e.Start(ctx, "lab", Unit{Name: writer, Confine: true, Argv: []string{"sh", "-c",
		"echo writer-secret > /dev/shm/" + name + " && cat /dev/shm/" + name + " && exec sleep 60"}}); err != nil {
		t.Fatal(err)
	}
	for {
		var out strings.Builder
		if _, err := e.Output(ctx, "lab", writer, 1<<16, &out); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out.String(), "writer-secret") {
			break
		}
		if st, _ := e.State(ctx, "lab", writer); ctx.Err() != nil || st[0].Ended() {
			t.Fatalf("the writer never wrote its file: %+v\n%s", st[0], out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if b, err := os.ReadFile("/dev/shm/" + name); err == nil {
		t.Fatalf("the job's /dev/shm file is in the host's /dev/shm: %q", b)
	}
	probe := strings.Join([]string{
		"cat /dev/shm/" + name + " 2>/dev/null && echo LEAK:shm",
		"ls -A /dev/shm | grep -q . && echo LEAK:shm-listing",
		"echo mine > /dev/shm/own && cat /dev/shm/own",
		"(: > /dev/" + name + ") 2>/dev/null && echo LEAK:dev-write",
		"[ -c /dev/null ] && echo x > /dev/null && echo devices",
	}, "\n")
	if _, err := e.Start(ctx, "lab", Unit{Name: reader, Confine: true, Argv: []string{"sh", "-c", probe}}); err != nil {
		t.Fatal(err)
	}
	st := waitEnded(t, e, reader)
	var out strings.Builder
	if _, err := e.Output(ctx, "lab", reader, 1<<16, &out); err != nil {
		t.Fatal(err)
	}
	if code, why := st.Outcome(); code != 0 {
		t.Fatalf("the probe failed: %s\n%s", why, out.String())
	}
	if got := strings.TrimSpace(out.String()); got != "mine\ndevices" {
		t.Fatalf("a job saw another's /dev/shm, or not its own (want \"mine\", \"devices\"):\n%s", got)
	}
	for _, u := range []string{writer, reader} {
		e.Stop(ctx, "lab", u)
		if err := e.Collect(ctx, "lab", u); err != nil {
			t.Fatal(err)
		}
	}
}

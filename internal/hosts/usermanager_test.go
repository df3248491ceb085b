package hosts

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/hosttest"
)

// An unprivileged login on a host whose units its own user manager runs
// (manager = "user", no polkit rule): a job runs as that login with its
// limits set on the unit, and neither the job nor the login itself can
// get a unit of any other uid. A job cannot reach the user manager (its
// private socket, the user bus) to start a unit outside its containment,
// neither by its path nor through another process's root (/proc/PID/root).
func TestUserManagerHost(t *testing.T) {
	h := hosttest.StartWorker(t)
	h.InstallKernel(t)
	e := labEngine(t, h, nil)
	ctx := ctxT(t)
	rt := fmt.Sprintf("/run/user/%d", h.UID)

	// The login itself: a unit of another uid is refused by its manager,
	// and the system manager does not take its units at all.
	c, err := e.conn("lab")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = c.run(ctx, `for p in User=root User=0 "User=nobody"; do
  systemd-run --user --quiet --pipe --wait --collect -p "$p" -- id -u 2>&1; echo "rc=$?"
done
command systemd-run --quiet --no-ask-password --pipe --wait --collect -- id -u 2>&1; echo "rc=$?"
`, &out)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	for _, l := range lines {
		if l == "0" || l == "65534" {
			t.Fatalf("the login got a unit of another uid:\n%s", out.String())
		}
	}
	if n := strings.Count(out.String(), "rc=0"); n != 0 {
		t.Fatalf("%d of the login's attempts at another uid or the system manager succeeded:\n%s", n, out.String())
	}
	t.Logf("the login's attempts at other uids:\n%s", out.String())

	// Jobs: both unconfined (the unit's mount namespace alone) and
	// confined (klbr-kernel's Landlock inside it).
	probe := strings.Join([]string{
		"id -u",
		"ls -A " + rt + " >/dev/null 2>&1 && echo LEAK:runtime-dir",
		"XDG_RUNTIME_DIR=" + rt + " systemd-run --user --quiet --unit=klbr-escape-$KLBR_TRY.service -- sleep 60 >/dev/null 2>&1 && echo LEAK:user-manager",
		"XDG_RUNTIME_DIR=" + rt + " systemctl --user list-units >/dev/null 2>&1 && echo LEAK:user-manager-list",
		"DBUS_SESSION_BUS_ADDRESS=unix:path=" + rt + "/bus busctl --user list >/dev/null 2>&1 && echo LEAK:user-bus",
		"for p in /proc/[0-9]*; do ls $p/root" + rt + "/systemd/private >/dev/null 2>&1 && echo LEAK:proc-root-$p && break; done",
		"echo mine > own && cat own",
	}, "\n")
	for i, confine := range []bool{false, true} {
		unit := fmt.Sprintf("klbr-job-95%d-1.service", i)
		p := probe
		if !confine {
			// Without Landlock a job may reach another process's root (the
			// same uid's); a host runs jobs only confined.
			p = strings.Replace(probe, "for p in /proc", "false && for p in /proc", 1)
		}
		if _, err := e.Start(ctx, "lab", Unit{Name: unit, Argv: []string{"sh", "-c", p}, Confine: confine,
			Env: map[string]string{"KLBR_TRY": strconv.Itoa(i)}}); err != nil {
			t.Fatal(err)
		}
		st := waitEnded(t, e, unit)
		var got strings.Builder
		if _, err := e.Output(ctx, "lab", unit, 1<<16, &got); err != nil {
			t.Fatal(err)
		}
		if code, why := st.Outcome(); code != 0 {
			t.Fatalf("confine=%v: the probe failed: %s\n%s", confine, why, got.String())
		}
		if want := fmt.Sprintf("%d\nmine", h.UID); strings.TrimSpace(got.String()) != want {
			t.Fatalf("confine=%v: the job (want only its uid %d and \"mine\"):\n%s", confine, h.UID, got.String())
		}
		props, err := h.Systemctl("show", "--property=MemoryMax,TasksMax,CPUQuotaPerSecUSec,NoNewPrivileges", "--", unit).Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"MemoryMax=268435456", "TasksMax=64", "CPUQuotaPerSecUSec=1s", "NoNewPrivileges=yes"} {
			if !strings.Contains(string(props), want+"\n") {
				t.Fatalf("the unit's properties\n%s\nlack %s", props, want)
			}
		}
		if files, err := e.ListFiles(ctx, "lab", unit); err != nil || len(files) != 1 || files[0].Path != "own" {
			t.Fatalf("confine=%v: the job's files %+v (%v), want own", confine, files, err)
		}
		if err := e.Collect(ctx, "lab", unit); err != nil {
			t.Fatal(err)
		}
	}
	// A stop ends the whole unit, what it forked too.
	const long = "klbr-job-970-1.service"
	if _, err := e.Start(ctx, "lab", Unit{Name: long, Argv: []string{"sh", "-c", "sleep 600 & sleep 600"}, Confine: true}); err != nil {
		t.Fatal(err)
	}
	if err := e.Stop(ctx, "lab", long); err != nil {
		t.Fatal(err)
	}
	if st := waitEnded(t, e, long); st.ActiveState == "active" && st.SubState != "exited" {
		t.Fatalf("stopped: %+v", st)
	}
	if out, _ := h.Enter("pgrep", "-u", strconv.Itoa(h.UID), "-x", "sleep").Output(); len(out) != 0 {
		t.Fatalf("processes of the stopped unit remain: %s", out)
	}
	if err := e.Collect(ctx, "lab", long); err != nil {
		t.Fatal(err)
	}
	// A worker's unit (Pipe): its stdin and stdout are the session's.
	cmd, err := e.Pipe(ctx, "lab", Unit{Name: "klbr-workbench-s1-1.service", Argv: []string{"sh", "-c", "id -u; cat"}})
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = strings.NewReader("over the pipe\n")
	if got, err := cmd.Output(); err != nil || string(got) != fmt.Sprintf("%d\nover the pipe\n", h.UID) {
		t.Fatalf("the piped unit said %q (%v)", got, err)
	}
	if units, err := h.Units("klbr-escape-*"); err != nil || len(units) != 0 {
		t.Fatalf("a job started units %v (%v)", units, err)
	}

	// The limits hold where the host's cgroups let the user manager
	// enforce them (cgroup v2: a memory hog is killed by it); where they
	// do not (cgroup v1, as this machine may be), the host is not ready,
	// and says why and what to do.
	info := e.Inspect(ctx, "lab")
	if info.Manager != "user" || info.UserManager == "" || !info.Lingering {
		t.Fatalf("inspect: manager %q, user manager %q, lingering %v", info.Manager, info.UserManager, info.Lingering)
	}
	t.Logf("the login's manager: systemd %s, controllers %v", info.UserManager, info.Controllers)
	limitsHold := func(ps []Problem) bool {
		for _, p := range ps {
			if strings.Contains(p.What, "cannot enforce limits") && strings.Contains(p.Fix, `manager = "system"`) {
				return false
			}
		}
		return true
	}
	if slices.Contains(info.Controllers, "memory") {
		if !limitsHold(info.Problems()) {
			t.Fatalf("controllers %v, yet: %+v", info.Controllers, info.Problems())
		}
		const hog = "klbr-job-960-1.service"
		if _, err := e.Start(ctx, "lab", Unit{Name: hog, Argv: []string{"python3", "-c", "b = bytearray(1 << 30)"}, MemoryMaxBytes: 64 << 20, Confine: true}); err != nil {
			t.Fatal(err)
		}
		if st := waitEnded(t, e, hog); st.Result != "oom-kill" {
			t.Fatalf("the hog ended %+v, want killed by the user manager (oom-kill)", st)
		}
	} else if limitsHold(info.Problems()) {
		t.Fatalf("controllers %v (no memory), yet no problem says the limits would not hold: %+v", info.Controllers, info.Problems())
	}

	// A login that does not linger is a problem, with the fix.
	if out, err := h.Enter("rm", "/var/lib/systemd/linger/"+hosttest.Worker).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	info = e.Inspect(ctx, "lab")
	if info.Lingering || !slices.ContainsFunc(info.Problems(), func(p Problem) bool {
		return strings.Contains(p.What, "does not linger") && strings.Contains(p.Fix, "loginctl enable-linger "+hosttest.Worker)
	}) {
		t.Fatalf("a login that does not linger: %+v", info.Problems())
	}
}

package kernel

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/citest"
)

// sandboxProbe is a cell's view of its sandbox: each probe prints "name ok" or
// "name ERRNAME".
const sandboxProbe = `
import errno, json, os, signal, sys
data, ws = sys.argv[1], sys.argv[2]
res = {}
def probe(name, f):
    try:
        f()
        res[name] = "ok"
    except OSError as e:
        res[name] = errno.errorcode.get(e.errno, str(e.errno))
probe("read_token", lambda: open(os.path.join(data, "operator-token")).read())
probe("open_db_rw", lambda: open(os.path.join(data, "runtime.sqlite"), "r+b").close())
probe("list_data", lambda: os.listdir(data))
probe("read_runtime", lambda: open(os.path.join(data, "runtime", "mod.py")).read())
probe("write_runtime", lambda: open(os.path.join(data, "runtime", "mod.py"), "a").close())
probe("write_workspace", lambda: open(os.path.join(ws, "out.txt"), "w").write("x"))
probe("read_etc", lambda: open("/etc/hostname").read())
probe("write_etc", lambda: open("/etc/klbr-sandbox-probe", "w").close())
probe("cgroup_procs", lambda: open("/sys/fs/cgroup/cgroup.procs", "w").write(str(os.getpid())))
probe("kill_kernel", lambda: os.kill(os.getppid(), 0))
probe("link_token", lambda: os.link(os.path.join(data, "operator-token"), os.path.join(ws, "t")))
res["uid"] = os.getuid()
print(json.dumps(res))
`

func TestSandbox(t *testing.T) {
	abi, err := LandlockABI()
	if err != nil {
		citest.SkipOrFail(t, "landlock: "+err.Error())
	}
	py := python(t)
	root := t.TempDir()
	data, ws := filepath.Join(root, "data"), filepath.Join(root, "ws")
	for _, d := range []string{filepath.Join(data, "runtime"), ws} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, body := range map[string]string{"operator-token": "s3cret", "runtime.sqlite": "db", "runtime/mod.py": "x = 1"} {
		if err := os.WriteFile(filepath.Join(data, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(t *testing.T, sb Sandbox) map[string]any {
		t.Helper()
		os.Remove(filepath.Join(ws, "t"))
		os.Remove(filepath.Join(ws, "out.txt"))
		args := append(sb.Args(), "--", py, "-S", "-c", sandboxProbe, data, ws)
		cmd := exec.Command(kernelBin, args...)
		stderr := newLogFile(t)
		cmd.Stderr = stderr.f
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("kernel: %v\n%s", err, stderr)
		}
		var res map[string]any
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("probe output %q: %v", out, err)
		}
		return res
	}

	t.Run("without", func(t *testing.T) {
		res := run(t, NoSandbox)
		// The finding: a same-user cell reaches everything.
		for _, k := range []string{"read_token", "open_db_rw", "read_runtime", "write_workspace", "kill_kernel"} {
			if res[k] != "ok" {
				t.Errorf("%s = %v without a sandbox, want ok (the baseline the sandbox changes)", k, res[k])
			}
		}
	})
	t.Run("landlock", func(t *testing.T) {
		res := run(t, Sandbox{Deny: []string{data}, ReadOnly: []string{filepath.Join(data, "runtime")}, ReadWrite: []string{ws}})
		want := map[string]string{
			"read_token": "EACCES", "open_db_rw": "EACCES", "list_data": "EACCES",
			"read_runtime": "ok", "write_runtime": "EACCES", "write_workspace": "ok",
			"read_etc": "ok", "write_etc": "EACCES",
		}
		if abi >= 6 {
			want["kill_kernel"] = "EPERM"
		}
		refused(t, res, "cgroup_procs")
		refused(t, res, "link_token")
		for k, v := range want {
			got, _ := res[k].(string)
			if got != v {
				t.Errorf("%s = %q, want %q (all: %v)", k, got, v, res)
			}
		}
	})
	t.Run("uid", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("dropping to another uid needs root")
		}
		if err := os.Chown(ws, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		for d := root; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
			os.Chmod(d, 0o755)
		}
		res := run(t, Sandbox{DropUser: true, UID: 65534, GID: 65534})
		if res["uid"] != float64(65534) {
			t.Errorf("uid = %v, want 65534", res["uid"])
		}
		// Root's own files and processes are out of reach by plain permissions.
		refused(t, res, "cgroup_procs")
		for k, v := range map[string]string{"kill_kernel": "EPERM", "write_etc": "EACCES", "write_workspace": "ok"} {
			if res[k] != v {
				t.Errorf("%s = %v, want %s (all: %v)", k, res[k], v, res)
			}
		}
	})
}

// refused checks that probe k failed with a permission error: EACCES or EPERM, or EROFS
// where the file system is mounted read-only anyway (cgroupfs in a container).
func refused(t *testing.T, res map[string]any, k string) {
	t.Helper()
	switch res[k] {
	case "EACCES", "EPERM", "EROFS", "EXDEV": // EXDEV: Landlock's refusal of a cross-directory link
	default:
		t.Errorf("%s = %v, want a refusal", k, res[k])
	}
}

// TestSandboxRootWithoutCapabilities: as root with no other uid usable, the child keeps uid
// 0 but no capability, so root's powers beyond file ownership (mount, modules, raw I/O,
// other users' files) are gone; Landlock does the rest.
func TestSandboxRootWithoutCapabilities(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	py := python(t)
	dir := t.TempDir()
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chown(other, 12345, 12345)
	args := append(Sandbox{DropCaps: true}.Args(), "--", py, "-S", "-c", `
import os, sys
st = [l for l in open("/proc/self/status") if l.startswith(("CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb"))]
print("".join(st).replace("\t", " "), end="")
try:
    open(sys.argv[1]).read(); print("read_other ok")
except PermissionError:
    print("read_other EACCES")
`, other)
	out, err := exec.Command(kernelBin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"CapInh: 0000000000000000", "CapPrm: 0000000000000000", "CapEff: 0000000000000000", "CapBnd: 0000000000000000", "CapAmb: 0000000000000000", "read_other EACCES"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("child output lacks %q:\n%s", want, out)
		}
	}
}

// TestSandboxRootWithEmptyBoundingSet: under a unit with an empty CapabilityBoundingSet=
// (root without CAP_SETPCAP), --drop-caps still starts the child, with no capability.
func TestSandboxRootWithEmptyBoundingSet(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv is not installed")
	}
	py := python(t)
	args := append([]string{"--bounding-set", "-all", "--inh-caps", "-all", "--", kernelBin}, Sandbox{DropCaps: true, Deny: []string{t.TempDir()}}.Args()...)
	args = append(args, "--", py, "-S", "-c", `print([l.split()[1] for l in open("/proc/self/status") if l.startswith(("CapEff", "CapBnd"))])`)
	out, err := exec.Command(setpriv, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(string(out), "['0000000000000000', '0000000000000000']") {
		t.Fatalf("child: %s", out)
	}
}

func TestSandboxArgs(t *testing.T) {
	sb := Sandbox{Deny: []string{"/d"}, ReadOnly: []string{"/d/r"}, ReadWrite: []string{"/w"}, DropUser: true, UID: 7, GID: 8}
	cfg, err := ParseArgs(append(sb.Args(), "--", "true"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(cfg.Sandbox.Args(), " "), strings.Join(sb.Args(), " "); got != want {
		t.Errorf("round trip: %q, want %q", got, want)
	}
	for _, bad := range [][]string{{"--deny", "rel"}, {"--uid", "3"}, {"--rw", ""}} {
		if _, err := ParseArgs(append(bad, "--", "true")); err == nil {
			t.Errorf("ParseArgs(%q) accepted", bad)
		}
	}
}

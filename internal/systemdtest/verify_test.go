package systemdtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/citest"
)

// unitDir is where the unit files are kept, as shipped.
const unitDir = "../../nix/systemd"

// units are the shipped unit files.
var units = []string{
	"klbr-core-control.socket", "klbr-core-ingress.socket", "klbr-core.service", "klbr-core.socket",
	"klbr-discord.service", "klbr.slice",
}

// binaries are the programs the units run, by the path they name; the package installing the
// units replaces these paths with its own.
var binaries = regexp.MustCompile(`/usr/bin/(klbr-core|klbr-discord)\b`)

func readUnits(t testing.TB) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(unitDir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	out := map[string]string{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(unitDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, e.Name())
		out[e.Name()] = string(b)
	}
	if !slices.Equal(names, units) {
		t.Fatalf("%s holds %v, want %v", unitDir, names, units)
	}
	return out
}

// install writes the units into dir with the binaries replaced by bin(name).
func install(t testing.TB, dir string, bin func(name string) string) {
	t.Helper()
	for name, text := range readUnits(t) {
		text = binaries.ReplaceAllStringFunc(text, func(path string) string { return bin(filepath.Base(path)) })
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// systemd-analyze verify checks the units as a service manager would load them: syntax,
// known settings, dependencies between them, and that each command is executable. The
// binaries are not installed here (klbr-discord does not exist yet), so the check runs on a
// copy whose /usr/bin/klbr-* paths name a stub; the test shows that these paths are the only
// thing verify finds wrong with the units as shipped.
func TestUnitsVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		citest.SkipOrFail(t, "systemd-analyze is missing (apt-get install -y systemd)")
	}
	dir := t.TempDir()
	stub := filepath.Join(dir, "stub")
	if err := os.WriteFile(stub, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	install(t, dir, func(string) string { return stub })
	verify := func(dir string) (string, error) {
		cmd := exec.Command(analyze, append([]string{"verify", "--man=no"}, units...)...)
		cmd.Dir = dir
		b, err := cmd.CombinedOutput()
		return string(b), err
	}
	if out, err := verify(dir); err != nil || out != "" {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}

	out, _ := verify(unitDir)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if !regexp.MustCompile(`: Command /usr/bin/klbr-(core|discord) is not executable: No such file or directory$`).MatchString(line) {
			t.Errorf("systemd-analyze verify on the shipped units: %s", line)
		}
	}
}

// What klbr-core relies on in its units, beyond what verify checks.
func TestUnitsContract(t *testing.T) {
	u := readUnits(t)
	for _, tc := range []struct {
		unit      string
		want      []string
		wantNot   []string
		execPaths int // lines naming /usr/bin/klbr-*
	}{
		{"klbr-core.socket", []string{"ListenStream=127.0.0.1:8765\n", "FileDescriptorName=http\n", "Service=klbr-core.service\n",
			"Also=klbr-core-control.socket klbr-core-ingress.socket\n"}, []string{"SocketMode="}, 0},
		{"klbr-core-control.socket", []string{"ListenStream=%t/klbr/control.sock\n", "FileDescriptorName=control\n",
			"SocketMode=0600\n", "Service=klbr-core.service\n"}, nil, 0},
		{"klbr-core-ingress.socket", []string{"ListenStream=%t/klbr/ingress.sock\n", "FileDescriptorName=ingress\n",
			"SocketMode=0660\n", "Service=klbr-core.service\n"}, nil, 0},
		{"klbr-core.service", []string{"Type=notify\n", "NotifyAccess=main\n", "KillMode=mixed\n", "WatchdogSec=",
			"TimeoutStopSec=", "StateDirectory=klbr ", "Environment=KLBR_DATA_DIR=%S/klbr\n",
			"Environment=KLBR_CONTROL_SOCKET=%t/klbr/control.sock\n", "Environment=KLBR_INGRESS_SOCKET=%t/klbr/ingress.sock\n",
			"ExecStartPre=/usr/bin/klbr-core init\n", "ExecStart=/usr/bin/klbr-core serve\n",
			"ExecReload=/usr/bin/klbr-core reload\n"},
			[]string{"[Install]", "MemoryDenyWriteExecute="}, 3},
		{"klbr-discord.service", []string{"Requires=klbr-core-ingress.socket\n", "LoadCredential=discord-token:",
			"ExecStart=/usr/bin/klbr-discord\n", "ExecReload=/bin/kill -HUP $MAINPID\n"}, nil, 1},
		{"klbr.slice", []string{"[Slice]\n"}, nil, 0},
	} {
		t.Run(tc.unit, func(t *testing.T) {
			text := settings(u[tc.unit])
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("lacks %q", w)
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(text, w) {
					t.Errorf("has %q", w)
				}
			}
			if n := len(binaries.FindAllString(text, -1)); n != tc.execPaths {
				t.Errorf("%d /usr/bin/klbr-* paths, want %d", n, tc.execPaths)
			}
		})
	}
}

// settings is a unit file without its comments.
func settings(unit string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(unit, "\n") {
		if !strings.HasPrefix(line, "#") {
			b.WriteString(line)
		}
	}
	return b.String()
}

package kernel

import (
	"slices"
	"testing"
	"time"
)

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    Config
		wantErr bool
	}{
		{"minimal", []string{"--", "python3", "-m", "klbr_runtime"},
			Config{ProtocolFD: -1, GoAheadFD: -1, Argv: []string{"python3", "-m", "klbr_runtime"}}, false},
		{"all flags", []string{"--protocol-fd", "3", "--go-ahead-fd=4", "--deadline", "90s", "--keep-env", "A", "--keep-env", "B", "--", "x", "--deadline", "1s"},
			Config{ProtocolFD: 3, GoAheadFD: 4, Deadline: 90 * time.Second, KeepEnv: []string{"A", "B"}, Argv: []string{"x", "--deadline", "1s"}}, false},
		{"argv after -- may look like flags", []string{"--", "--help"},
			Config{ProtocolFD: -1, GoAheadFD: -1, Argv: []string{"--help"}}, false},
		{"rlimits", []string{"--rlimit-as", "1048576", "--rlimit-nproc=64", "--", "x"},
			Config{ProtocolFD: -1, GoAheadFD: -1, RlimitAS: 1 << 20, RlimitNproc: 64, Argv: []string{"x"}}, false},
		{"negative rlimit", []string{"--rlimit-as", "-1", "--", "x"}, Config{}, true},
		{"missing --", []string{"python3"}, Config{}, true},
		{"empty", nil, Config{}, true},
		{"nothing after --", []string{"--"}, Config{}, true},
		{"stdio as protocol fd", []string{"--protocol-fd", "1", "--", "x"}, Config{}, true},
		{"same fd twice", []string{"--protocol-fd", "3", "--go-ahead-fd", "3", "--", "x"}, Config{}, true},
		{"negative deadline", []string{"--deadline", "-1s", "--", "x"}, Config{}, true},
		{"bad deadline", []string{"--deadline", "soon", "--", "x"}, Config{}, true},
		{"bad keep-env", []string{"--keep-env", "A=B", "--", "x"}, Config{}, true},
		{"unknown flag", []string{"--nope", "--", "x"}, Config{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseArgs(tc.args)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if got.ProtocolFD != tc.want.ProtocolFD || got.GoAheadFD != tc.want.GoAheadFD || got.Deadline != tc.want.Deadline ||
				got.RlimitAS != tc.want.RlimitAS || got.RlimitNproc != tc.want.RlimitNproc ||
				!slices.Equal(got.KeepEnv, tc.want.KeepEnv) || !slices.Equal(got.Argv, tc.want.Argv) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestFilterEnv(t *testing.T) {
	in := []string{"PATH=/bin", "SECRET=x", "KLBR_ROLE=hooks", "KLBR=no", "KLBRX=no", "PYTHONPATH=/p",
		"PYTHONHOME=/h", "EXTRA=1", "=weird", "novalue", "LD_LIBRARY_PATH=/l"}
	got := FilterEnv(in, []string{"EXTRA"})
	want := []string{"PATH=/bin", "KLBR_ROLE=hooks", "PYTHONPATH=/p", "EXTRA=1"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestParseStat(t *testing.T) {
	tests := []struct {
		in   string
		want procEntry
		ok   bool
	}{
		{"42 (sleep) S 7 42 42 0 -1", procEntry{pid: 42, ppid: 7, state: 'S'}, true},
		{"43 (a) b) (c) Z 1 43 43 0", procEntry{pid: 43, ppid: 1, state: 'Z'}, true},
		{"44 (with space) R 2 1", procEntry{pid: 44, ppid: 2, state: 'R'}, true},
		{"garbage", procEntry{}, false},
		{"45 (x)", procEntry{}, false},
	}
	for _, tc := range tests {
		got, ok := parseStat([]byte(tc.in))
		if ok != tc.ok || got != tc.want {
			t.Errorf("parseStat(%q) = %+v, %v; want %+v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestDescendants(t *testing.T) {
	procs := []procEntry{
		{pid: 1, ppid: 0}, {pid: 10, ppid: 1}, // 10 is the kernel
		{pid: 11, ppid: 10}, {pid: 12, ppid: 11}, {pid: 13, ppid: 12},
		{pid: 20, ppid: 10},                     // a reparented daemon
		{pid: 30, ppid: 1}, {pid: 31, ppid: 30}, // unrelated
	}
	var got []int
	for _, p := range descendants(procs, 10) {
		got = append(got, p.pid)
	}
	slices.Sort(got)
	if want := []int{11, 12, 13, 20}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

package config

import (
	"strings"
	"testing"
)

const hostBase = "[hosts.gpu]\nssh = \"klbr@gpu.lan\"\nidentity_file = \"/run/credentials/klbr-core.service/gpu-key\"\nknown_hosts_file = \"/var/lib/klbr/known_hosts\"\n"

func TestParseHosts(t *testing.T) {
	f, err := Parse("klbr.toml", []byte(hostBase+"labels = [\"gpu\", \"big\"]\nmax_jobs = 2\nmemory_max = \"64G\"\nwall_seconds = 7200\ndown_grace_seconds = 900\n"+
		"[jobs]\ntasks_max = 50\n\n[hosts.b]\nssh = \"u@[fd00::2]:2222\"\nidentity_file = \"/k\"\nknown_hosts_file = \"/kh\"\nwork_dir = \"/srv/klbr\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	g := f.Hosts["gpu"].Resolved(f.Jobs)
	if g.MaxJobs != 2 || g.MemoryMax != "64G" || g.TasksMax != 50 || g.CPUQuota != DefaultJobsCPUQuota || g.WallSeconds != 7200 ||
		len(g.Labels) != 2 || g.DownGraceSeconds != 900 {
		t.Fatalf("gpu resolved to %+v", g)
	}
	b := f.Hosts["b"].Resolved(f.Jobs)
	if b.MaxJobs != DefaultHostMaxJobs || b.WallSeconds != DefaultJobsWallSeconds || b.WorkDir != "/srv/klbr" {
		t.Fatalf("b resolved to %+v", b)
	}
	tg, err := ParseSSHTarget(b.SSH)
	if err != nil || tg != (SSHTarget{User: "u", Host: "fd00::2", Port: 2222}) || tg.KnownHostsName() != "[fd00::2]:2222" {
		t.Fatalf("target %+v %v", tg, err)
	}
}

func TestParseSSHTarget(t *testing.T) {
	tests := []struct {
		in   string
		want SSHTarget
		err  string
	}{
		{"klbr@gpu.lan", SSHTarget{"klbr", "gpu.lan", 22}, ""},
		{"root@10.77.0.2:2222", SSHTarget{"root", "10.77.0.2", 2222}, ""},
		{"a.b-c_d@[::1]", SSHTarget{"a.b-c_d", "::1", 22}, ""},
		{"gpu.lan", SSHTarget{}, "user@host"},
		{"@gpu.lan", SSHTarget{}, "user@host"},
		{"-oProxyCommand=x@gpu", SSHTarget{}, "must be letters"},
		{"klbr@-oProxyCommand=x", SSHTarget{}, "not a host name"},
		{"klbr@gpu lan", SSHTarget{}, "not a host name"},
		{"klbr@gpu:0", SSHTarget{}, "port"},
		{"klbr@gpu:65536", SSHTarget{}, "port"},
		{"klbr@gpu:", SSHTarget{}, "port"},
		{"klbr@gpu:+22", SSHTarget{}, "port"},
		{"klbr@[10.0.0.1]", SSHTarget{}, "not an IPv6"},
		{"klbr@[::1", SSHTarget{}, "closing"},
		{"klbr@[::1]x", SSHTarget{}, ":port"},
		{"klbr@a@b", SSHTarget{}, "not a host name"},
		{"klbr@*.lan", SSHTarget{}, "not a host name"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSSHTarget(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %+v %v, want %+v", got, err, tt.want)
			}
		})
	}
}

func TestParseHostErrors(t *testing.T) {
	tests := []struct {
		name, doc, key, msg string
		line                int
	}{
		{"no ssh", "[hosts.gpu]\nidentity_file = \"/k\"\nknown_hosts_file = \"/kh\"\n", "hosts.gpu.ssh", "required", 1},
		{"bad ssh", "[hosts.gpu]\nssh = \"gpu\"\nidentity_file = \"/k\"\nknown_hosts_file = \"/kh\"\n", "hosts.gpu.ssh", "user@host", 2},
		{"no known_hosts", "[hosts.gpu]\nssh = \"k@gpu\"\nidentity_file = \"/k\"\n", "hosts.gpu.known_hosts_file", "ssh-keyscan", 1},
		{"relative identity", "[hosts.gpu]\nssh = \"k@gpu\"\nidentity_file = \"k\"\nknown_hosts_file = \"/kh\"\n", "hosts.gpu.identity_file", "absolute", 3},
		{"bad name", strings.Replace(hostBase, "gpu]", "GPU]", 1), "hosts.GPU", "host name", 1},
		{"bad label", hostBase + "labels = [\"ok\", \"Not ok\"]\n", "hosts.gpu.labels[1]", "label", 5},
		{"label twice", hostBase + "labels = [\"a\", \"a\"]\n", "hosts.gpu.labels[1]", "twice", 5},
		{"max_jobs", hostBase + "max_jobs = -1\n", "hosts.gpu.max_jobs", "out of range", 5},
		{"memory", hostBase + "memory_max = \"lots\"\n", "hosts.gpu.memory_max", "not a size", 5},
		{"tasks", hostBase + "tasks_max = 100001\n", "hosts.gpu.tasks_max", "out of range", 5},
		{"cpu", hostBase + "cpu_quota = \"2\"\n", "hosts.gpu.cpu_quota", "CPU quota", 5},
		{"wall", hostBase + "wall_seconds = 604801\n", "hosts.gpu.wall_seconds", "out of range", 5},
		{"down grace", hostBase + "down_grace_seconds = -1\n", "hosts.gpu.down_grace_seconds", "out of range", 5},
		{"work_dir", hostBase + "work_dir = \"/\"\n", "hosts.gpu.work_dir", "below /", 5},
		{"unknown key", hostBase + "port = 22\n", "hosts.gpu.port", "unknown key", 5},
		{"agent on an unknown host", "[agent]\nhost = \"gpu\"\n", "agent.host", "no [hosts.gpu]", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("klbr.toml", []byte(tt.doc))
			errs := Errors(err)
			if len(errs) == 0 {
				t.Fatalf("accepted:\n%s", tt.doc)
			}
			e := errs[0]
			if e.Key != tt.key || !strings.Contains(e.Msg, tt.msg) || e.Line != tt.line {
				t.Fatalf("got %v (key %q line %d), want key %q line %d with %q", e, e.Key, e.Line, tt.key, tt.line, tt.msg)
			}
		})
	}
}

// A target ssh takes never reads as an option, a pattern or two words.
func FuzzParseSSHTarget(f *testing.F) {
	for _, s := range []string{"klbr@gpu.lan", "root@10.77.0.2:2222", "u@[fd00::1]:22", "-o@x", "u@-x", "u@[::1", "u@h:99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tg, err := ParseSSHTarget(s)
		if err != nil {
			return
		}
		for _, part := range []string{tg.User, tg.Host} {
			if part == "" || strings.HasPrefix(part, "-") || strings.ContainsAny(part, " \t\n*?!,@[]%'\"\\$`;|&") {
				t.Fatalf("%q parsed to %+v", s, tg)
			}
		}
		if tg.Port < 1 || tg.Port > 65535 {
			t.Fatalf("%q: port %d", s, tg.Port)
		}
	})
}

func TestAgentHost(t *testing.T) {
	f, err := Parse("klbr.toml", []byte("[agent]\nhost = \"gpu\"\n"+hostBase))
	if err != nil || f.Agent.Host != "gpu" {
		t.Fatalf("[agent] host naming a defined host: %v %q", err, f.Agent.Host)
	}
}

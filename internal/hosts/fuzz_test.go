package hosts

import (
	"archive/tar"
	"bytes"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/kernel"
)

// What a host answers to Inspect is outside input: any answer parses
// without a panic, and the units are at most one per line.
func FuzzParseInspect(f *testing.F) {
	f.Add("systemd 252 (252.39-1~deb12u1)\n\n/usr/bin/klbr-kernel\nklbr-kernel dev protocol 1\n\n2\n25769803776\nklbr-job-1-1.service loaded active running x\n")
	f.Add("\n\n\n2\n\n")
	f.Add("")
	f.Add("\n\n\n2\n\n@manager 252 yes cpu memory pids\n@manager - no\n")
	f.Fuzz(func(t *testing.T, out string) {
		var info Info
		parseInspect(&info, out)
		if len(info.Units) > strings.Count(out, "\n")+1 {
			t.Fatalf("%d units from %d lines", len(info.Units), strings.Count(out, "\n")+1)
		}
		_ = info.Problems()
	})
}

func TestParseInspect(t *testing.T) {
	var info Info
	parseInspect(&info, "systemd 252 (252.39-1~deb12u1)\n\n/usr/bin/klbr-kernel\nklbr-kernel v1.2 protocol 1\n\n2\n25769803776\nklbr-job-1-1.service loaded active running x y\n")
	if info.SystemdVersion != 252 || info.Kernel != "/usr/bin/klbr-kernel" || info.KernelVersion != "v1.2" || info.KernelProtocol != 1 ||
		info.CPUs != 2 || info.MemoryBytes != 25769803776 || len(info.Units) != 1 || info.Units[0].Sub != "running" {
		t.Fatalf("%+v", info)
	}
	info = Info{Name: "gpu", SSH: "klbr@gpu.lan", Reachable: true, Manager: "user", Kernel: "/k", KernelProtocol: kernel.Protocol, SystemdVersion: 252}
	parseInspect(&info, "systemd 252\n\n/k\n\n4\n1024\n@manager 252.39-1 yes cpu memory pids\n")
	if info.UserManager != "252.39-1" || !info.Lingering || !slices.Equal(info.Controllers, []string{"cpu", "memory", "pids"}) || len(info.Units) != 0 {
		t.Fatalf("user manager: %+v", info)
	}
	if ps := info.Problems(); len(ps) != 0 {
		t.Fatalf("a lingering login whose manager has the controllers: %+v", ps)
	}
	info.Controllers = []string{"pids"}
	if ps := info.Problems(); len(ps) != 1 || !strings.Contains(ps[0].What, "memory, cpu") || !strings.Contains(ps[0].Fix, `[hosts.gpu]`) {
		t.Fatalf("no memory or cpu controller: %+v", ps)
	}
	info = Info{Name: "gpu", SSH: "klbr@gpu.lan", Reachable: true, Manager: "user"}
	parseInspect(&info, "systemd 252\n\n/k\n\n4\n1024\n@manager - no\n")
	if ps := info.Problems(); len(ps) < 2 || !strings.Contains(ps[0].Fix, "loginctl enable-linger klbr") || !strings.Contains(ps[1].What, "does not linger") {
		t.Fatalf("no user manager: %+v", ps)
	}
	info = Info{}
	parseInspect(&info, "\n\n\n4\n1024\n")
	if info.SystemdVersion != 0 || info.Kernel != "" || info.CPUs != 4 || info.MemoryBytes != 1024 {
		t.Fatalf("nothing installed: %+v", info)
	}
}

// A unit's file listing is outside input (the job chose the names): any
// answer parses without a panic, and every path it yields is clean and
// relative.
func FuzzParseList(f *testing.F) {
	f.Add([]byte("12 out/a.txt\x000 b\x00"))
	f.Add([]byte("1 ../etc/passwd\x00"))
	f.Add([]byte("x y\x00"))
	f.Add([]byte("3 a"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		files, err := parseList(b)
		if err != nil {
			return
		}
		if len(files) > MaxListed {
			t.Fatalf("%d files", len(files))
		}
		for _, fl := range files {
			if !cleanRel(fl.Path) || fl.Size < 0 {
				t.Fatalf("listed %+v", fl)
			}
		}
	})
}

// The archive a host sends back is outside input: only the names asked
// for, only regular files, at most max bytes of each reach fn.
func FuzzReadFiles(f *testing.F) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "out/a.txt", Typeflag: tar.TypeReg, Size: 5, Mode: 0o644})
	tw.Write([]byte("hello"))
	tw.WriteHeader(&tar.Header{Name: "out/l.txt", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"})
	tw.Close()
	f.Add(buf.Bytes())
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, b []byte) {
		want := map[string]bool{"out/a.txt": true, "out/l.txt": true}
		_ = readFiles(bytes.NewReader(b), want, 16, func(name string, size int64, r io.Reader) error {
			if name != "out/a.txt" && name != "out/l.txt" {
				t.Fatalf("got %q, which was not asked for", name)
			}
			n, _ := io.Copy(io.Discard, r)
			if n > 16 {
				t.Fatalf("%d bytes past the bound", n)
			}
			return nil
		})
	})
}

func TestReadFilesRefusesWhatWasNotAskedFor(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "out/l.txt", Typeflag: tar.TypeSymlink, Linkname: "/root/.ssh/id_ed25519"})
	tw.WriteHeader(&tar.Header{Name: "../../x", Typeflag: tar.TypeReg, Size: 1})
	tw.Write([]byte("x"))
	tw.Close()
	var got []string
	err := readFiles(&buf, map[string]bool{"out/l.txt": true}, 1<<20, func(name string, _ int64, _ io.Reader) error {
		got = append(got, name)
		return nil
	})
	if err == nil || len(got) != 0 {
		t.Fatalf("got %v, %v; want the link left out and the stray name refused", got, err)
	}
}

// What a host answers to Units is outside input: any answer parses without
// a panic, into klbr unit names only, at most one a line.
func FuzzParseUnits(f *testing.F) {
	f.Add("klbr-job-1-1.service loaded active running x\nklbr-job-2-1.service loaded active exited y\n")
	f.Add("sshd.service loaded active running OpenSSH\n")
	f.Add("klbr-job-1-1.service;rm loaded active running\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, out string) {
		units := parseUnits(out)
		if len(units) > strings.Count(out, "\n")+1 {
			t.Fatalf("%d units from %d lines", len(units), strings.Count(out, "\n")+1)
		}
		for _, u := range units {
			if CheckUnitName(u.Unit) != nil {
				t.Fatalf("%q is not a klbr unit name", u.Unit)
			}
		}
	})
}

func TestParseUnits(t *testing.T) {
	got := parseUnits("klbr-job-1-1.service loaded active running x\nsshd.service loaded active running y\nklbr-job-1-1.service;x loaded a b\n")
	if len(got) != 1 || got[0] != (UnitLine{Unit: "klbr-job-1-1.service", Active: "active", Sub: "running"}) {
		t.Fatalf("%+v", got)
	}
}

// FuzzParseHandle: the forward's handle comes from the host (a session's
// output): only one /proc/PID/fd/N line is taken, nothing else.
func FuzzParseHandle(f *testing.F) {
	for _, s := range []string{"/proc/123/fd/7\n", "", "/proc/1/fd/3", "/run/user/0/bus\n", "/proc/123/fd/7\n/proc/9/fd/1\n", "/proc/0/fd/1\n", "/proc/12/root/x\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, out string) {
		p, ok := parseHandle(out)
		if ok && (!strings.HasPrefix(p, "/proc/") || strings.ContainsAny(p, "\n.") || len(p) > 32) {
			t.Fatalf("parseHandle(%q) took %q", out, p)
		}
	})
}

func TestParseHandle(t *testing.T) {
	for out, want := range map[string]string{
		"/proc/123/fd/7\n": "/proc/123/fd/7", "/proc/1/fd/3": "/proc/1/fd/3",
		"": "", "/run/user/0/bus\n": "", "/proc/123/fd/7\n/proc/9/fd/1\n": "", "/proc/0/fd/1\n": "", "/proc/12/root/x\n": "",
		"/proc/12/fd/../../1/root\n": "",
	} {
		if got, ok := parseHandle(out); got != want || ok != (want != "") {
			t.Errorf("parseHandle(%q) = %q, %v; want %q", out, got, ok, want)
		}
	}
}

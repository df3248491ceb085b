package hosts

import (
	"strings"
	"testing"
)

// What a host answers to Inspect is outside input: any answer parses
// without a panic, and the units are at most one per line.
func FuzzParseInspect(f *testing.F) {
	f.Add("systemd 252 (252.39-1~deb12u1)\n\n/usr/bin/klbr-kernel\nklbr-kernel dev protocol 1\n\n2\n25769803776\nklbr-job-1-1.service loaded active running x\n")
	f.Add("\n\n\n2\n\n")
	f.Add("")
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
	info = Info{}
	parseInspect(&info, "\n\n\n4\n1024\n")
	if info.SystemdVersion != 0 || info.Kernel != "" || info.CPUs != 4 || info.MemoryBytes != 1024 {
		t.Fatalf("nothing installed: %+v", info)
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

package kernel

import (
	"os/exec"
	"strings"
	"testing"
)

// The binary says its version and protocol, and what it says reads back;
// other lines (an older kernel's usage error, another program) do not.
func TestVersion(t *testing.T) {
	out, err := exec.Command(kernelBin, "--version").Output()
	if err != nil {
		t.Fatalf("klbr-kernel --version: %v", err)
	}
	line := strings.TrimSpace(string(out))
	if line != VersionLine() {
		t.Fatalf("printed %q, want %q", line, VersionLine())
	}
	if _, p, ok := ParseVersionLine(line); !ok || p != Protocol {
		t.Fatalf("parse %q: protocol %d ok %v", line, p, ok)
	}
	for _, bad := range []string{"", "klbr-kernel: usage: flag provided but not defined: -version",
		"klbr-kernel dev protocol x", "klbr-kernel dev protocol 0", "klbr-kernel dev protocol 1 extra", "other dev protocol 1"} {
		if _, _, ok := ParseVersionLine(bad); ok {
			t.Errorf("%q read as a version line", bad)
		}
	}
}

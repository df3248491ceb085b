// Package nix_test checks the deployment artifacts under nix/ and flake.nix:
// that every .nix file parses, that the NixOS module evaluates (where a
// nixpkgs lib is at hand), that package.nix's vendorHash is the hash of what
// `go mod vendor` produces, that the flake pins a nixpkgs with the Go that
// go.mod asks for, and that the Grafana dashboard queries only metrics the
// daemon exposes.
package nix_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// inCI reports whether a missing tool must fail the test instead of skipping
// it (DESIGN.md §9: CI cannot pass by skipping).
func inCI() bool { return os.Getenv("CI") == "true" }

// requireTool returns the path of a command the test needs. Where it is
// missing the test is skipped with the Debian package that brings it, or,
// under CI=true, fails.
func requireTool(t *testing.T, name, debianPackage string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	msg := name + " not found (Debian: apt-get install -y " + debianPackage + ")"
	if inCI() {
		t.Fatal(msg + "; CI=true, so a missing tool is a failure")
	}
	t.Skip(msg)
	return ""
}

// repoRoot is the repository's top directory (this file lives in nix/).
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test source")
	}
	return filepath.Dir(filepath.Dir(file))
}

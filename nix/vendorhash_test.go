package nix_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

var vendorHashLine = regexp.MustCompile(`(?m)^\s*vendorHash = "(sha256-[A-Za-z0-9+/]{43}=)";`)

// TestVendorHash recomputes buildGoModule's vendorHash: the NAR hash of
// what `go mod vendor` writes for this go.mod, go.sum and the imports of
// every package and test in the module (buildGoModule's goModules
// derivation runs exactly `go mod vendor` and copies vendor/ to $out). A new
// dependency, or a new import of a package of an existing one, changes it;
// this test then prints the value to put in nix/package.nix. Like
// package.nix, it completes the vendor tree with nix/vendor-cgo.sh first.
func TestVendorHash(t *testing.T) {
	root := repoRoot(t)
	pkg, err := os.ReadFile(filepath.Join(root, "nix", "package.nix"))
	if err != nil {
		t.Fatal(err)
	}
	m := vendorHashLine.FindSubmatch(pkg)
	if m == nil {
		t.Fatal(`nix/package.nix has no line vendorHash = "sha256-…";`)
	}
	want := string(m[1])

	out := filepath.Join(t.TempDir(), "vendor")
	cmd := exec.Command("go", "mod", "vendor", "-o", out)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go mod vendor: %v\n%s", err, b)
	}
	// package.nix's modPostBuild: the C sources cgo packages include from
	// outside their own directories (tree-sitter's), which `go mod vendor` leaves out.
	cmd = exec.Command("bash", filepath.Join(root, "nix", "vendor-cgo.sh"), out)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nix/vendor-cgo.sh: %v\n%s", err, b)
	}
	got, err := narHashSRI(out)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("nix/package.nix has vendorHash = %q, but `go mod vendor` now hashes to %q:\n"+
			"set vendorHash = \"%s\"; in nix/package.nix (a dependency or an import changed)", want, got, got)
	}
}

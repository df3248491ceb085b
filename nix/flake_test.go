package nix_test

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func readFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestFlakeLockPinsNixpkgs checks flake.lock's shape: nixpkgs locked to a
// GitHub revision with a narHash, following flake.nix's input. (That the
// revision and hash are real, and where they were copied from, is in
// docs/deploy.md; no test here can fetch nixpkgs.)
func TestFlakeLockPinsNixpkgs(t *testing.T) {
	var lock struct {
		Nodes map[string]struct {
			Inputs map[string]any `json:"inputs"`
			Locked struct {
				LastModified int64  `json:"lastModified"`
				NarHash      string `json:"narHash"`
				Owner        string `json:"owner"`
				Repo         string `json:"repo"`
				Rev          string `json:"rev"`
				Type         string `json:"type"`
			} `json:"locked"`
			Original struct {
				Owner string `json:"owner"`
				Repo  string `json:"repo"`
				Ref   string `json:"ref"`
				Type  string `json:"type"`
			} `json:"original"`
		} `json:"nodes"`
		Root    string `json:"root"`
		Version int    `json:"version"`
	}
	if err := json.Unmarshal([]byte(readFile(t, "flake.lock")), &lock); err != nil {
		t.Fatalf("flake.lock: %v", err)
	}
	if lock.Version != 7 || lock.Root != "root" {
		t.Errorf("flake.lock version %d root %q, want 7 and root", lock.Version, lock.Root)
	}
	name, _ := lock.Nodes[lock.Root].Inputs["nixpkgs"].(string)
	n, ok := lock.Nodes[name]
	if !ok {
		t.Fatalf("flake.lock: the root's nixpkgs input names no node")
	}
	l := n.Locked
	if l.Type != "github" || l.Owner != "NixOS" || l.Repo != "nixpkgs" {
		t.Errorf("nixpkgs is locked to %s:%s/%s, want github:NixOS/nixpkgs", l.Type, l.Owner, l.Repo)
	}
	if !regexp.MustCompile(`^[0-9a-f]{40}$`).MatchString(l.Rev) {
		t.Errorf("locked rev %q is not a commit id", l.Rev)
	}
	sum, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(l.NarHash, "sha256-"))
	if !strings.HasPrefix(l.NarHash, "sha256-") || err != nil || len(sum) != 32 {
		t.Errorf("narHash %q is not a SHA-256 SRI hash", l.NarHash)
	}
	if l.LastModified < 1767225600 { // 2026-01-01: Go 1.26 is not in nixpkgs before that
		t.Errorf("lastModified %d predates Go 1.26 in nixpkgs", l.LastModified)
	}
	url := "github:" + n.Original.Owner + "/" + n.Original.Repo + "/" + n.Original.Ref
	if n.Original.Type != "github" || !strings.Contains(readFile(t, "flake.nix"), `inputs.nixpkgs.url = "`+url+`"`) {
		t.Errorf("flake.lock follows %s, which is not flake.nix's nixpkgs input", url)
	}
}

// TestGoVersionMatchesNix: the Go that builds the package and the dev
// shell's is the minor version go.mod asks for (client_golang v1.25 needs
// go 1.26), so a go.mod bump tells whoever makes it what else to move.
func TestGoVersionMatchesNix(t *testing.T) {
	m := regexp.MustCompile(`(?m)^go (1)\.(\d+)(\.\d+)?$`).FindStringSubmatch(readFile(t, "go.mod"))
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	minor := m[1] + m[2]
	if want := "buildGo" + minor + "Module"; !strings.Contains(readFile(t, "nix/package.nix"), want) {
		t.Errorf("go.mod says go %s.%s: build with %s in nix/package.nix (and pin a nixpkgs that has it in flake.lock)", m[1], m[2], want)
	}
	if want := "pkgs.go_" + m[1] + "_" + m[2]; !strings.Contains(readFile(t, "flake.nix"), want) {
		t.Errorf("go.mod says go %s.%s: the dev shell in flake.nix should have %s", m[1], m[2], want)
	}
}

// TestPackageBuildsEveryCommand: every cmd/ directory is a subPackage, and
// the bundled SQLite is never swapped for the system's.
func TestPackageBuildsEveryCommand(t *testing.T) {
	pkg := readFile(t, "nix/package.nix")
	entries, err := os.ReadDir(filepath.Join(repoRoot(t), "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && !strings.Contains(pkg, `"cmd/`+e.Name()+`"`) {
			t.Errorf("nix/package.nix does not build cmd/%s", e.Name())
		}
	}
	if strings.Contains(pkg, `"libsqlite3"`) {
		t.Error("nix/package.nix builds with the libsqlite3 tag: klbr-core must link its bundled SQLite (DESIGN.md §3)")
	}
	if !strings.Contains(pkg, `CGO_ENABLED = "1"`) {
		t.Error("nix/package.nix does not enable cgo (mattn/go-sqlite3 needs it)")
	}
}

// TestUnitsRunPackagedBinaries: every program the shipped units run is a
// /usr/bin/klbr-* path (which package.nix rewrites to the package's bin/)
// naming a command this repository builds, or /bin/kill (klbr-discord's
// ExecReload=: a system's own; the NixOS module, where there is none,
// replaces it with coreutils', which module_test.go holds it to).
func TestUnitsRunPackagedBinaries(t *testing.T) {
	dir := filepath.Join(repoRoot(t), "nix", "systemd")
	units, err := filepath.Glob(filepath.Join(dir, "*.service"))
	if err != nil || len(units) == 0 {
		t.Skipf("no unit files in nix/systemd yet (%v)", err)
	}
	execLine := regexp.MustCompile(`(?m)^Exec[A-Za-z]*=[-@:+!]*(\S+)`)
	for _, u := range units {
		text, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range execLine.FindAllStringSubmatch(string(text), -1) {
			prog := m[1]
			if prog == "/bin/kill" && filepath.Base(u) == "klbr-discord.service" {
				continue
			}
			cmd, ok := strings.CutPrefix(prog, "/usr/bin/")
			if !ok || !strings.HasPrefix(cmd, "klbr-") {
				t.Errorf("%s runs %s: package.nix only rewrites /usr/bin/klbr-* to the package", filepath.Base(u), prog)
				continue
			}
			if _, err := os.Stat(filepath.Join(repoRoot(t), "cmd", cmd)); err != nil && cmd != "klbr-discord" {
				t.Errorf("%s runs %s, but there is no cmd/%s", filepath.Base(u), prog, cmd)
			}
		}
	}
}

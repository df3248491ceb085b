package nix_test

import (
	"bytes"
	"io/fs"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// nixFiles lists the repository's .nix files.
func nixFiles(t *testing.T) []string {
	t.Helper()
	root := repoRoot(t)
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".nix") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestNixFilesParse runs nix-instantiate --parse on every .nix file.
func TestNixFilesParse(t *testing.T) {
	ni := requireTool(t, "nix-instantiate", "nix-bin")
	files := nixFiles(t)
	for _, want := range []string{"flake.nix", "nix/package.nix", "nix/module.nix", "nix/worker.nix", "nix/home.nix", "nix/settings.nix", "nix/test.nix"} {
		found := false
		for _, f := range files {
			found = found || strings.HasSuffix(f, "/"+want)
		}
		if !found {
			t.Errorf("%s is missing", want)
		}
	}
	for _, f := range files {
		cmd := exec.Command(ni, "--parse", f)
		cmd.Env = nixEnv()
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = nil, &stderr
		if err := cmd.Run(); err != nil {
			t.Errorf("nix-instantiate --parse %s: %v\n%s", f, err, stderr.String())
		}
	}
}

// TestVMTestScriptCompiles evaluates nix/test.nix's testScript (it needs
// nothing from nixpkgs) and compiles it as Python, so a quoting slip in the
// Nix string shows here, not after a VM has booted.
func TestVMTestScriptCompiles(t *testing.T) {
	ni := requireTool(t, "nix-instantiate", "nix-bin")
	python := requireTool(t, "python3", "python3")
	expr := "(import " + filepath.Join(repoRoot(t), "nix", "test.nix") + " { self = { }; }).testScript"
	cmd := exec.Command(ni, "--eval", "--strict", "--json", "-E", expr)
	cmd.Env = nixEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	script, err := cmd.Output()
	if err != nil {
		t.Fatalf("evaluate the testScript: %v\n%s", err, stderr.String())
	}
	py := exec.Command(python, "-c", "import json, sys; compile(json.load(sys.stdin), 'testScript', 'exec')")
	py.Stdin = bytes.NewReader(script)
	if out, err := py.CombinedOutput(); err != nil {
		t.Fatalf("the VM testScript is not valid Python: %v\n%s", err, out)
	}
}

package doctor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// doctor runs the workers' interpreter on the runtime as a worker does: the
// embedded runtime imports; a KLBR_RUNTIME_DIR whose package does not
// import is a failure that names Python's error.
func TestDoctorImportsTheRuntime(t *testing.T) {
	broken := t.TempDir()
	pkg := filepath.Join(broken, "src", "klbr_runtime")
	if err := os.MkdirAll(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"__init__.py": "import klbr_no_such_module\n", "__main__.py": ""} {
		if err := os.WriteFile(filepath.Join(pkg, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, runtimeDir string
		ok               bool
		want             string
	}{
		{"embedded", "", true, "imports the embedded runtime as a worker does"},
		{"broken KLBR_RUNTIME_DIR", broken, false, "No module named 'klbr_no_such_module'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"HOME": t.TempDir(), "KLBR_DATA_DIR": t.TempDir(), "KLBR_RUNTIME_DIR": tc.runtimeDir}
			r := Run(context.Background(), func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" }, Options{})
			var got *Check
			for i, c := range r.Checks {
				if c.Name == "runtime" {
					got = &r.Checks[i]
				}
			}
			if got == nil {
				t.Fatalf("no runtime check in %+v", r.Checks)
			}
			if got.OK != tc.ok || !strings.Contains(got.Detail, tc.want) {
				t.Fatalf("runtime check %+v; want ok=%t and %q", *got, tc.ok, tc.want)
			}
		})
	}
}

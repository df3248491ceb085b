package pyenv

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/workertest"
)

func TestParse(t *testing.T) {
	reqs, err := Parse([]byte(`{"requires": ["zeta==1.0", "alpha_pkg==0.1"]}`))
	if err != nil || strings.Join(reqs, ",") != "alpha_pkg==0.1,zeta==1.0" {
		t.Fatalf("%v %v", reqs, err)
	}
	for _, bad := range []string{`{"requires": ["numpy"]}`, `{"requires": ["a>=1"]}`, `{"requires": ["a==1", "A==2"]}`,
		`{"other": 1}`, `{"requires": ["a==1; os_name=='nt'"]}`, `[]`} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"requires": ["tinypkg==0.1"]}`))
	f.Add([]byte(`{"requires": []}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		reqs, err := Parse(b)
		if err == nil && len(reqs) > MaxRequires {
			t.Fatal("over bound")
		}
	})
}

// A tiny local package is staged from the wheel directory into an
// environment of its own, importable from there only; without the wheel,
// staging fails saying where wheels go.
func TestStageFromLocalWheels(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		citest.SkipOrFail(t, "python3 is not installed")
	}
	if exec.Command(py, "-m", "pip", "--version").Run() != nil {
		citest.SkipOrFail(t, "pip is not installed for python3")
	}
	data := t.TempDir()
	e := Envs{Root: filepath.Join(data, "runtime", "envs"), Wheels: filepath.Join(data, "wheels"), Python: py}
	reqs := []string{"tinypkg==0.1"}
	if _, err := e.Path(reqs); err == nil {
		t.Fatal("an environment before staging")
	}
	if _, err := e.Stage(context.Background(), reqs); err == nil || !strings.Contains(err.Error(), e.Wheels) {
		t.Fatalf("staging without wheels: %v", err)
	}
	os.MkdirAll(e.Wheels, 0o755)
	if _, err := workertest.WriteWheel(e.Wheels, "tinypkg", "0.1", map[string]string{"tinypkg/__init__.py": "ANSWER = 42\n"}); err != nil {
		t.Fatal(err)
	}
	site, err := e.Stage(context.Background(), reqs)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := e.Path(reqs); err != nil || p != site {
		t.Fatalf("path %q %v, staged %q", p, err, site)
	}
	out, err := exec.Command(py, "-s", "-c", "import tinypkg; print(tinypkg.ANSWER, tinypkg.__file__)").CombinedOutput()
	if err == nil {
		t.Fatalf("tinypkg is importable from the live environment: %s", out)
	}
	cmd := exec.Command(py, "-s", "-c", "import tinypkg; print(tinypkg.ANSWER, tinypkg.__file__)")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+site)
	out, err = cmd.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "42 "+site) {
		t.Fatalf("from the staged environment: %s %v", out, err)
	}
	if _, err := e.Stage(context.Background(), []string{"missing==1.0"}); err == nil || !strings.Contains(err.Error(), "missing==1.0") {
		t.Fatalf("a requirement with no wheel: %v", err)
	}
}

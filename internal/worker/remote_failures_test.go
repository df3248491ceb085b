package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/hosts"
)

// A host whose klbr-kernel is older than this klbr-core's protocol (or
// says no protocol at all) refuses the workbench at once, with the host's
// version and the fix: not after the handshake's timeout, and with no unit
// left behind.
func TestRemoteWorkbenchOldKernel(t *testing.T) {
	h, e := remoteLab(t)
	tree, err := hosts.PackTree(env.Runtime)
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct{ name, version, want string }{
		{"older protocol", "klbr-kernel 0.9.1 protocol 2", "klbr-kernel 0.9.1 speaks protocol 2"},
		{"no version", "", "does not say its protocol"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := "#!/bin/sh\nif [ \"$1\" = --version ]; then printf '%s\\n' '" + tc.version + "'; exit 0; fi\n" +
				"echo 'flag provided but not defined: -listen' >&2\nexit 64\n"
			if err := os.WriteFile(filepath.Join(h.BinDir, "klbr-kernel"), []byte(old), 0o755); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			src, _, err := e.PutTree(ctx, "lab", tree)
			if err != nil {
				t.Fatal(err)
			}
			store, err := artifacts.New(filepath.Join(t.TempDir(), "artifacts"))
			if err != nil {
				t.Fatal(err)
			}
			gen := int64(i + 1)
			w, err := Start(ctx, Spec{Role: RoleWorkbench, Session: "s1", Generation: gen,
				Kernel: "klbr-kernel", Python: "python3", RuntimeSrc: src, Artifacts: store, Handshake: 30 * time.Second,
				Remote: hosts.WorkerUnit{Engine: e, Host: "lab", Name: hosts.WorkerUnitName(RoleWorkbench, "s1", gen)}})
			if err == nil {
				w.Kill()
				t.Fatal("a workbench started on a host whose klbr-kernel speaks another protocol")
			}
			msg := err.Error()
			if !errors.Is(err, hosts.ErrKernelProtocol) || !strings.Contains(msg, tc.want) ||
				!strings.Contains(msg, "install the same klbr release on the host") || strings.Contains(msg, "hello") {
				t.Fatalf("the refusal says %q; want %q, the fix, and no handshake timeout", msg, tc.want)
			}
			t.Log(msg)
			if units, err := h.Units("klbr-workbench-*"); err != nil || len(units) != 0 {
				t.Fatalf("units on the host after the refusal: %v %v", units, err)
			}
		})
	}
}

// A remote worker that dies leaves its last words (its stderr, in its
// unit's output file on the host) where a local worker's go: in the dead
// cell's outcome and the worker's diagnostics. The file is the cell's to
// write: one it replaced with a link to a file out of its reach (another
// job's) is not read through the link.
func TestRemoteWorkbenchLastWords(t *testing.T) {
	h, e := remoteLab(t)
	w, _ := startRemote(t, e, 1)
	o := run(t, w, "e1", "import os\nos.write(2, b'last words: the reactor is on fire\\n')\nos._exit(3)")
	if !o.Reset || o.Error == nil || !strings.Contains(o.Error.Message, "the reactor is on fire") {
		t.Fatalf("the dead cell's outcome does not carry the worker's last words: %+v %+v", o, o.Error)
	}
	if !strings.Contains(w.Diagnostics(), "the reactor is on fire") {
		t.Fatalf("the worker's diagnostics do not carry its last words:\n%s", w.Diagnostics())
	}

	other := filepath.Join(h.WorkDir, "klbr-job-9-1.service")
	if err := os.MkdirAll(other, 0o700); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(other, "secret")
	if err := os.WriteFile(secret, []byte("s3cr3t of another job\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	w2, _ := startRemote(t, e, 2)
	o = run(t, w2, "e2", fmt.Sprintf("import os\nos.write(2, b'swapping\\n')\nos.unlink('output')\nos.symlink(%q, 'output')\nos._exit(4)", secret))
	if !o.Reset || o.Error == nil {
		t.Fatalf("the cell did not end its worker: %+v", o)
	}
	if strings.Contains(o.Error.Message, "s3cr3t") || strings.Contains(w2.Diagnostics(), "s3cr3t") {
		t.Fatalf("the last words were read through the cell's link to another job's file:\n%s\n%s", o.Error.Message, w2.Diagnostics())
	}
}

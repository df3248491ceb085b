package worker

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/hosts"
)

// A worker given a workspace on the host (a child's copy) works there: its
// cwd and KLBR_WORKSPACE are the copy, which it may write; another copy on
// the same host (another child's, the same login uid) is out of its reach,
// as are the work root and the tree cache's contents for writing. The copy
// outlives the generation, reads back as a tar, and goes when removed; a
// copy of a name that exists is refused.
func TestRemoteWorkbenchInACopy(t *testing.T) {
	h, e := remoteLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "notes.txt"), []byte("base\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tree, err := hosts.PackTree(src)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.PutTree(ctx, "lab", tree); err != nil {
		t.Fatal(err)
	}
	mine, err := e.MakeWorkspace(ctx, "lab", "klbr-ws-mine", tree.Hash)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := e.MakeWorkspace(ctx, "lab", "klbr-ws-theirs", tree.Hash)
	if err != nil {
		t.Fatal(err)
	}
	if mine != filepath.Join(h.WorkDir, "klbr-ws-mine") {
		t.Fatalf("the copy is at %s", mine)
	}
	if _, err := e.MakeWorkspace(ctx, "lab", "klbr-ws-mine", tree.Hash); err == nil || !strings.Contains(err.Error(), "exists already") {
		t.Fatalf("a second copy of the same name: %v", err)
	}
	if err := os.WriteFile(filepath.Join(theirs, "secret"), []byte("theirs"), 0o600); err != nil {
		t.Fatal(err)
	}
	rt, err := hosts.PackTree(env.Runtime)
	if err != nil {
		t.Fatal(err)
	}
	rtDir, _, err := e.PutTree(ctx, "lab", rt)
	if err != nil {
		t.Fatal(err)
	}
	store, err := artifacts.New(filepath.Join(t.TempDir(), "artifacts"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := Start(ctx, Spec{Role: RoleWorkbench, Session: "child-7", Generation: 1,
		Kernel: "klbr-kernel", Python: "python3", RuntimeSrc: rtDir, Artifacts: store, Workspace: mine,
		Remote: hosts.WorkerUnit{Engine: e, Host: "lab", Name: hosts.WorkerUnitName(RoleWorkbench, "child-7", 1), Workspace: "klbr-ws-mine"}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Kill()
	probe := fmt.Sprintf(`import os
def tryit(f):
    try:
        f()
        return "ok"
    except OSError:
        return "denied"
print("cwd", os.getcwd())
print("env", os.environ["KLBR_WORKSPACE"])
print("read", open("notes.txt").read().strip())
print("own", tryit(lambda: open("notes.txt", "a").write("child\n")))
print("theirs-read", tryit(lambda: open(%q).read()))
print("theirs-write", tryit(lambda: open(%q, "w").write("x")))
print("root", tryit(lambda: open(%q, "w").write("x")))
`, filepath.Join(theirs, "secret"), filepath.Join(theirs, "planted"), filepath.Join(h.WorkDir, "planted"))
	o := run(t, w, "p1", probe)
	for _, want := range []string{"cwd " + mine, "env " + mine, "read base", "own ok", "theirs-read denied", "theirs-write denied", "root denied"} {
		if !strings.Contains(text(o), want) {
			t.Fatalf("in the copy on the host: want %q in\n%s\n%s", want, text(o), w.Diagnostics())
		}
	}
	w.Kill()
	// The generation's unit is gone; the copy is not.
	var buf bytes.Buffer
	if err := e.ReadWorkspace(ctx, "lab", "klbr-ws-mine", &buf); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	tr := tar.NewReader(&buf)
	for {
		hd, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got[hd.Name] = string(b)
	}
	if got["./notes.txt"] != "base\nchild\n" {
		t.Fatalf("the copy read back: %v", got)
	}
	if err := e.RemoveWorkspace(ctx, "lab", "klbr-ws-mine"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(mine); err == nil {
		t.Fatal("the removed copy is still on the host")
	}
	if _, err := e.MakeWorkspace(ctx, "lab", "../escape", tree.Hash); err == nil {
		t.Fatal("a workspace name that climbs out was taken")
	}
}

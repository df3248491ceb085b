package activation

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/uidtest"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
	"github.com/klbr-dev/klbr/internal/workertest"
)

// swapOnOpen watches dir with inotify and, when its subdirectory sub is
// opened (the publish lists it next), replaces sub/zz.md by a link to
// target. The returned func waits for the swap and stops the watch.
func swapOnOpen(t *testing.T, dir, sub, target string) func() bool {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatalf("inotify: %v", err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_OPEN); err != nil {
		unix.Close(fd)
		t.Fatalf("inotify watch: %v", err)
	}
	f := os.NewFile(uintptr(fd), "inotify")
	swapped := make(chan bool, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := f.Read(buf)
			if err != nil {
				swapped <- false
				return
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				mask := binary.NativeEndian.Uint32(buf[off+4:])
				size := int(binary.NativeEndian.Uint32(buf[off+12:]))
				name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+size]), "\x00")
				off += unix.SizeofInotifyEvent + size
				if mask&unix.IN_ISDIR != 0 && name == sub {
					zz := filepath.Join(dir, sub, "zz.md")
					os.Remove(zz)
					os.Symlink(target, zz)
					swapped <- true
					return
				}
			}
		}
	}()
	return func() bool {
		select {
		case ok := <-swapped:
			f.Close()
			return ok
		case <-time.After(5 * time.Second):
			f.Close()
			return <-swapped
		}
	}
}

// The copy attack on behavior.publish: a cell swaps a file of its draft
// for a link to a secret of klbr-core's after the host listed the
// directory; the published release (which the cell can read) must never
// hold the secret. 10 runs.
func TestPublishRaceSwapsAFileForALink(t *testing.T) { publishRace(t) }

// TestPublishRaceSwapsAFileForALinkUnprivilegedChild is klbr-core as an
// unprivileged uid; its drafts, and so the swap, are of its uid.
func TestPublishRaceSwapsAFileForALinkUnprivilegedChild(t *testing.T) {
	uidtest.Child(t, "TestPublishRaceSwapsAFileForALinkUnprivileged")
	publishRace(t)
}

// TestPublishRaceSwapsAFileForALink with klbr-core as an unprivileged uid
// (uidtest.Host, no capability): the secret is its own 0600 file.
func TestPublishRaceSwapsAFileForALinkUnprivileged(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		citest.SkipOrFail(t, "git is not installed")
	}
	uidtest.Run(t, "TestPublishRaceSwapsAFileForALinkUnprivilegedChild", uidtest.Host, uidtest.Host, workertest.Share(t)...)
}

func publishRace(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		citest.SkipOrFail(t, "git is not installed")
	}
	f := newFixture(t, 2*time.Second)
	ctx := context.Background()
	base := f.publishTree(t, map[string]string{"klbr_hooks/__init__.py": allowHooks})
	if _, err := f.svc.Boot(ctx, "s", base); err != nil {
		t.Fatal(err)
	}
	secretFile := filepath.Join(t.TempDir(), "operator-token")
	secret := []byte(fmt.Sprintf("secret-%d", time.Now().UnixNano()))
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	o := NewOps(f.svc, filepath.Join(t.TempDir(), "drafts"))
	swaps, leaked := 0, 0
	for run := range 10 {
		d := opCall(t, o, "behavior.draft", map[string]any{})
		path := d["path"].(string)
		os.Mkdir(filepath.Join(path, "notes"), 0o755)
		for i := range 200 {
			os.WriteFile(filepath.Join(path, "notes", fmt.Sprintf("f%03d-%d.md", i, run)), []byte("note\n"), 0o644)
		}
		os.WriteFile(filepath.Join(path, "notes", "zz.md"), []byte("harmless\n"), 0o644)
		wait := swapOnOpen(t, path, "notes", secretFile)
		b, _ := json.Marshal(map[string]any{"draft": d["draft"]})
		out, err := o.HandleRequest(workbench.WithSession(ctx, "s"), worker.Request{Op: "behavior.publish", Args: b})
		if wait() {
			swaps++
		}
		if err != nil {
			continue // refused: safe
		}
		var pub map[string]any
		json.Unmarshal(out, &pub)
		tree := f.rel.Tree(pub["release"].(string))
		filepath.WalkDir(tree, func(p string, de fs.DirEntry, err error) error {
			if err == nil && de.Type().IsRegular() {
				if b, _ := os.ReadFile(p); bytes.Contains(b, secret) {
					leaked++
					t.Errorf("run %d: the release holds the secret at %s", run, strings.TrimPrefix(p, tree))
				}
			}
			return nil
		})
	}
	if swaps == 0 {
		t.Fatal("the swap never happened: the test proves nothing")
	}
	if leaked > 0 {
		t.Errorf("%d of 10 releases hold the secret", leaked)
	}
}

// A draft's tree is found by its id beneath the drafts, never through a
// link (a cell that may write the drafts directory could point one, or
// draft.json's path, at a tree of klbr-core's).
func TestPublishFollowsNoLinkToTheTree(t *testing.T) {
	f := newFixture(t, 2*time.Second)
	ctx := context.Background()
	base := f.publishTree(t, map[string]string{"klbr_hooks/__init__.py": allowHooks})
	if _, err := f.svc.Boot(ctx, "s", base); err != nil {
		t.Fatal(err)
	}
	o := NewOps(f.svc, filepath.Join(t.TempDir(), "drafts"))
	d := opCall(t, o, "behavior.draft", map[string]any{})
	path := d["path"].(string)
	elsewhere := filepath.Join(t.TempDir(), "tree")
	if err := os.Rename(path, elsewhere); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(elsewhere, "instructions.md"), []byte("from elsewhere\n"), 0o644)
	if err := os.Symlink(elsewhere, path); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]any{"draft": d["draft"]})
	_, err := o.HandleRequest(workbench.WithSession(ctx, "s"), worker.Request{Op: "behavior.publish", Args: b})
	var re *worker.RequestError
	if !errors.As(err, &re) || !strings.Contains(re.Message, "symbolic link") {
		t.Fatalf("publish through a link: %v, want refused", err)
	}
}

// draft.json lies where a cell may write (the drafts directory is the
// workers'): it is read and written beneath the drafts with no link
// followed, and the id it names is not trusted as a path.
func TestDraftRecordFollowsNoLink(t *testing.T) {
	f := newFixture(t, 2*time.Second)
	drafts := filepath.Join(t.TempDir(), "drafts")
	o := NewOps(f.svc, drafts)
	outside := t.TempDir()
	os.MkdirAll(filepath.Join(drafts, "real"), 0o755)
	os.WriteFile(filepath.Join(outside, "draft.json"), []byte(`{"draft":"d1","path":"/etc"}`), 0o600)
	if err := os.Symlink(outside, filepath.Join(drafts, "d1")); err != nil {
		t.Fatal(err)
	}
	if rec, err := o.readDraft("d1"); err == nil {
		t.Fatalf("read a draft record through a link: %+v", rec)
	}
	os.WriteFile(filepath.Join(drafts, "real", "draft.json"), []byte(`{"draft":"../../escape","path":"/etc"}`), 0o600)
	rec, err := o.readDraft("real")
	if err != nil {
		t.Fatal(err)
	}
	if rec.ID != "real" {
		t.Fatalf("the record's own id %q was taken", rec.ID)
	}
	rec.ID = "d1"
	if err := o.writeDraft(rec); err == nil {
		t.Fatal("wrote a draft record through a link")
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "draft.json")); !strings.Contains(string(b), `"/etc"`) {
		t.Fatalf("the file outside was overwritten: %s", b)
	}
	rec.ID = "../escape"
	if err := o.writeDraft(rec); err == nil {
		t.Fatal("wrote a draft record outside the drafts")
	}
}

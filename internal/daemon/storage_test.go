package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/citest"
	"github.com/klbr-dev/klbr/internal/modeltest"
	"github.com/klbr-dev/klbr/internal/setup"
	"github.com/klbr-dev/klbr/internal/store"
)

// smallDataDir mounts a tmpfs of size bytes and initializes a data
// directory on it.
func smallDataDir(t *testing.T, size int) (string, []string) {
	t.Helper()
	root := shortDir(t)
	data := filepath.Join(root, "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", data, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		citest.SkipOrFail(t, fmt.Sprintf("cannot mount a tmpfs (needs root or CAP_SYS_ADMIN): %v", err))
	}
	t.Cleanup(func() { syscall.Unmount(data, syscall.MNT_DETACH) })
	if _, err := setup.Init(t.Context(), data); err != nil {
		t.Fatal(err)
	}
	return data, []string{"KLBR_DATA_DIR=" + data, "KLBR_WORKSPACE=" + root, "KLBR_BIND_ADDR=127.0.0.1:0"}
}

// fill writes a file in dir until the file system is full.
func fill(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return path
			}
			t.Fatal(err)
		}
	}
}

// A data directory on a small tmpfs fills up: send fails with a clear
// error and acknowledges nothing; status and /metrics show the fault; once
// space is freed the next send works without a restart, every earlier
// acknowledged input is still there, a storage notice says what happened,
// and the agent answers when started.
func TestStorageFullAndFreed(t *testing.T) {
	requirePython(t)
	data, env := smallDataDir(t, 48<<20)
	model := modeltest.New()
	defer model.Close()
	model.Otherwise(func(int) modeltest.Reply {
		return modeltest.Reply{Calls: []modeltest.Call{{Code: "await local.send('all here')\nawait runtime.wait(None)"}}}
	})
	a := startAgentAt(t, model, "", "", data, env)
	if _, err := a.c.StopSession(t.Context(), "default"); err != nil {
		t.Fatal(err)
	}
	var acked []string
	for i := range 3 {
		a.send(fmt.Sprintf("early %d ", i))
		acked = append(acked, fmt.Sprintf("early %d ", i))
	}
	filler := fill(t, data)
	big := strings.Repeat("x", 30000)
	var failure error
	for i := range 400 {
		text := fmt.Sprintf("input %d %s", i, big)
		_, err := a.c.Send(t.Context(), "default", api.SendRequest{Text: text, SourceKey: fmt.Sprintf("full-%d", i)})
		if err != nil {
			failure = err
			break
		}
		acked = append(acked, fmt.Sprintf("input %d ", i))
	}
	t.Logf("%d sends of 30 KB were acknowledged on the full disk before one was refused", len(acked)-3)
	if failure == nil {
		t.Fatal("400 sends of 30 KB to a full disk all succeeded")
	}
	if !strings.Contains(failure.Error(), "storage failed") || !strings.Contains(failure.Error(), "disk is full") ||
		!strings.Contains(failure.Error(), "nothing of this write was committed") {
		t.Fatalf("the error a send gets on a full disk: %v", failure)
	}
	st, err := a.c.Status(t.Context())
	if err != nil || st.Storage == nil || !strings.Contains(st.Storage.Reason, "disk is full") {
		t.Fatalf("status while the disk is full: %+v %v", st.Storage, err)
	}
	if !strings.Contains(a.scrape(), "klbr_storage_fault 1") {
		t.Fatal("klbr_storage_fault is not 1 while the disk is full")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	a.eventually("the probe clears the fault", func() bool { st, err := a.c.Status(t.Context()); return err == nil && st.Storage == nil })
	a.send("after the disk was freed")
	var inputs []string
	for _, r := range a.kinds(store.LaneInput, "") {
		inputs = append(inputs, string(r.Content))
	}
	if len(inputs) != len(acked)+1 {
		t.Fatalf("%d input records, want the %d acknowledged and the last one", len(inputs), len(acked)+1)
	}
	for i, want := range acked {
		if !strings.Contains(inputs[i], want) {
			t.Fatalf("input record %d is not the acknowledged %q", i, want)
		}
	}
	notes := a.kinds(store.LaneNotice, "storage")
	if len(notes) != 1 || !strings.Contains(string(notes[0].Content), "disk is full") || !strings.Contains(string(notes[0].Content), `"recovered"`) {
		t.Fatalf("storage notices: %+v", notes)
	}
	if _, err := a.c.StartSession(t.Context(), "default"); err != nil {
		t.Fatal(err)
	}
	a.eventually("answered", func() bool { return len(a.kinds(store.LaneSpeech, "local.sent")) == 1 })
}

// A cell that finishes while writes fail keeps its outcome and records it
// once they succeed: never "lost", and no later cell runs while it is open.
func TestCellFinishesWhileTheDiskIsFull(t *testing.T) {
	requirePython(t)
	data, env := smallDataDir(t, 48<<20)
	model := modeltest.New()
	defer model.Close()
	model.Then(
		modeltest.Reply{Calls: []modeltest.Call{{ID: "slow", Code: "import time\ntime.sleep(2)\nprint('the slow cell finished')"}}},
		modeltest.Reply{Calls: []modeltest.Call{{ID: "next", Code: "await local.send('after the slow cell')\nawait runtime.wait(None)"}}},
	)
	a := startAgentAt(t, model, "", "", data, env)
	a.send("run the slow cell")
	a.eventually("the slow cell runs", func() bool { return len(a.kinds(store.LaneCell, "cell.started")) == 1 })
	filler := fill(t, data)
	// A write on the full disk fails, so the fault is in force before the cell ends.
	if _, err := a.c.Send(t.Context(), "default", api.SendRequest{Text: strings.Repeat("y", 30000), SourceKey: "refused"}); err == nil {
		t.Fatal("a send on the full disk succeeded")
	}
	a.eventually("the cell tried to record its outcome", func() bool {
		return strings.Contains(a.d.String(), "a cell's outcome cannot be written yet")
	})
	if n := len(a.kinds(store.LaneCell, "cell.started")); n != 1 {
		t.Fatalf("%d cells started while the first one's outcome was unrecorded", n)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	a.eventually("answered after the disk was freed", func() bool { return len(a.kinds(store.LaneSpeech, "local.sent")) == 1 })
	fin := a.kinds(store.LaneCell, "cell.finished")
	if len(fin) < 1 || !strings.Contains(string(fin[0].Content), `"status":"ok"`) || !strings.Contains(string(fin[0].Content), "the slow cell finished") ||
		strings.Contains(string(fin[0].Content), "Lost") {
		var got []string
		for _, r := range fin {
			got = append(got, string(r.Content))
		}
		t.Fatalf("the slow cell's outcome: %s", got)
	}
}

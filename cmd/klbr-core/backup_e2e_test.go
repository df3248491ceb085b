package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/localclient"
	"github.com/klbr-dev/klbr/internal/store"
)

// TestBackupWhileServingRestoresClean: `klbr-core backup` runs while the
// daemon serves a burst of sends from parallel clients; `klbr-core restore`
// of it into a new data directory gives one that `klbr-core check` finds
// clean and that holds every input acknowledged before the backup began.
// restore refuses the live directory, and a non-empty one.
func TestBackupWhileServingRestoresClean(t *testing.T) {
	in := newInstance(t)
	in.must("init")
	in.serve()
	c := localclient.New(in.sock)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var mu sync.Mutex
	var before []int64 // acknowledged before the backup began
	var lat []time.Duration
	began := false
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				res, err := c.Send(ctx, "default", api.SendRequest{Text: "burst", SourceKey: fmt.Sprintf("w%d-%d", w, i)})
				d := time.Since(t0)
				if err != nil {
					t.Errorf("send: %v", err)
					return
				}
				mu.Lock()
				if !began {
					before = append(before, res.ID)
				} else {
					lat = append(lat, d)
				}
				mu.Unlock()
			}
		})
	}
	for {
		mu.Lock()
		n := len(before)
		mu.Unlock()
		if n >= 1500 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	began = true
	want := slices.Clone(before)
	mu.Unlock()
	dest := filepath.Join(t.TempDir(), "backup")
	out := in.must("backup", "--json", dest)
	// Let the burst run on past the backup, then stop it.
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	var res struct {
		Files    int `json:"files"`
		Database struct {
			Steps int `json:"steps"`
		} `json:"database"`
		Left []string `json:"left_out"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("backup --json: %v\n%s", err, out)
	}
	if res.Files < 2 || !slices.Contains(res.Left, "operator-token") {
		t.Errorf("backup wrote %+v", res)
	}
	mu.Lock()
	slices.Sort(lat)
	if len(lat) > 0 {
		t.Logf("%d sends acknowledged before the backup; during and after it %d, p99 %s, max %s",
			len(want), len(lat), lat[len(lat)*99/100], lat[len(lat)-1])
	}
	mu.Unlock()

	// restore refuses the live directory and a non-empty one.
	if _, errOut, err := in.run(nil, "restore", dest); err == nil || !strings.Contains(errOut, "held by klbr-core") {
		t.Errorf("restore into the serving directory: %v %s", err, errOut)
	}
	full := t.TempDir()
	os.WriteFile(filepath.Join(full, "x"), []byte("x"), 0o600)
	if _, errOut, err := in.run([]string{"KLBR_DATA_DIR=" + full}, "restore", dest); err == nil || !strings.Contains(errOut, "not empty") {
		t.Errorf("restore into a non-empty directory: %v %s", err, errOut)
	}

	target := filepath.Join(t.TempDir(), "restored")
	env := []string{"KLBR_DATA_DIR=" + target}
	if _, errOut, err := in.run(env, "restore", dest); err != nil {
		t.Fatalf("restore: %v\n%s", err, errOut)
	}
	if out, errOut, err := in.run(env, "check"); err != nil || !strings.Contains(out, ": clean") {
		t.Fatalf("check of the restored directory: %v\n%s%s", err, out, errOut)
	}
	// The serving directory checks clean as well, while it serves.
	if out, errOut, err := in.run(nil, "check"); err != nil || !strings.Contains(out, ": clean") {
		t.Errorf("check of the serving directory: %v\n%s%s", err, out, errOut)
	}
	st, err := store.Open(context.Background(), target, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	got, err := st.InputHandles(context.Background(), want)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("the restored directory holds %d of the %d inputs acknowledged before the backup began", len(got), len(want))
	}
}

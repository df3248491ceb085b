package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// One number per thing: tail prints each record under the ref history read
// takes (e123), and --since takes it; jobs show prints a ref history read
// returns the job's output from; with no route configured, the serve banner,
// status and send name the seed defaults in force and what answers there.
func TestOneNumberPerThing(t *testing.T) {
	in := newInstance(t)
	in.must("init")
	srv := in.serve()

	out, errOut, err := in.run(nil, "send", "default", "first words")
	if err != nil {
		t.Fatalf("send: %v %s", err, errOut)
	}
	if !strings.Contains(errOut, "no route configured: it answers only if an OpenAI-compatible server runs at http://localhost:8001/v1") {
		t.Errorf("send with no route: stdout %q, stderr %q; want a warning naming the seed default", out, errOut)
	}
	if st := in.must("status"); !strings.Contains(st, "no route configured: using seed defaults http://localhost:8001/v1") {
		t.Errorf("status with no route: %s", st)
	}
	if st := in.must("status", "--json"); !strings.Contains(st, `"agent": "route main (the server's model), fallback seed-8002, seed-8003 — no route configured: using seed defaults http://localhost:8001/v1`) {
		t.Errorf("status --json with no route: %s", st)
	}
	if !strings.Contains(srv.log(), "klbr-core: no route configured: using seed defaults http://localhost:8001/v1") ||
		!strings.Contains(srv.log(), "start an OpenAI-compatible server on localhost:8001") {
		t.Errorf("serve's banner with no route:\n%s", srv.log())
	}
	var rec struct{ ID, Seq int64 }
	if err := json.Unmarshal([]byte(inputLines(t, in.must("tail", "default", "--json"))[0]), &rec); err != nil {
		t.Fatal(err)
	}
	ref := fmt.Sprintf("e%d", rec.ID)
	if human := in.must("tail", "default"); !regexp.MustCompile(`(?m)^` + ref + `\s.*first words`).MatchString(human) {
		t.Fatalf("tail does not show the record under its ref %s:\n%s", ref, human)
	}
	if got := in.must("history", "read", ref); !strings.Contains(got, "first words") {
		t.Fatalf("history read %s: %q", ref, got)
	}
	in.run(nil, "send", "default", "second words")
	after := in.must("tail", "default", "--since", ref)
	if strings.Contains(after, "first words") || !strings.Contains(after, "second words") {
		t.Fatalf("tail --since %s:\n%s", ref, after)
	}
	if bySeq := in.must("tail", "default", "--since", fmt.Sprint(rec.Seq)); bySeq != after {
		t.Fatalf("tail --since the seq and --since the ref differ:\n%s\n---\n%s", bySeq, after)
	}
	if _, errOut, err := in.run(nil, "tail", "default", "--since", "e999999"); err == nil || !strings.Contains(errOut, "e999999") {
		t.Fatalf("tail --since an unknown ref: %v %q", err, errOut)
	}

	// A job's output: the ref jobs show prints reads back with history read.
	in.must("exec", "default", "from klbr import jobs\nj = await jobs.run(['sh', '-c', 'echo out of the job'])\nprint(j.id)")
	var show string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		show = in.must("jobs", "show", "1")
		if strings.Contains(show, "succeeded") || strings.Contains(show, "failed") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job did not end:\n%s\n%s", show, srv.log())
		}
	}
	m := regexp.MustCompile(`history read (\S+)\)`).FindStringSubmatch(show)
	if m == nil {
		t.Fatalf("jobs show prints no ref for the output:\n%s", show)
	}
	if got, errOut, err := in.run(nil, "history", "read", m[1]); err != nil || !strings.Contains(got, "out of the job") {
		t.Fatalf("history read %s (from jobs show): %v %q %q", m[1], err, got, errOut)
	}
}

package cli

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/store"
)

// The tree puts each child under its parent with its job and result.
func TestSessionTree(t *testing.T) {
	ss := []api.SessionStatus{
		{Session: store.Session{ID: "default", State: store.StateWaiting}},
		{Session: store.Session{ID: "child-1", ParentID: "default", State: store.StateWaiting}},
		{Session: store.Session{ID: "child-2", ParentID: "child-1", State: store.StateRunning}},
		{Session: store.Session{ID: "other", State: store.StateReady}},
	}
	js := []store.Job{
		{ID: 2, Kind: "child", Session: "child-1", State: store.JobRunning, Spec: json.RawMessage(`{"session":"child-2"}`)},
		{ID: 1, Kind: "child", Session: "default", State: store.JobSucceeded, Spec: json.RawMessage(`{"session":"child-1"}`),
			Result: json.RawMessage(`{ "widgets": 3 }`)},
		{ID: 3, Kind: "command", Session: "default", State: store.JobRunning, Spec: json.RawMessage(`{"argv":["true"]}`)},
	}
	js[1].Budget = json.RawMessage(`{"tokens": 5000}`)
	roots := SessionTree(ss, js)
	if len(roots) != 2 || roots[0].ID != "default" || roots[1].ID != "other" {
		t.Fatalf("roots %+v", roots)
	}
	roots[0].Children[0].Usage = &store.Usage{Session: "child-1", Tokens: 1234, ModelRequests: 3}
	var b bytes.Buffer
	for _, r := range roots {
		printNode(&b, r, 0)
	}
	want := "default  waiting\n" +
		"  child-1  waiting  job 1 succeeded  used 1234 tokens, 3 model requests  budget {\"tokens\":5000}  result {\"widgets\":3}\n" +
		"    child-2  running  job 2 running\n" +
		"other  ready\n"
	if b.String() != want {
		t.Fatalf("printed\n%s\nwant\n%s", b.String(), want)
	}
}

package web

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/store"
)

// GET /v2/children is the tree under the session: each child with its
// state, job, budget, usage and a bounded result.
func TestChildrenPanelTree(t *testing.T) {
	h := start(t)
	var a, b store.Spawned
	if err := h.st.Write(t.Context(), func(tx *store.Tx) (err error) {
		if a, err = tx.SpawnChild(store.NewChild{Parent: "default", Task: "count the widgets", Budget: json.RawMessage(`{"tokens": 900}`)}); err != nil {
			return err
		}
		b, err = tx.SpawnChild(store.NewChild{Parent: a.Session, Task: strings.Repeat("long ", 1000)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := h.st.Write(t.Context(), func(tx *store.Tx) error {
		_, err := tx.EndChild(b.Session, store.JobSucceeded, json.RawMessage(`{"text": "`+strings.Repeat("x", 3000)+`"}`), "", "")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	code, body := h.do(t, "GET", "/v2/children?session=default", nil, "")
	var v childrenView
	if code != 200 || json.Unmarshal([]byte(body), &v) != nil {
		t.Fatalf("GET /v2/children: %d %s", code, body)
	}
	if len(v.Children) != 1 || v.Truncated {
		t.Fatalf("children %+v", v)
	}
	c := v.Children[0]
	if c.Session != a.Session || c.Job != a.Job || c.JobState != store.JobRunning || c.Task != "count the widgets" ||
		string(c.Budget) != `{"tokens":900}` && string(c.Budget) != `{"tokens": 900}` || c.Usage.Session != a.Session || c.StartedAt == nil {
		t.Fatalf("child %+v", c)
	}
	if len(c.Children) != 1 {
		t.Fatalf("grandchildren %+v", c.Children)
	}
	g := c.Children[0]
	if g.JobState != store.JobSucceeded || !g.ResultCut || len(g.Result) != childPreview || len(g.Task) != childPreview || g.FinishedAt == nil {
		t.Fatalf("grandchild %+v: want succeeded, its result and task cut at %d bytes", g, childPreview)
	}
	code, body = h.do(t, "GET", "/v2/children?session="+a.Session, nil, "")
	var cv childrenView
	if code != 200 || json.Unmarshal([]byte(body), &cv) != nil || cv.Parent != "default" || len(cv.Children) != 1 || cv.Children[0].Session != b.Session {
		t.Fatalf("GET the child's children: %d %s", code, body)
	}
	if code, _ := h.do(t, "GET", "/v2/children?session=nobody", nil, ""); code != 404 {
		t.Errorf("an unknown session's children: %d, want 404", code)
	}
	if code, _ := h.do(t, "GET", "/v2/children?session=..%2Fx", nil, ""); code != 400 {
		t.Errorf("a bad session name: %d, want 400", code)
	}
}

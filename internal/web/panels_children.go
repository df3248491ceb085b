package web

// The children panel: the child agents under the page's session, as a
// tree, each with its state, its job's state, its budget as recorded and
// what its model requests used, its wall time and a bounded preview of its
// result. Selecting one opens its own page (?session=child-N).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/store"
)

// childrenPanelLimit bounds the nodes one GET /v2/children answers.
const childrenPanelLimit = 200

// childPreview bounds a child's task and result in the panel; the whole
// record is `klbr-core jobs show N`.
const childPreview = 1000

// childrenView is GET /v2/children?session=S: S's descendants.
type childrenView struct {
	Session string `json:"session"`
	Parent  string `json:"parent,omitempty"` // when the session is itself a child
	// JobState is the session's own child job's state, when it is a child:
	// a final one means it takes no more messages.
	JobState  store.JobState `json:"job_state,omitempty"`
	Children  []childNode    `json:"children"`
	Truncated bool           `json:"truncated"` // more than childrenPanelLimit
}

// childNode is one child agent.
type childNode struct {
	Session     string             `json:"session"`
	State       store.SessionState `json:"state"`
	StateReason string             `json:"state_reason,omitempty"`
	Job         int64              `json:"job"`
	JobState    store.JobState     `json:"job_state"`
	Host        string             `json:"host,omitempty"` // the worker host it works on; "": here
	Task        string             `json:"task"`
	Budget      json.RawMessage    `json:"budget"`
	Usage       store.Usage        `json:"usage"`
	StartedAt   *time.Time         `json:"started_at,omitempty"`
	FinishedAt  *time.Time         `json:"finished_at,omitempty"`
	WallSeconds float64            `json:"wall_seconds"` // since spawn, to its end or now
	Error       string             `json:"error,omitempty"`
	Result      string             `json:"result,omitempty"` // compact JSON, at most childPreview bytes
	ResultCut   bool               `json:"result_truncated,omitempty"`
	Children    []childNode        `json:"children"`
}

func (b *browser) handleChildren(w http.ResponseWriter, r *http.Request) {
	id, ok := sessionParam(w, r)
	if !ok {
		return
	}
	sess, err := b.Store.Session(r.Context(), id)
	if err != nil {
		storeError(w, err)
		return
	}
	out := childrenView{Session: id, Parent: sess.ParentID}
	if sess.ParentID != "" {
		j, err := b.Store.ChildJobOf(r.Context(), id)
		if err != nil && !errors.Is(err, store.ErrNoJob) {
			storeError(w, err)
			return
		}
		out.JobState = j.State
	}
	left := childrenPanelLimit
	kids, err := b.childNodes(r.Context(), id, &left, 0)
	if err != nil {
		storeError(w, err)
		return
	}
	out.Children, out.Truncated = kids, left < 0
	writeJSONStatus(w, http.StatusOK, out)
}

// childNodes reads the children of parent and theirs, at most *left nodes
// in all (*left goes below zero when some were left out).
func (b *browser) childNodes(ctx context.Context, parent string, left *int, depth int) ([]childNode, error) {
	out := []childNode{}
	if depth > 16 {
		return out, nil
	}
	kids, err := b.Store.ChildSessions(ctx, parent)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	for _, s := range kids {
		if *left <= 0 {
			*left = -1
			return out, nil
		}
		*left--
		n := childNode{Session: s.ID, State: s.State, StateReason: s.StateReason, Budget: json.RawMessage("null")}
		j, err := b.Store.ChildJobOf(ctx, s.ID)
		switch {
		case errors.Is(err, store.ErrNoJob):
		case err != nil:
			return nil, err
		default:
			n.Job, n.JobState, n.Error, n.StartedAt, n.FinishedAt = j.ID, j.State, j.Error, j.StartedAt, j.FinishedAt
			n.Host = j.Host
			if len(j.Budget) > 0 {
				n.Budget = j.Budget
			}
			if spec, err := store.ChildSpecOf(j); err == nil {
				n.Task = clip(spec.Task, childPreview)
			}
			if len(j.Result) > 0 {
				var c bytes.Buffer
				res := string(j.Result)
				if json.Compact(&c, j.Result) == nil {
					res = c.String()
				}
				n.Result, n.ResultCut = clip(res, childPreview), len(res) > childPreview
			}
			if j.StartedAt != nil {
				end := now
				if j.FinishedAt != nil {
					end = *j.FinishedAt
				}
				n.WallSeconds = end.Sub(*j.StartedAt).Round(100 * time.Millisecond).Seconds()
			}
		}
		if n.Usage, err = b.Store.SessionUsage(ctx, s.ID); err != nil {
			return nil, err
		}
		if n.Children, err = b.childNodes(ctx, s.ID, left, depth+1); err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// clip cuts s to at most n bytes on a rune boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

package web

// The panels of the agent's longer work: its durable jobs, and the diff of
// a release against the active one before it is activated.

import (
	"errors"
	"net/http"
	"regexp"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/store"
)

// jobsView is GET /v2/jobs: the session's jobs, newest first (at most
// jobsPanelLimit), and the time of the next scheduled one.
type jobsView struct {
	Jobs []store.Job `json:"jobs"`
}

const jobsPanelLimit = 50

func (b *browser) handleJobs(w http.ResponseWriter, r *http.Request) {
	id, ok := sessionParam(w, r)
	if !ok {
		return
	}
	jobs, err := b.Store.Jobs(r.Context(), store.JobFilter{Session: id, Limit: jobsPanelLimit})
	if err != nil {
		storeError(w, err)
		return
	}
	if jobs == nil {
		jobs = []store.Job{}
	}
	writeJSONStatus(w, http.StatusOK, jobsView{Jobs: jobs})
}

// releaseID is a release's id as the browser names it: never a path.
var releaseID = regexp.MustCompile(`^[0-9a-f]{64}$`)

// releaseDiffView is GET /v2/releases/diff?from=A&to=B: the unified diff of
// release A's tree to B's (the browser compares a candidate with the active
// release before activating it).
type releaseDiffView struct {
	From      string `json:"from"`
	To        string `json:"to"`
	Diff      string `json:"diff"`
	Truncated bool   `json:"truncated"`
}

func (b *browser) handleReleaseDiff(w http.ResponseWriter, r *http.Request) {
	if b.Releases == nil {
		jsonError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "releases are not available in this daemon")
		return
	}
	q := r.URL.Query()
	from, to := q.Get("from"), q.Get("to")
	if !releaseID.MatchString(from) || !releaseID.MatchString(to) {
		jsonError(w, http.StatusBadRequest, api.CodeInvalid, "from and to are release ids (64 hex digits)")
		return
	}
	d, truncated, err := b.Releases.Diff(r.Context(), from, to)
	if err != nil {
		if errors.Is(err, behavior.ErrCorrupt) {
			jsonError(w, http.StatusNotFound, api.CodeNotFound, err.Error())
			return
		}
		jsonError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
		return
	}
	writeJSONStatus(w, http.StatusOK, releaseDiffView{From: from, To: to, Diff: d, Truncated: truncated})
}

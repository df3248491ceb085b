package localapi

import (
	"errors"
	"io/fs"
	"net/http"
	"path/filepath"

	"github.com/klbr-dev/klbr/internal/activation"
	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/behavior"
	"github.com/klbr-dev/klbr/internal/celltree"
	"github.com/klbr-dev/klbr/internal/store"
)

// WithBehavior lets the API list, activate and roll back releases.
func (s *Server) WithBehavior(svc *activation.Service, rel *behavior.Releases) *Server {
	s.activation, s.releases = svc, rel
	return s
}

func (s *Server) behaviorReady(w http.ResponseWriter) bool {
	if s.activation == nil {
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "behavior releases are unavailable: "+s.benchErr.Error())
		return false
	}
	return true
}

func (s *Server) handleReleases(w http.ResponseWriter, r *http.Request) {
	if !s.behaviorReady(w) {
		return
	}
	var out api.Releases
	ids, err := s.store.ReleaseIDs(r.Context())
	if err != nil {
		s.fail(w, err)
		return
	}
	for _, id := range ids {
		rel := api.Release{ID: id, Path: s.releases.Dir(id)}
		if m, err := s.releases.Verify(id); err != nil {
			rel.Problem = err.Error()
		} else {
			rel.Skills, rel.Components, rel.Files = m.Skills, m.Components, len(m.Files)
		}
		if v, err := s.store.ReleaseValidation(r.Context(), "", id); err == nil {
			rel.Validation = &v
		}
		out.Releases = append(out.Releases, rel)
	}
	sessions, err := s.store.Sessions(r.Context())
	if err != nil {
		s.fail(w, err)
		return
	}
	for _, sess := range sessions {
		hist, err := s.store.Activations(r.Context(), sess.ID)
		if err != nil {
			s.fail(w, err)
			return
		}
		out.Sessions = append(out.Sessions, api.SessionBehavior{Session: sess.ID, Epoch: sess.BehaviorEpoch, Release: sess.PolicyRevision, History: hist})
	}
	writeJSON(w, http.StatusOK, out)
}

// handleReleaseDiff answers GET /v1/releases/diff?from=A&to=B: the unified
// diff between two stored releases (what the browser shows before an
// activation), {from, to, diff, truncated}.
func (s *Server) handleReleaseDiff(w http.ResponseWriter, r *http.Request) {
	if !s.behaviorReady(w) {
		return
	}
	q := r.URL.Query()
	from, err1 := s.releases.Resolve(q.Get("from"))
	to, err2 := s.releases.Resolve(q.Get("to"))
	if err := errors.Join(err1, err2); err != nil {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
		return
	}
	d, truncated, err := s.releases.Diff(r.Context(), from, to)
	if err != nil {
		if errors.Is(err, behavior.ErrCorrupt) {
			writeError(w, http.StatusNotFound, api.CodeNotFound, err.Error())
			return
		}
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"from": from, "to": to, "diff": d, "truncated": truncated})
}

func (s *Server) handlePublish(w http.ResponseWriter, r *http.Request) {
	var req api.PublishRequest
	if !decodeRequest(w, r, &req) || !s.behaviorReady(w) {
		return
	}
	if !filepath.IsAbs(req.Path) {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "path must be absolute")
		return
	}
	// The operator names the tree, but it may be a draft a cell writes
	// while it is read: nothing beneath it is followed (celltree).
	tree, err := celltree.Open(req.Path)
	if err != nil {
		writeError(w, http.StatusUnprocessableEntity, api.CodeRefused, err.Error())
		return
	}
	m, err := s.releases.Publish(tree.FS(behavior.MaxFileBytes))
	tree.Close()
	if err != nil {
		if errors.Is(err, behavior.ErrInvalidTree) || errors.Is(err, fs.ErrNotExist) || errors.Is(err, celltree.ErrLink) ||
			errors.Is(err, celltree.ErrHardLink) || errors.Is(err, celltree.ErrNotRegular) || errors.Is(err, celltree.ErrTooLarge) {
			writeError(w, http.StatusUnprocessableEntity, api.CodeRefused, err.Error())
			return
		}
		s.fail(w, err)
		return
	}
	if err := s.activation.Publish(r.Context(), m); err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.Release{ID: m.ID, Path: s.releases.Dir(m.ID), Files: len(m.Files), Skills: m.Skills, Components: m.Components})
}

func (s *Server) handleActivate(w http.ResponseWriter, r *http.Request) {
	var req api.ActivateRequest
	if !decodeRequest(w, r, &req) || !s.behaviorReady(w) {
		return
	}
	id, err := s.releases.Resolve(req.Release)
	if err != nil {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
		return
	}
	reason := req.Reason
	if reason == "" {
		reason = "activated by operator"
	}
	res, err := s.activation.Activate(r.Context(), r.PathValue("session"), req.ExpectedEpoch, id, reason)
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) handleRollback(w http.ResponseWriter, r *http.Request) {
	if !s.behaviorReady(w) {
		return
	}
	res, err := s.activation.Rollback(r.Context(), r.PathValue("session"))
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// behaviorError maps activation's refusals to their answers.
func behaviorError(err error) (int, string, bool) {
	switch {
	case errors.Is(err, store.ErrStaleEpoch):
		return http.StatusConflict, api.CodeConflict, true
	case errors.Is(err, activation.ErrCandidate), errors.Is(err, behavior.ErrCorrupt):
		return http.StatusUnprocessableEntity, api.CodeRefused, true
	}
	return 0, "", false
}

package ingress

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
	"github.com/klbr-dev/klbr/internal/store"
)

// The operator's DM of a held send. With [discord] operator_user_id and
// notify_held, each held effect is handed to the transport once (with the
// claims) to DM the operator with Release and Drop buttons; the transport
// reports the notice's outcome, and passes on a button press. A press is
// honored only when the user Discord names is the configured operator: the
// transport holds the bot token that received the interaction, and klbr-core
// checks the user against its own configuration, never against the
// transport's word on who the operator is.

// noticeRetry is how long a notice handed out and not reported stays with
// the transport before another claim hands it out again.
const noticeRetry = 2 * time.Minute

// heldToNotify returns the held effects to notify the operator of now.
func (s *Server) heldToNotify(ctx context.Context) ([]ingressapi.HeldNotify, error) {
	if s.cfg.Operator == "" {
		return nil, nil
	}
	es, err := s.cfg.Store.HeldToNotify(ctx, store.MaxHeldNotices)
	if err != nil {
		return nil, err
	}
	now := s.cfg.Clock()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []ingressapi.HeldNotify
	for _, e := range es {
		if at, ok := s.notifying[e.ID]; ok && now.Sub(at) < noticeRetry {
			continue
		}
		s.notifying[e.ID] = now
		out = append(out, ingressapi.HeldNotify{Effect: wireEffect(e), Conversation: e.Conversation, Reason: e.HeldReason, Operator: s.cfg.Operator})
	}
	return out, nil
}

func effectParam(w http.ResponseWriter, r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		writeError(w, http.StatusBadRequest, ingressapi.CodeInvalid, "the effect id is a positive integer")
		return 0, false
	}
	return id, true
}

// handleHeldNotified records a notice's outcome: POST /v1/held/{id}/notified.
func (s *Server) handleHeldNotified(w http.ResponseWriter, r *http.Request) {
	id, ok := effectParam(w, r)
	if !ok {
		return
	}
	var req ingressapi.HeldNotified
	if !decodeRequest(w, r, &req) {
		return
	}
	n := store.HeldNotice{EffectID: id, State: "sent", MessageID: req.MessageID}
	switch {
	case req.Error != "" && req.MessageID == "":
		n = store.HeldNotice{EffectID: id, State: "failed", Error: clipDetail(req.Error)}
	case req.MessageID == "" || !isSnowflake(req.MessageID):
		writeError(w, http.StatusBadRequest, ingressapi.CodeInvalid, "a notice has the DM's message id, or an error")
		return
	}
	if err := s.cfg.Store.Write(context.WithoutCancel(r.Context()), func(tx *store.Tx) error { return tx.RecordHeldNotice(n) }); err != nil {
		if errors.Is(err, store.ErrNoticeState) {
			writeError(w, http.StatusBadRequest, ingressapi.CodeInvalid, err.Error())
			return
		}
		s.fail(w, err)
		return
	}
	s.mu.Lock()
	delete(s.notifying, id)
	s.mu.Unlock()
	if n.State == "failed" {
		s.cfg.Log.Warn("the operator's DM of a held send failed; klbr-core held lists it", "effect", id, "error", n.Error)
	}
	writeJSON(w, http.StatusOK, struct{}{})
}

// handleHeldDecide is a button press on a notice: POST /v1/held/{id}/decide.
func (s *Server) handleHeldDecide(w http.ResponseWriter, r *http.Request) {
	id, ok := effectParam(w, r)
	if !ok {
		return
	}
	var req ingressapi.HeldDecision
	if !decodeRequest(w, r, &req) {
		return
	}
	if req.Decision != "release" && req.Decision != "drop" {
		writeError(w, http.StatusBadRequest, ingressapi.CodeInvalid, "decision is release or drop")
		return
	}
	if s.cfg.Operator == "" || req.UserID != s.cfg.Operator {
		s.cfg.Log.Warn("refused a held effect's decision from Discord: not the operator", "effect", id, "user", clip(req.UserID))
		writeError(w, http.StatusForbidden, ingressapi.CodeForbidden,
			"only [discord] operator_user_id decides held effects from Discord (and only with notify_held = true)")
		return
	}
	by := fmt.Sprintf("the operator (Discord user %s, a button of the DM)", req.UserID)
	e, err := s.cfg.Store.DecideHeld(context.WithoutCancel(r.Context()), id, req.Decision == "release", by)
	if err != nil {
		s.fail(w, err)
		return
	}
	if e.State == store.EffectPending {
		s.Kick()
	}
	s.cfg.Log.Info("held effect decided from Discord", "effect", id, "decision", req.Decision)
	writeJSON(w, http.StatusOK, ingressapi.HeldDecided{ID: e.ID, State: e.State, Kind: e.Kind})
}

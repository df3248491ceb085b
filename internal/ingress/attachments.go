package ingress

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
	"github.com/klbr-dev/klbr/internal/store"
)

// DefaultAttachmentMaxBytes is the per-file cap when Config leaves it 0.
const DefaultAttachmentMaxBytes = 25 << 20

// handleUpload is PUT /v1/attachments/{message}/{attachment}: the bytes of
// an admitted attachment, streamed into an artifact spool (so memory holds
// one buffer, not the file, and [storage] max_bytes bounds the disk). Past
// the per-file cap the spool is dropped and the fetch recorded failed.
func (s *Server) handleUpload(w http.ResponseWriter, r *http.Request) {
	t, ok := s.attachmentTarget(w, r)
	if !ok {
		return
	}
	var arts *artifacts.Store
	if s.cfg.Artifacts != nil {
		arts = s.cfg.Artifacts()
	}
	if arts == nil {
		writeError(w, http.StatusServiceUnavailable, ingressapi.CodeUnavailable, "klbr-core keeps no artifacts here: attachments cannot be stored")
		return
	}
	limit := s.cfg.AttachmentMaxBytes
	if limit <= 0 {
		limit = DefaultAttachmentMaxBytes
	}
	if r.ContentLength > limit {
		s.settleFetch(w, r, t, store.AttachmentOutcome{State: store.AttachmentFailed, ErrorCode: ingressapi.FetchTooLarge,
			Detail: fmt.Sprintf("%d bytes, past attachment_max_bytes (%d)", r.ContentLength, limit)})
		return
	}
	sp, err := arts.NewSpool()
	if err != nil {
		s.fail(w, err)
		return
	}
	sw := &spoolWriter{sp: sp}
	_, err = io.CopyBuffer(sw, io.LimitReader(r.Body, limit+1), make([]byte, 32<<10))
	switch {
	case sw.err != nil:
		// The artifact store refused the bytes ([storage] max_bytes).
		sp.Discard()
		s.settleFetch(w, r, t, store.AttachmentOutcome{State: store.AttachmentFailed, ErrorCode: ingressapi.FetchStorage, Detail: clipDetail(sw.err.Error())})
		return
	case err != nil:
		// The transport's stream broke (its fetch timed out or the CDN
		// stopped): nothing is recorded; it reports the failure it saw.
		sp.Discard()
		writeError(w, http.StatusBadRequest, ingressapi.CodeInvalid, "attachment upload: the stream ended early: "+err.Error())
		return
	case sp.Size() > limit:
		sp.Discard()
		s.settleFetch(w, r, t, store.AttachmentOutcome{State: store.AttachmentFailed, ErrorCode: ingressapi.FetchTooLarge,
			Detail: fmt.Sprintf("more than attachment_max_bytes (%d)", limit)})
		return
	case r.ContentLength >= 0 && sp.Size() != r.ContentLength:
		sp.Discard()
		writeError(w, http.StatusBadRequest, ingressapi.CodeInvalid, "attachment upload: fewer bytes than announced")
		return
	}
	ref, err := sp.Commit()
	if err != nil {
		s.settleFetch(w, r, t, store.AttachmentOutcome{State: store.AttachmentFailed, ErrorCode: ingressapi.FetchStorage, Detail: clipDetail(err.Error())})
		return
	}
	media := t.ContentType
	if media == "" {
		media = "application/octet-stream"
	}
	s.settleFetch(w, r, t, store.AttachmentOutcome{State: store.AttachmentFetched, SHA256: ref.SHA256, Size: ref.Size, MediaType: media})
}

// spoolWriter keeps the spool's own error apart from the request body's.
type spoolWriter struct {
	sp  *artifacts.Spool
	err error
}

func (w *spoolWriter) Write(p []byte) (int, error) {
	n, err := w.sp.Write(p)
	if err != nil {
		w.err = err
	}
	return n, err
}

// handleFetchFailure is POST /v1/attachments/{message}/{attachment}/failure.
func (s *Server) handleFetchFailure(w http.ResponseWriter, r *http.Request) {
	t, ok := s.attachmentTarget(w, r)
	if !ok {
		return
	}
	var f ingressapi.FetchFailure
	if !decodeRequest(w, r, &f) {
		return
	}
	if f.Code == "" || len(f.Code) > 64 || !utf8.ValidString(f.Detail) {
		writeError(w, http.StatusBadRequest, ingressapi.CodeInvalid, "a fetch failure needs a code (at most 64 bytes) and a UTF-8 detail")
		return
	}
	s.settleFetch(w, r, t, store.AttachmentOutcome{State: store.AttachmentFailed, ErrorCode: f.Code, Detail: clipDetail(f.Detail)})
}

func (s *Server) attachmentTarget(w http.ResponseWriter, r *http.Request) (store.AttachmentTarget, bool) {
	msg, id := r.PathValue("message"), r.PathValue("attachment")
	if !validID(msg) || !validID(id) {
		writeError(w, http.StatusBadRequest, ingressapi.CodeInvalid, "a message and an attachment id are snowflakes")
		return store.AttachmentTarget{}, false
	}
	t, err := s.cfg.Store.AttachmentTarget(r.Context(), s.cfg.Session, msg, id)
	if errors.Is(err, store.ErrUnknownAttachment) {
		writeError(w, http.StatusNotFound, ingressapi.CodeNotFound, "no admitted message "+msg+" with attachment "+id)
		return t, false
	}
	if err != nil {
		s.fail(w, err)
		return t, false
	}
	if t.State != store.AttachmentPending {
		writeError(w, http.StatusConflict, ingressapi.CodeConflict, "attachment "+id+" is "+t.State+" already")
		return t, false
	}
	return t, true
}

func (s *Server) settleFetch(w http.ResponseWriter, r *http.Request, t store.AttachmentTarget, o store.AttachmentOutcome) {
	err := s.cfg.Store.Write(r.Context(), func(tx *store.Tx) error { return tx.RecordAttachmentFetch(t, o) })
	if errors.Is(err, store.ErrFetchSettled) {
		writeError(w, http.StatusConflict, ingressapi.CodeConflict, "attachment "+t.ID+" has an outcome already")
		return
	}
	if err != nil {
		s.fail(w, err)
		return
	}
	if o.State == store.AttachmentFailed {
		s.cfg.Log.Info("attachment not fetched", "message_input", t.InputID, "attachment", t.ID, "code", o.ErrorCode)
	}
	writeJSON(w, http.StatusOK, ingressapi.FetchResult{State: o.State, SHA256: o.SHA256, Size: o.Size})
}

func validID(s string) bool {
	if s == "" || len(s) > ingressapi.MaxIDBytes {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func clipDetail(s string) string {
	if len(s) <= ingressapi.MaxFailureDetailBytes {
		return s
	}
	s = s[:ingressapi.MaxFailureDetailBytes]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

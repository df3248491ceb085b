package ingress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"

	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
	"github.com/klbr-dev/klbr/internal/store"
)

// effectFiles are the files a send carries, as the transport sees them.
func (s *Server) effectFiles(ctx context.Context, id int64) ([]ingressapi.EffectFile, error) {
	fs, err := s.cfg.Store.EffectFiles(ctx, id)
	if err != nil {
		return nil, err
	}
	var out []ingressapi.EffectFile
	for _, f := range fs {
		out = append(out, ingressapi.EffectFile{Filename: f.Filename, ContentType: f.ContentType, Size: f.Size, SHA256: f.SHA256})
	}
	return out, nil
}

// handleEffectFile is GET /v1/effects/{id}/files/{n}: the bytes of file n
// of a send, from the artifact store (the digest comes from the store,
// never from the request).
func (s *Server) handleEffectFile(w http.ResponseWriter, r *http.Request) {
	id, err1 := strconv.ParseInt(r.PathValue("id"), 10, 64)
	n, err2 := strconv.Atoi(r.PathValue("n"))
	if err1 != nil || err2 != nil || id < 1 || n < 0 || n >= ingressapi.MaxSendFiles {
		writeError(w, http.StatusBadRequest, ingressapi.CodeInvalid, "an effect id and a file number 0..9")
		return
	}
	e, err := s.cfg.Store.Effect(r.Context(), id)
	if errors.Is(err, store.ErrUnknownEffect) {
		writeError(w, http.StatusNotFound, ingressapi.CodeNotFound, "no effect "+r.PathValue("id"))
		return
	}
	if err != nil {
		s.fail(w, err)
		return
	}
	if e.State != store.EffectAttempting {
		writeError(w, http.StatusConflict, ingressapi.CodeConflict, "effect "+r.PathValue("id")+" is "+e.State+", not attempting")
		return
	}
	fs, err := s.cfg.Store.EffectFiles(r.Context(), id)
	if err != nil {
		s.fail(w, err)
		return
	}
	if n >= len(fs) {
		writeError(w, http.StatusNotFound, ingressapi.CodeNotFound, "effect "+r.PathValue("id")+" has no file "+r.PathValue("n"))
		return
	}
	arts := s.artifacts()
	if arts == nil {
		writeError(w, http.StatusServiceUnavailable, ingressapi.CodeUnavailable, "klbr-core keeps no artifacts here")
		return
	}
	p, err := arts.Path(fs[n].SHA256)
	if err != nil {
		s.fail(w, err)
		return
	}
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		writeError(w, http.StatusGone, ingressapi.CodeNotFound, "the file's bytes were removed (storage gc)")
		return
	}
	if err != nil {
		s.fail(w, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(fs[n].Size, 10))
	io.CopyBuffer(w, io.LimitReader(f, fs[n].Size), make([]byte, 32<<10))
}

// receiptFileIDs checks a receipt's files (only a confirmed one has them:
// at most MaxSendFiles, each with a Discord id, a name of at most 255 bytes
// and a size) and returns their attachment ids in order, or why not.
func receiptFileIDs(r ingressapi.Receipt) ([]string, string) {
	if len(r.Files) == 0 {
		return nil, ""
	}
	if r.State != store.EffectConfirmed {
		return nil, "files go with a confirmed receipt only"
	}
	if len(r.Files) > ingressapi.MaxSendFiles {
		return nil, fmt.Sprintf("%d files; a send carries at most %d", len(r.Files), ingressapi.MaxSendFiles)
	}
	ids := make([]string, len(r.Files))
	for i, f := range r.Files {
		if !isSnowflake(f.AttachmentID) || len(f.Filename) > 255 || f.Size < 0 {
			return nil, fmt.Sprintf("file %d: attachment_id is not a Discord id, filename is over 255 bytes or size is negative", i)
		}
		ids[i] = f.AttachmentID
	}
	return ids, ""
}

package history

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/store"
)

// Reader answers search and exact reads of history, for cells
// (history.*) and the operator (klbr-core history). A reader bound to a
// session (Session set) sees only that session's history.
type Reader struct {
	Store     *store.Store
	Artifacts *artifacts.Store // nil: artifacts cannot be opened
	// Grants, if set, returns what caller was granted of other sessions'
	// history (a child agent, by the refs of its spawn); false: nothing.
	Grants func(ctx context.Context, caller string) (Grant, bool)
}

// Bounds of reads.
const (
	DefaultReadBytes = 24000
	MaxReadBytes     = 1 << 20
	MaxQueryBytes    = 1000
)

// ErrOutOfScope reports a reference the reader may not see.
var ErrOutOfScope = errors.New("not in this session's history")

// Scope is a search's scope as callers give it.
type Scope struct {
	Session      string `json:"session,omitempty"`
	Conversation string `json:"conversation,omitempty"` // an alias (d1) or a channel id
	Lane         string `json:"lane,omitempty"`
	Since        string `json:"since,omitempty"` // RFC 3339, or a date
	Until        string `json:"until,omitempty"`
	Before       int64  `json:"before,omitempty"` // a continuation (SearchResult.Next)
}

// Search searches history. caller, when set, is the session the search is
// confined to (a cell's own), with the evidence it was granted (Grants):
// of that, only what caller may see whole.
func (r *Reader) Search(ctx context.Context, caller, query string, sc Scope, limit int) (store.SearchResult, error) {
	if len(query) > MaxQueryBytes || !utf8.ValidString(query) {
		return store.SearchResult{}, fmt.Errorf("search: the query must be valid UTF-8 of at most %d bytes", MaxQueryBytes)
	}
	session := sc.Session
	g, granted := r.grant(ctx, caller)
	switch {
	case granted:
		session = caller
	case caller != "" && session != "" && session != caller:
		return store.SearchResult{}, fmt.Errorf("search: session %q: %w", session, ErrOutOfScope)
	case caller != "":
		session = caller
	case session == "":
		return store.SearchResult{}, errors.New("search: name a session")
	}
	ss := store.SearchScope{Session: session, Lane: sc.Lane, Before: sc.Before}
	if sc.Conversation != "" {
		id, err := r.Store.ConversationChannel(ctx, sc.Conversation)
		if err != nil {
			return store.SearchResult{}, fmt.Errorf("search: %w", err)
		}
		ss.Conversation = id
	}
	var err error
	if ss.Since, err = parseWhen(sc.Since); err != nil {
		return store.SearchResult{}, fmt.Errorf("search: since: %w", err)
	}
	if ss.Until, err = parseWhen(sc.Until); err != nil {
		return store.SearchResult{}, fmt.Errorf("search: until: %w", err)
	}
	if limit == 0 {
		limit = 20
	}
	if granted {
		only := sc.Session
		if only == caller {
			only = ""
		}
		return r.searchGranted(ctx, caller, g, only, query, ss, limit)
	}
	return r.Store.Search(ctx, query, ss, limit)
}

func parseWhen(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a time (RFC 3339, or YYYY-MM-DD)", s)
}

// Describe describes a reference.
func (r *Reader) Describe(ctx context.Context, caller, ref string) (store.Described, error) {
	d, err := r.Store.Describe(ctx, ref)
	if err != nil {
		return d, err
	}
	if err := r.visible(ctx, caller, d); err != nil {
		return store.Described{}, err
	}
	return d, nil
}

// Read is an exact read of an original, bounded.
type Read struct {
	store.Original
	Truncated bool `json:"truncated"`
	// Offset continues a truncated read of an artifact.
	Offset int64 `json:"offset,omitempty"`
}

// Read reads ref's exact original text: a record, a summary, or an
// artifact's bytes (as UTF-8 text), at most maxBytes of it.
func (r *Reader) Read(ctx context.Context, caller, ref string, maxBytes int, offset int64) (Read, error) {
	if maxBytes == 0 {
		maxBytes = DefaultReadBytes
	}
	if maxBytes < 1 || maxBytes > MaxReadBytes {
		return Read{}, fmt.Errorf("read: max_bytes must be 1..%d", MaxReadBytes)
	}
	d, err := r.Describe(ctx, caller, ref)
	if err != nil {
		return Read{}, err
	}
	if d.Type != "artifact" {
		if offset != 0 {
			return Read{}, errors.New("read: offset applies to artifacts only")
		}
		o, err := r.Store.Original(ctx, ref)
		if err != nil {
			return Read{}, err
		}
		out := Read{Original: o}
		if len(o.Text) > maxBytes {
			out.Text, out.Truncated = cutUTF8(o.Text, maxBytes), true
		}
		if len(o.Content) > maxBytes {
			out.Content, out.Truncated = nil, true // the text is the bounded part; content whole or not at all
		}
		return out, nil
	}
	if r.Artifacts == nil {
		return Read{}, errors.New("read: artifacts are not available here")
	}
	if d.Retention != "retained" {
		return Read{}, fmt.Errorf("read: %s was %s", ref, d.Retention)
	}
	p, _ := store.ParseRef(ref)
	path, err := r.Artifacts.Path(p.Artifact)
	if err != nil {
		return Read{}, err
	}
	f, err := os.Open(path)
	if err != nil {
		return Read{}, fmt.Errorf("read %s: %w", ref, err)
	}
	defer f.Close()
	if offset < 0 || offset > d.Size {
		return Read{}, fmt.Errorf("read: offset must be 0..%d", d.Size)
	}
	buf := make([]byte, maxBytes)
	n, err := f.ReadAt(buf, offset)
	if err != nil && !errors.Is(err, io.EOF) {
		return Read{}, fmt.Errorf("read %s: %w", ref, err)
	}
	text := strings.ToValidUTF8(cutUTF8(string(buf[:n]), n), "\uFFFD")
	out := Read{Original: store.Original{Described: d, Text: text}}
	if end := offset + int64(len(text)); end < d.Size {
		out.Truncated, out.Offset = true, end
	}
	return out, nil
}

// cutUTF8 cuts s to at most n bytes without splitting a character.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 {
		if r, size := utf8.DecodeLastRuneInString(s); r != utf8.RuneError || size > 1 {
			break
		}
		s = s[:len(s)-1]
	}
	return s
}

// Children lists a summary's covered entries, in order. Of a summary that
// covers scopes not all granted to caller, it lists instead the narrower
// originals caller may read (a mixed summary it covers is replaced by
// what that covers, in turn).
func (r *Reader) Children(ctx context.Context, caller, ref string) ([]store.Child, error) {
	_, err := r.Describe(ctx, caller, ref)
	var se *ScopeError
	if errors.As(err, &se) {
		g, _ := r.grant(ctx, caller)
		return r.narrow(ctx, caller, g, ref, 0, []store.Child{})
	}
	if err != nil {
		return nil, err
	}
	return r.Store.Children(ctx, ref)
}

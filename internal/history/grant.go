package history

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/klbr-dev/klbr/internal/store"
)

// Grant is what a child agent was given of history beyond its own
// session, by the refs of its spawn.
type Grant struct {
	// Session is the session whose history Scopes open (the parent).
	Session string
	// Refs are exact references (e…, s…, a…), of any session.
	Refs []string
	// Scopes are scopes of Session's history granted whole: operator,
	// agent, discord:<channel>, source:<id>.
	Scopes []string
}

// ScopePrefix marks a spawn ref that grants a scope rather than one record.
const ScopePrefix = "scope:"

// ParseGrant splits the refs a spawn granted into exact refs and scopes.
func ParseGrant(session string, refs []string) Grant {
	g := Grant{Session: session}
	for _, r := range refs {
		if s, ok := strings.CutPrefix(r, ScopePrefix); ok {
			g.Scopes = append(g.Scopes, s)
		} else {
			g.Refs = append(g.Refs, r)
		}
	}
	return g
}

// ScopeError refuses a summary that covers scopes not all granted to the
// caller: a mixed-source summary is not safe for a narrower grant. The
// narrower originals the caller may read are listed by Children.
type ScopeError struct {
	Ref     string
	Missing []string
	Granted []string
}

func (e *ScopeError) Error() string {
	granted := "none"
	if len(e.Granted) > 0 {
		granted = strings.Join(e.Granted, ", ")
	}
	return fmt.Sprintf("%s covers scopes not granted to this session (%s; granted: %s): it is not returned whole; "+
		"`await history.children(%q)` lists the narrower originals it covers that you may read",
		e.Ref, strings.Join(e.Missing, ", "), granted, e.Ref)
}

// Unwrap makes a ScopeError an ErrOutOfScope.
func (e *ScopeError) Unwrap() error { return ErrOutOfScope }

// maxCoverWalk bounds the walk up a record's covering summaries.
const maxCoverWalk = 64

// grant returns caller's grant, if it has one.
func (r *Reader) grant(ctx context.Context, caller string) (Grant, bool) {
	if r.Grants == nil || caller == "" {
		return Grant{}, false
	}
	return r.Grants(ctx, caller)
}

// visible reports whether caller may see d whole: its own history; for a
// session with a grant, an exact ref, or a record of a granted scope (of
// the granting session, or covered by a granted summary), or a summary all
// of whose scopes are granted.
func (r *Reader) visible(ctx context.Context, caller string, d store.Described) error {
	if caller == "" || d.Session == "" || d.Session == caller {
		return nil
	}
	g, ok := r.grant(ctx, caller)
	if !ok {
		return fmt.Errorf("%s: %w", d.Ref, ErrOutOfScope)
	}
	return r.visibleWith(ctx, caller, g, d)
}

// visibleWith is visible for a caller whose grant is g.
func (r *Reader) visibleWith(ctx context.Context, caller string, g Grant, d store.Described) error {
	if caller == "" || d.Session == "" || d.Session == caller {
		return nil
	}
	out := fmt.Errorf("%s: %w", d.Ref, ErrOutOfScope)
	exact := slices.Contains(g.Refs, d.Ref)
	switch d.Type {
	case "record":
		if exact || len(d.Scopes) == 1 && slices.Contains(g.Scopes, d.Scopes[0]) && (d.Session == g.Session || r.covered(ctx, g, d)) {
			return nil
		}
		return out
	case "summary":
		if !exact && d.Session != g.Session && !r.covered(ctx, g, d) {
			return out
		}
		var missing []string
		for _, s := range d.Scopes {
			if !slices.Contains(g.Scopes, s) {
				missing = append(missing, s)
			}
		}
		if len(missing) == 0 && (exact || len(d.Scopes) > 0) {
			return nil
		}
		return &ScopeError{Ref: d.Ref, Missing: missing, Granted: g.Scopes}
	}
	if exact {
		return nil
	}
	return out
}

// covered reports whether a summary granted exactly covers d, at any depth.
func (r *Reader) covered(ctx context.Context, g Grant, d store.Described) bool {
	if !slices.ContainsFunc(g.Refs, func(s string) bool { return strings.HasPrefix(s, "s") }) {
		return false
	}
	cov := d.CoveredBy
	for n := 0; cov != "" && n < maxCoverWalk; n++ {
		if slices.Contains(g.Refs, cov) {
			return true
		}
		cd, err := r.Store.Describe(ctx, cov)
		if err != nil {
			return false
		}
		cov = cd.CoveredBy
	}
	return false
}

// maxNarrowed bounds the entries narrowing one summary returns.
const maxNarrowed = 10000

// narrow lists what summary ref covers that caller may read, in order: a
// covered summary that is itself mixed is replaced by what it covers, in
// turn.
func (r *Reader) narrow(ctx context.Context, caller string, g Grant, ref string, depth int, out []store.Child) ([]store.Child, error) {
	kids, err := r.Store.Children(ctx, ref)
	if err != nil {
		return out, err
	}
	for _, k := range kids {
		if len(out) >= maxNarrowed {
			return out, nil
		}
		d, err := r.Store.Describe(ctx, k.Ref)
		if err != nil {
			return out, err
		}
		err = r.visibleWith(ctx, caller, g, d)
		var se *ScopeError
		switch {
		case err == nil:
			out = append(out, k)
		case errors.As(err, &se) && depth < maxCoverWalk:
			if out, err = r.narrow(ctx, caller, g, k.Ref, depth+1, out); err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// searchGranted searches caller's own history and the granted evidence of
// the other sessions its grant names, keeping only what caller may see
// whole; the pages are merged newest first.
func (r *Reader) searchGranted(ctx context.Context, caller string, g Grant, only, query string, ss store.SearchScope, limit int) (store.SearchResult, error) {
	sessions := []string{caller, g.Session}
	for _, ref := range g.Refs {
		if d, err := r.Store.Describe(ctx, ref); err == nil && d.Session != "" {
			sessions = append(sessions, d.Session)
		}
	}
	slices.Sort(sessions)
	sessions = slices.Compact(sessions)
	if only != "" {
		if !slices.Contains(sessions, only) {
			return store.SearchResult{}, fmt.Errorf("search: session %q: %w", only, ErrOutOfScope)
		}
		sessions = []string{only}
	}
	var events, sums []store.Hit
	var frontier int64
	for _, s := range sessions {
		sc := ss
		sc.Session = s
		page, err := r.Store.Search(ctx, query, sc, limit)
		if err != nil {
			return page, err
		}
		if page.Truncated && page.Next > frontier {
			frontier = page.Next // below it, this session's hits were not read
		}
		for _, h := range page.Hits {
			if s != caller {
				d, err := r.Store.Describe(ctx, h.Ref)
				if err != nil || r.visibleWith(ctx, caller, g, d) != nil {
					continue
				}
			}
			if h.Cursor == 0 {
				sums = append(sums, h)
			} else {
				events = append(events, h)
			}
		}
	}
	slices.SortFunc(events, func(a, b store.Hit) int { return cmp.Compare(b.Cursor, a.Cursor) })
	var res store.SearchResult
	for _, h := range events {
		if h.Cursor < frontier {
			break
		}
		if len(res.Hits) == limit {
			res.Truncated, res.Next = true, res.Hits[len(res.Hits)-1].Cursor
			break
		}
		res.Hits = append(res.Hits, h)
	}
	if !res.Truncated && frontier != 0 {
		res.Truncated, res.Next = true, frontier
	}
	res.Hits = append(res.Hits, sums...)
	slices.SortStableFunc(res.Hits, func(a, b store.Hit) int { return b.At.Compare(a.At) })
	return res, nil
}

// GrantRef checks a ref that session is about to grant a child (a spawn's
// refs) and returns it in canonical form: an exact ref session may see
// itself, or scope:<scope> of session's own history, where a Discord
// conversation may be named by its alias (scope:d1 is scope:discord:<channel>).
func (r *Reader) GrantRef(ctx context.Context, session, ref string) (string, error) {
	s, ok := strings.CutPrefix(ref, ScopePrefix)
	if !ok {
		if _, err := r.Describe(ctx, session, ref); err != nil {
			return "", err
		}
		return ref, nil
	}
	switch {
	case s == "":
		return "", fmt.Errorf("%q names no scope (scope:operator, scope:agent, scope:discord:<channel>, scope:d1, scope:source:<id>)", ref)
	case s == "operator" || s == "agent" || strings.Contains(s, ":"):
		return ref, nil
	}
	id, err := r.Store.ConversationChannel(ctx, s)
	if err != nil {
		return "", fmt.Errorf("%q: %w", ref, err)
	}
	return ScopePrefix + "discord:" + id, nil
}

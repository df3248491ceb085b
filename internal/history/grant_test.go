package history

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/store"
)

// evidence is a parent session p whose history mixes scopes: an operator
// input and a Discord message under one summary, then an operator input
// after it; and a child session c of p.
type evidence struct {
	st                          *store.Store
	operator, discord, later, s string
}

func newEvidence(t *testing.T) evidence {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var e evidence
	e.st = st
	now := time.Now()
	admit := func(tx *store.Tx, kind, conv, key, body string) (string, error) {
		a, err := tx.AdmitInput(store.NewInput{Session: "p", SourceKind: kind, SourceKey: key, Conversation: conv, Author: "someone",
			Directed: true, OccurredAt: now, ReceivedAt: now, Body: body})
		if err != nil {
			return "", err
		}
		if err := tx.ClaimInputs("p", []int64{a.InputID}); err != nil {
			return "", err
		}
		_, err = tx.TakeFrame(store.Frame{Session: "p", InputIDs: []int64{a.InputID}}, 0)
		return store.EventRef(a.EventID), err
	}
	if err := st.Write(ctx, func(tx *store.Tx) (err error) {
		if _, err := tx.EnsureSession("p"); err != nil {
			return err
		}
		if e.operator, err = admit(tx, "operator", "operator", "k1", "the widget deploy failed at noon"); err != nil {
			return err
		}
		e.discord, err = admit(tx, "discord", "123", "k2", "a private widget rumour from the channel")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ac, err := st.Active(ctx, "p", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Write(ctx, func(tx *store.Tx) error {
		var covers []store.EntryRef
		for _, en := range ac.Entries {
			covers = append(covers, en.Ref())
		}
		id, err := tx.CommitSummary(store.NewSummary{Session: "p", Epoch: ac.Epoch, Version: ac.Version, Covers: covers,
			Kind: store.SummaryNormal, Text: "widget summary: the deploy failed, and a rumour", Notice: map[string]any{}})
		e.s = store.SummaryRef(id)
		if err != nil {
			return err
		}
		if e.later, err = admit(tx, "operator", "operator", "k3", "the widget deploy works again"); err != nil {
			return err
		}
		return tx.CreateSession("c", "p")
	}); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e evidence) reader(g Grant) *Reader {
	return &Reader{Store: e.st, Grants: func(_ context.Context, caller string) (Grant, bool) { return g, caller == "c" }}
}

func refsOf(hits []store.Hit) []string {
	var out []string
	for _, h := range hits {
		out = append(out, h.Ref)
	}
	return out
}

// A child granted the operator scope and the mixed summary: the summary
// (operator + discord:123) is refused whole, describe and read alike, and
// history.children narrows it to the operator original; the Discord
// message is refused; search finds the operator records and neither the
// summary nor the Discord message.
func TestMixedScopeSummaryIsNarrowedForAChild(t *testing.T) {
	e := newEvidence(t)
	ctx := context.Background()
	d, err := e.st.Describe(ctx, e.s)
	if err != nil || !slices.Equal(d.Scopes, []string{"discord:123", "operator"}) {
		t.Fatalf("the summary's scopes: %v, %v", d.Scopes, err)
	}
	r := e.reader(Grant{Session: "p", Refs: []string{e.s}, Scopes: []string{"operator"}})
	for _, read := range []func() error{
		func() error { _, err := r.Read(ctx, "c", e.s, 0, 0); return err },
		func() error { _, err := r.Describe(ctx, "c", e.s); return err },
	} {
		err := read()
		var se *ScopeError
		if !errors.As(err, &se) || !errors.Is(err, ErrOutOfScope) || !slices.Equal(se.Missing, []string{"discord:123"}) {
			t.Fatalf("the mixed summary for an operator-scoped child: %v", err)
		}
	}
	kids, err := r.Children(ctx, "c", e.s)
	if err != nil || len(kids) != 1 || kids[0].Ref != e.operator {
		t.Fatalf("children of the mixed summary: %+v, %v; want only %s", kids, err, e.operator)
	}
	if got, err := r.Read(ctx, "c", e.operator, 0, 0); err != nil || got.Text != "the widget deploy failed at noon" {
		t.Fatalf("the narrower operator original: %+v, %v", got, err)
	}
	if _, err := r.Read(ctx, "c", e.discord, 0, 0); !errors.Is(err, ErrOutOfScope) {
		t.Fatalf("the Discord message read by an operator-scoped child: %v", err)
	}
	if _, err := r.Read(ctx, "c", e.later, 0, 0); err != nil {
		t.Fatalf("an operator record of the parent under scope:operator: %v", err)
	}
	res, err := r.Search(ctx, "c", "widget", Scope{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := refsOf(res.Hits); !slices.Equal(got, []string{e.later, e.operator}) {
		t.Fatalf("the child's search found %v, want %v", got, []string{e.later, e.operator})
	}
	// The parent itself sees everything; a session without a grant nothing of p.
	if res, err := r.Search(ctx, "p", "widget", Scope{}, 0); err != nil || len(res.Hits) != 4 {
		t.Fatalf("the parent's search: %v, %v", refsOf(res.Hits), err)
	}
	if _, err := r.Read(ctx, "q", e.operator, 0, 0); !errors.Is(err, ErrOutOfScope) {
		t.Fatalf("a session without a grant read %s: %v", e.operator, err)
	}
	if _, err := r.Search(ctx, "c", "widget", Scope{Session: "q"}, 0); !errors.Is(err, ErrOutOfScope) {
		t.Fatalf("a child searched a session it was not granted: %v", err)
	}
}

// Granted every scope it covers, the summary is returned whole and found
// by search; granted the summary alone, nothing of it is readable.
func TestSummaryReturnedOnlyWithAllItsScopes(t *testing.T) {
	e := newEvidence(t)
	ctx := context.Background()
	r := e.reader(Grant{Session: "p", Refs: []string{e.s}, Scopes: []string{"operator", "discord:123"}})
	if got, err := r.Read(ctx, "c", e.s, 0, 0); err != nil || got.Text == "" {
		t.Fatalf("the summary with all its scopes: %+v, %v", got, err)
	}
	if kids, err := r.Children(ctx, "c", e.s); err != nil || len(kids) != 2 {
		t.Fatalf("children: %+v, %v", kids, err)
	}
	res, err := r.Search(ctx, "c", "widget", Scope{}, 0)
	if err != nil || !slices.Contains(refsOf(res.Hits), e.s) || len(res.Hits) != 4 {
		t.Fatalf("search with every scope: %v, %v", refsOf(res.Hits), err)
	}
	alone := e.reader(Grant{Session: "p", Refs: []string{e.s}})
	if _, err := alone.Read(ctx, "c", e.s, 0, 0); !errors.Is(err, ErrOutOfScope) {
		t.Fatalf("the summary granted without its scopes: %v", err)
	}
	if kids, err := alone.Children(ctx, "c", e.s); err != nil || len(kids) != 0 {
		t.Fatalf("narrowed without scopes: %+v, %v", kids, err)
	}
	if res, err := alone.Search(ctx, "c", "widget", Scope{}, 0); err != nil || len(res.Hits) != 0 {
		t.Fatalf("search without scopes: %v, %v", refsOf(res.Hits), err)
	}
	// An exact record grant reads, whatever its scope.
	exact := e.reader(Grant{Session: "p", Refs: []string{e.discord}})
	if _, err := exact.Read(ctx, "c", e.discord, 0, 0); err != nil {
		t.Fatalf("an exact grant: %v", err)
	}
	if res, err := exact.Search(ctx, "c", "rumour", Scope{}, 0); err != nil || !slices.Equal(refsOf(res.Hits), []string{e.discord}) {
		t.Fatalf("search over an exact grant: %v, %v", refsOf(res.Hits), err)
	}
}

// A spawn's refs: exact refs the spawner may see, and scopes.
func TestGrantRef(t *testing.T) {
	e := newEvidence(t)
	ctx := context.Background()
	r := e.reader(Grant{Session: "p", Refs: []string{e.operator}})
	for ref, want := range map[string]string{"scope:operator": "scope:operator", "scope:discord:123": "scope:discord:123", e.discord: e.discord} {
		if got, err := r.GrantRef(ctx, "p", ref); err != nil || got != want {
			t.Errorf("GrantRef(p, %s) = %q, %v; want %q", ref, got, err, want)
		}
	}
	for _, bad := range []string{"scope:", "scope:d9", "e999999", "nonsense"} {
		if got, err := r.GrantRef(ctx, "p", bad); err == nil {
			t.Errorf("GrantRef(p, %s) = %q, want an error", bad, got)
		}
	}
	// A child grants on only what it may see itself.
	if _, err := r.GrantRef(ctx, "c", e.operator); err != nil {
		t.Errorf("a child passing on its grant: %v", err)
	}
	if _, err := r.GrantRef(ctx, "c", e.discord); !errors.Is(err, ErrOutOfScope) {
		t.Errorf("a child granting what it may not see: %v", err)
	}
}

// A child's search pages through its own history and the granted
// evidence, newest first, each hit once.
func TestGrantedSearchPages(t *testing.T) {
	e := newEvidence(t)
	ctx := context.Background()
	var own []string
	if err := e.st.Write(ctx, func(tx *store.Tx) error {
		own = own[:0]
		for i, text := range []string{"my widget note", "another widget note"} {
			a, err := tx.AdmitInput(store.NewInput{Session: "c", SourceKind: "job", SourceKey: fmt.Sprint("c", i), Conversation: "parent",
				Author: "p", Directed: true, OccurredAt: time.Now(), ReceivedAt: time.Now(), Body: text})
			if err != nil {
				return err
			}
			own = append(own, store.EventRef(a.EventID))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	r := e.reader(Grant{Session: "p", Scopes: []string{"operator"}})
	var got []string
	sc := Scope{Lane: "input"}
	for page := 0; page < 10; page++ {
		res, err := r.Search(ctx, "c", "widget", sc, 1)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, refsOf(res.Hits)...)
		if !res.Truncated {
			break
		}
		sc.Before = res.Next
	}
	if want := []string{own[1], own[0], e.later, e.operator}; !slices.Equal(got, want) {
		t.Fatalf("input pages: %v, want %v", got, want)
	}
	got, sc = nil, Scope{}
	for page := 0; page < 10; page++ {
		res, err := r.Search(ctx, "c", "widget", sc, 1)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, refsOf(res.Hits)...)
		if !res.Truncated {
			break
		}
		sc.Before = res.Next
	}
	// The mixed summary is not among them, and no record is lost to it.
	if want := []string{own[1], own[0], e.later, e.operator}; !slices.Equal(got, want) {
		t.Fatalf("pages: %v, want %v", got, want)
	}
}

// ParseGrant splits any refs a cell gives: each is a scope or an exact
// ref, none lost, scopes without their prefix.
func FuzzParseGrant(f *testing.F) {
	f.Add("e12\ns3\nscope:operator")
	f.Add("scope:\nscope:scope:x\n")
	f.Fuzz(func(t *testing.T, in string) {
		refs := strings.Split(in, "\n")
		g := ParseGrant("p", refs)
		if g.Session != "p" || len(g.Refs)+len(g.Scopes) != len(refs) {
			t.Fatalf("%q: %+v", refs, g)
		}
		for _, r := range g.Refs {
			if strings.HasPrefix(r, ScopePrefix) {
				t.Fatalf("%q: a scope among the exact refs", r)
			}
		}
	})
}

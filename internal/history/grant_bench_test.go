package history

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/store"
)

// BenchmarkSearch is one page (20 hits) of a search over 2,000 matching
// operator inputs of session p: by p itself (root), and by its child c
// granted scope:operator (its own history and p's, each hit checked
// against the grant).
func BenchmarkSearch(b *testing.B) {
	ctx := context.Background()
	st, err := store.Open(ctx, b.TempDir(), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	now := time.Now()
	if err := st.Write(ctx, func(tx *store.Tx) error {
		if _, err := tx.EnsureSession("p"); err != nil {
			return err
		}
		var ids []int64
		for i := range 2000 {
			a, err := tx.AdmitInput(store.NewInput{Session: "p", SourceKind: "operator", SourceKey: fmt.Sprint("k", i), Conversation: "operator",
				Author: "operator", Directed: true, OccurredAt: now, ReceivedAt: now, Body: fmt.Sprintf("widget report %d", i)})
			if err != nil {
				return err
			}
			ids = append(ids, a.InputID)
		}
		if err := tx.ClaimInputs("p", ids); err != nil {
			return err
		}
		if _, err := tx.TakeFrame(store.Frame{Session: "p", InputIDs: ids}, 0); err != nil {
			return err
		}
		return tx.CreateSession("c", "p")
	}); err != nil {
		b.Fatal(err)
	}
	r := &Reader{Store: st, Grants: func(_ context.Context, caller string) (Grant, bool) {
		return Grant{Session: "p", Scopes: []string{"operator"}}, caller == "c"
	}}
	for _, who := range []string{"p", "c"} {
		b.Run(map[string]string{"p": "root", "c": "child_granted"}[who], func(b *testing.B) {
			for b.Loop() {
				res, err := r.Search(ctx, who, "widget", Scope{}, 20)
				if err != nil || len(res.Hits) != 20 {
					b.Fatalf("%d hits, %v", len(res.Hits), err)
				}
			}
		})
	}
}

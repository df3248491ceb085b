package ingress

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
)

// klbr-core hands held effects out for the operator's DM only when an
// operator is configured, each once until its outcome is reported; and it
// honors a decision from Discord only when the user is its own configured
// operator, whatever the transport says.
func TestHeldDecisionsFromDiscordOnlyFromTheOperator(t *testing.T) {
	c := startCore(t, t.TempDir())
	ctx := context.Background()
	if _, err := c.client.Admit(ctx, ingressapi.AdmitRequest{Messages: []ingressapi.Message{msg("3001", "30", ingressapi.ModeDM, "hi")}}); err != nil {
		t.Fatal(err)
	}
	conv, err := c.store.ConversationByRef(ctx, "discord:30")
	if err != nil {
		t.Fatal(err)
	}
	var e store.Effect
	if err := c.store.Write(ctx, func(tx *store.Tx) (err error) {
		e, err = tx.EnqueueEffect(store.NewEffect{Session: session.DefaultID, Kind: store.EffectSend, ConversationID: conv.ID, IdempotencyKey: "x/1",
			Nonce: "kheld", Text: "a password", Held: true, Reason: "held by delivery.review: a password"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	claim := func() ingressapi.ClaimResponse {
		t.Helper()
		cr, err := c.client.Claim(ctx, ingressapi.ClaimRequest{Limit: 8, WaitMS: 20})
		if err != nil {
			t.Fatal(err)
		}
		return cr
	}
	forbidden := func(err error) bool {
		var se *ingressapi.StatusError
		return errors.As(err, &se) && se.Status == 403
	}
	// No operator configured: no notices, no decisions from Discord.
	if cr := claim(); len(cr.Notify) != 0 {
		t.Fatalf("notices without an operator: %+v", cr.Notify)
	}
	if _, err := c.client.DecideHeld(ctx, e.ID, ingressapi.HeldDecision{Decision: "release", UserID: "8"}); !forbidden(err) {
		t.Fatalf("a decision without an operator configured: %v", err)
	}
	c.server.cfg.Operator = "8"
	cr := claim()
	if len(cr.Notify) != 1 || cr.Notify[0].ID != e.ID || cr.Notify[0].Operator != "8" || cr.Notify[0].Reason != e.HeldReason || cr.Notify[0].Conversation != conv.Alias {
		t.Fatalf("notices: %+v", cr.Notify)
	}
	if cr := claim(); len(cr.Notify) != 0 {
		t.Fatalf("a notice handed out twice while the transport has it: %+v", cr.Notify)
	}
	if _, err := c.client.DecideHeld(ctx, e.ID, ingressapi.HeldDecision{Decision: "release", UserID: "6"}); !forbidden(err) {
		t.Fatalf("a decision by someone else: %v", err)
	}
	if err := c.client.HeldNotified(ctx, e.ID, ingressapi.HeldNotified{MessageID: "not-an-id"}); err == nil {
		t.Fatal("a notice with a malformed message id was recorded")
	}
	if err := c.client.HeldNotified(ctx, e.ID, ingressapi.HeldNotified{MessageID: "5551"}); err != nil {
		t.Fatal(err)
	}
	d, err := c.client.DecideHeld(ctx, e.ID, ingressapi.HeldDecision{Decision: "release", UserID: "8"})
	if err != nil || d.State != store.EffectPending {
		t.Fatalf("the operator's release: %+v %v", d, err)
	}
	got, _ := c.store.Effect(ctx, e.ID)
	if !strings.Contains(got.ReleasedBy, "Discord user 8") {
		t.Fatalf("released by %q", got.ReleasedBy)
	}
	var se *ingressapi.StatusError
	if _, err := c.client.DecideHeld(ctx, e.ID, ingressapi.HeldDecision{Decision: "drop", UserID: "8"}); !errors.As(err, &se) || se.Status != 409 {
		t.Fatalf("a second decision: %v", err)
	}
}

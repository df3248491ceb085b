// Package delivery performs explicit speech: a cell's local.send is reviewed
// by delivery.review under the behavior the cell runs on, then durably
// published to the operator's speech lane (or recorded there as held, with
// the reason), and the cell gets an honest receipt.
package delivery

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/store"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
)

// MaxSendBytes bounds one local send.
const MaxSendBytes = 64 << 10

// Local answers the local.* host requests of cells.
type Local struct {
	store *store.Store
	hooks *hooks.Dispatcher
}

// NewLocal returns the local lane's delivery.
func NewLocal(st *store.Store, h *hooks.Dispatcher) *Local { return &Local{store: st, hooks: h} }

// HandleRequest implements worker.Handler for local.send.
func (l *Local) HandleRequest(ctx context.Context, r worker.Request) (json.RawMessage, error) {
	if r.Op != "local.send" {
		return nil, &worker.RequestError{Code: "unsupported", Message: r.Op + " is not a local operation"}
	}
	var a struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal(r.Args, &a); err != nil {
		return nil, &worker.RequestError{Code: "invalid", Message: "local.send: " + err.Error()}
	}
	if len(a.Text) > MaxSendBytes || !utf8.ValidString(a.Text) {
		return nil, &worker.RequestError{Code: "invalid", Message: fmt.Sprintf("local.send: text must be valid UTF-8 of at most %d bytes", MaxSendBytes)}
	}
	session := workbench.SessionFrom(ctx)
	pin, pinned := workbench.PinFrom(ctx)
	exec, err := strconv.ParseInt(strings.TrimPrefix(r.Execution, "x"), 10, 64)
	if session == "" || !pinned || err != nil {
		return nil, &worker.RequestError{Code: "invalid", Message: "local.send outside a journaled cell"}
	}
	// delivery.prepare may make several sends of it, each reviewed and
	// receipted on its own (a part after the first is its own request).
	parts := l.hooks.PrepareDeliveryAt(ctx, session, &pin, hooks.DeliveryInput{Channel: "local", Session: session, Limit: MaxSendBytes, Parts: []string{a.Text}})
	var receipts []store.Receipt
	for i, part := range parts {
		req := r.ID
		if i > 0 {
			req = -(r.ID*hooks.MaxParts + int64(i))
		}
		rc, err := l.sendOne(ctx, session, pin, exec, req, part)
		if err != nil {
			return nil, err
		}
		receipts = append(receipts, rc)
	}
	if len(receipts) == 1 {
		return json.Marshal(receipts[0])
	}
	return json.Marshal(struct {
		store.Receipt
		Parts []store.Receipt `json:"parts"`
	}{receipts[0], receipts})
}

// sendOne reviews and records one send.
func (l *Local) sendOne(ctx context.Context, session string, pin store.Pin, exec, req int64, text string) (store.Receipt, error) {
	// The review runs outside any transaction, under the cell's own behavior.
	dec := l.hooks.ReviewAt(ctx, session, &pin, hooks.ReviewInput{Channel: "local", Text: text, Session: session})
	status := "held"
	if dec.Allow {
		status = "confirmed"
	}
	var rc store.Receipt
	// The receipt is recorded even if the cell is being interrupted: the
	// review happened, and a retry must find it.
	err := l.store.Write(context.WithoutCancel(ctx), func(tx *store.Tx) (err error) {
		rc, err = tx.RecordLocalSend(store.LocalSend{Session: session, Execution: exec, Request: req, Text: text,
			Status: status, Reason: dec.Reason, Epoch: pin.Epoch, Release: pin.Release, Fallback: dec.Fallback})
		return err
	})
	return rc, err
}

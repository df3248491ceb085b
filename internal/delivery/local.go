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
	// The review runs outside any transaction, under the cell's own behavior.
	dec := l.hooks.ReviewAt(ctx, session, &pin, hooks.ReviewInput{Channel: "local", Text: a.Text, Session: session})
	status := "held"
	if dec.Allow {
		status = "confirmed"
	}
	var rc store.Receipt
	// The receipt is recorded even if the cell is being interrupted: the
	// review happened, and a retry must find it.
	wctx := context.WithoutCancel(ctx)
	err = l.store.Write(wctx, func(tx *store.Tx) (err error) {
		rc, err = tx.RecordLocalSend(store.LocalSend{Session: session, Execution: exec, Request: r.ID, Text: a.Text,
			Status: status, Reason: dec.Reason, Epoch: pin.Epoch, Release: pin.Release, Fallback: dec.Fallback})
		return err
	})
	if err != nil {
		return nil, err
	}
	return json.Marshal(rc)
}

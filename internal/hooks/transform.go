package hooks

import (
	"context"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/store"
)

// chain runs the ordered handlers the release binds to a transform slot,
// each given the previous one's output: input builds a handler's input from
// the current value, accept validates its answer and makes it the current
// value. A handler that fails, times out or answers something accept
// refuses is skipped (recorded with fallback set): the chain goes on with
// the previous output. It returns the number of handlers skipped.
func (d *Dispatcher) chain(ctx context.Context, session string, pin *store.Pin, slot string, input func() any, accept func(json.RawMessage) error) int {
	rel := d.releaseOf(session, pin)
	handlers := d.binding(rel).Transforms[slot]
	if len(handlers) == 0 {
		d.stats.skip(slot)
		return 0
	}
	s, _ := Lookup(slot)
	skipped := 0
	for _, h := range handlers {
		if !d.bound(rel, h) {
			skipped++
			continue
		}
		c := d.invokeHandler(ctx, session, pin, slot, h, input(), s.Deadline)
		problem := ""
		if c.rec.Outcome != "ok" {
			d.noteAbsent(c, h)
			problem = fmt.Sprintf("%s handler %s %s: %s", slot, h, c.rec.Outcome, c.rec.Error)
		} else if err := accept(c.result); err != nil {
			problem, c.rec.Outcome = fmt.Sprintf("%s handler %s: %v", slot, h, err), "invalid"
		}
		if problem != "" {
			c.rec.Error, c.rec.Fallback = problem, true
			skipped++
		}
		d.finish(c)
	}
	return skipped
}

// ContextInput is what context.prepare extends.
type ContextInput struct {
	Session   string   `json:"session"`
	Attempt   int64    `json:"attempt"`
	Step      int      `json:"step"`
	Additions []string `json:"additions"`
}

// Bounds of context.prepare.
const (
	MaxAdditions    = 8
	MaxAdditionSize = 4000
)

// PrepareContextAt runs the context.prepare chain under the attempt's
// behavior: the bounded additions to the next request. A handler may only
// add: the additions it was given stay, in order.
func (d *Dispatcher) PrepareContextAt(ctx context.Context, session string, pin *store.Pin, in ContextInput) []string {
	cur := append([]string{}, in.Additions...)
	d.chain(ctx, session, pin, SlotContextPrepare, func() any {
		in.Additions = cur
		return in
	}, func(out json.RawMessage) error {
		var r struct {
			Additions *[]string `json:"additions"`
		}
		if err := json.Unmarshal(out, &r); err != nil || r.Additions == nil {
			return fmt.Errorf("answered %s, not {additions}", truncate(out))
		}
		next := *r.Additions
		if len(next) > MaxAdditions {
			return fmt.Errorf("%d additions (at most %d)", len(next), MaxAdditions)
		}
		if len(next) < len(cur) {
			return fmt.Errorf("removed additions (%d of %d left): context.prepare only adds", len(next), len(cur))
		}
		for i, a := range next {
			if i < len(cur) && a != cur[i] {
				return fmt.Errorf("changed addition %d: context.prepare only adds", i)
			}
			if a == "" || len(a) > MaxAdditionSize || !utf8.ValidString(a) {
				return fmt.Errorf("addition %d is %d bytes (1..%d of UTF-8)", i, len(a), MaxAdditionSize)
			}
		}
		cur = next
		return nil
	})
	return cur
}

// DeliveryInput is what delivery.prepare shapes.
type DeliveryInput struct {
	Channel     string   `json:"channel"`
	Destination string   `json:"destination,omitempty"`
	Session     string   `json:"session"`
	Limit       int      `json:"limit"` // characters (Unicode code points, as Discord counts) per part
	Parts       []string `json:"parts"`
}

// MaxParts bounds the sends delivery.prepare may make of one.
const MaxParts = 16

// PrepareDeliveryAt runs the delivery.prepare chain under the cell's
// behavior: the parts a send is made of, each reviewed and receipted on its
// own. Its destination is not the handlers' to change: they see it, and only
// parts come back. Unbound or all failing: the text as it is.
func (d *Dispatcher) PrepareDeliveryAt(ctx context.Context, session string, pin *store.Pin, in DeliveryInput) []string {
	cur := append([]string{}, in.Parts...)
	d.chain(ctx, session, pin, SlotDeliveryPrepare, func() any {
		in.Parts = cur
		return in
	}, func(out json.RawMessage) error {
		var r struct {
			Parts *[]string `json:"parts"`
		}
		if err := json.Unmarshal(out, &r); err != nil || r.Parts == nil {
			return fmt.Errorf("answered %s, not {parts}", truncate(out))
		}
		if n := len(*r.Parts); n == 0 || n > MaxParts {
			return fmt.Errorf("%d parts (1..%d)", n, MaxParts)
		}
		for i, p := range *r.Parts {
			if p == "" || !utf8.ValidString(p) || len(p) > utf8.UTFMax*in.Limit || utf8.RuneCountInString(p) > in.Limit {
				return fmt.Errorf("part %d is %d characters (1..%d of UTF-8)", i, utf8.RuneCountInString(p), in.Limit)
			}
		}
		cur = *r.Parts
		return nil
	})
	return cur
}

// PresentInput is what result.present shapes.
type PresentInput struct {
	Session string `json:"session"`
	Status  string `json:"status"`
	Text    string `json:"text"`
}

// MaxPresented bounds a presented result.
const MaxPresented = 64 << 10

// PresentResultAt runs the result.present chain under the cell's behavior:
// the text the model is shown for a cell's result (the complete outcome is
// stored regardless). Unbound or all failing: text.
func (d *Dispatcher) PresentResultAt(ctx context.Context, session string, pin *store.Pin, in PresentInput) string {
	cur := in.Text
	d.chain(ctx, session, pin, SlotResultPresent, func() any {
		in.Text = cur
		return in
	}, func(out json.RawMessage) error {
		var r struct {
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(out, &r); err != nil || r.Text == nil {
			return fmt.Errorf("answered %s, not {text}", truncate(out))
		}
		if len(*r.Text) > MaxPresented || !utf8.ValidString(*r.Text) {
			return fmt.Errorf("text of %d bytes (at most %d of UTF-8)", len(*r.Text), MaxPresented)
		}
		cur = *r.Text
		return nil
	})
	return cur
}

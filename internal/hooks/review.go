package hooks

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/klbr-dev/klbr/internal/store"
)

// ReviewInput is what delivery.review judges.
type ReviewInput struct {
	Channel string `json:"channel"` // local or discord
	// Kind is send (or empty) or react; a reaction's Text is its emoji and
	// Target the message it goes on.
	Kind        string          `json:"kind,omitempty"`
	Target      string          `json:"target_message_id,omitempty"`
	Text        string          `json:"text"`
	Destination string          `json:"destination,omitempty"`
	Session     string          `json:"session"`
	Frame       json.RawMessage `json:"frame,omitempty"`
	// Files are the files a Discord send carries (names as the cell gave
	// them, sizes and types): reviewed with the text they go with.
	Files []ReviewFile `json:"files,omitempty"`
}

// ReviewFile is a file a send carries, as the review sees it.
type ReviewFile struct {
	Filename    string `json:"filename"`
	ContentType string `json:"content_type,omitempty"`
	Size        int64  `json:"size"`
}

// Decision is a review's verdict. Held sends are not delivered; Reason says why.
type Decision struct {
	Allow   bool   `json:"allow"`
	Reason  string `json:"reason"`
	Release string `json:"release,omitempty"`
	Epoch   int64  `json:"epoch,omitempty"`
	// Fallback is set when the hook did not decide (it failed, timed out,
	// answered garbage or could not run) and the host held the send.
	Fallback bool `json:"fallback"`
}

// Review runs delivery.review. It fails closed: an exception, a malformed
// answer, a timeout or a dead worker holds the send, with the reason.
func (d *Dispatcher) Review(ctx context.Context, session string, in ReviewInput) Decision {
	return d.ReviewAt(ctx, session, nil, in)
}

// ReviewAt reviews under the behavior pinned at pin (the cell's), or the
// active one when pin is nil.
func (d *Dispatcher) ReviewAt(ctx context.Context, session string, pin *store.Pin, in ReviewInput) Decision {
	c := d.invokeAt(ctx, session, pin, SlotReview, in, d.cfg.ReviewDeadline)
	dec := Decision{Release: c.rec.Release, Epoch: c.rec.Epoch}
	if c.rec.Outcome != "ok" {
		dec.Fallback, dec.Reason = true, fmt.Sprintf("held: delivery.review %s: %s", c.rec.Outcome, c.rec.Error)
	} else {
		var out struct {
			Decision *string `json:"decision"`
			Reason   *string `json:"reason"`
		}
		err := json.Unmarshal(c.result, &out)
		switch {
		case err != nil || out.Decision == nil || out.Reason == nil:
			dec.Fallback, dec.Reason = true, "held: delivery.review answered something that is not {decision, reason}"
		case *out.Decision == "allow":
			dec.Allow, dec.Reason = true, *out.Reason
		case *out.Decision == "hold":
			dec.Reason = *out.Reason
		default:
			dec.Fallback, dec.Reason = true, fmt.Sprintf("held: delivery.review decided %q, which is neither allow nor hold", *out.Decision)
		}
		if dec.Fallback {
			c.rec.Outcome, c.rec.Error = "invalid", dec.Reason
		}
	}
	c.rec.Fallback = dec.Fallback
	d.finish(c)
	return dec
}

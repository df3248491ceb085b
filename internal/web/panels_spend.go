package web

// The spend panel: today's and this month's spend against the caps, the
// sessions waiting at a cap ("spend cap: <which>, resets <when>"), and
// what each route and purpose spent. A cap is raised with the spend_cap
// control, the operator API's klbr-core spend cap.

import (
	"context"
	"net/http"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/spend"
	"github.com/klbr-dev/klbr/internal/store"
)

// Spend is the part of the operator API's spend the browser needs (the
// daemon's implementation of localapi.Spender).
type Spend interface {
	// Spend groups the ledger by "route", "purpose", … from since on, with
	// the meter's state (nil when the agent does not run).
	Spend(ctx context.Context, by string, since time.Time) (api.Spend, error)
	// SetSpendCap records the daily or monthly cap durably and applies it
	// at once.
	SetSpendCap(ctx context.Context, name string, usd float64) error
}

// spendView is GET /v2/spend: the meter's periods and caps, the held
// sessions, and today's and this month's spend by route and by purpose.
type spendView struct {
	State *spend.State   `json:"state,omitempty"` // nil: the agent does not run
	Held  []spendHold    `json:"held"`
	Today spendBreakdown `json:"today"`
	Month spendBreakdown `json:"month"`
}

// spendHold is a session waiting at a cap, with the waiting state as
// status names it.
type spendHold struct {
	spend.Hold
	Text string `json:"text"` // spend cap: <which>, resets <when>
}

// spendBreakdown is a period's spend from since on.
type spendBreakdown struct {
	Since    time.Time          `json:"since"`
	Total    store.SpendTotal   `json:"total"`
	Routes   []store.SpendTotal `json:"routes"`
	Purposes []store.SpendTotal `json:"purposes"`
}

func (b *browser) handleSpend(w http.ResponseWriter, r *http.Request) {
	if b.Spend == nil {
		jsonError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "spend is not available in this daemon")
		return
	}
	ctx := r.Context()
	first, err := b.Spend.Spend(ctx, "route", startOfDay(time.Now()))
	if err != nil {
		jsonError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
		return
	}
	out := spendView{State: first.State, Held: []spendHold{}}
	day, month := first.Since, startOfMonth(first.Since)
	if s := first.State; s != nil {
		day, month = s.DayStart, s.MonthStart
		for _, h := range s.Held {
			out.Held = append(out.Held, spendHold{Hold: h, Text: h.String()})
		}
	}
	for _, p := range []struct {
		into  *spendBreakdown
		since time.Time
	}{{&out.Today, day}, {&out.Month, month}} {
		p.into.Since = p.since
		for _, by := range []string{"route", "purpose"} {
			v, err := b.Spend.Spend(ctx, by, p.since)
			if err != nil {
				jsonError(w, http.StatusInternalServerError, api.CodeInternal, err.Error())
				return
			}
			p.into.Total = v.Total
			groups := v.Groups
			if groups == nil {
				groups = []store.SpendTotal{}
			}
			if by == "route" {
				p.into.Routes = groups
			} else {
				p.into.Purposes = groups
			}
		}
	}
	writeJSONStatus(w, http.StatusOK, out)
}

// startOfDay and startOfMonth are the host's periods, for a daemon whose
// agent does not run (no meter, no [spend] periods of its own).
func startOfDay(t time.Time) time.Time {
	return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, t.Location())
}

func startOfMonth(t time.Time) time.Time {
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, t.Location())
}

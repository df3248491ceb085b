package api

import (
	"time"

	"github.com/klbr-dev/klbr/internal/spend"
	"github.com/klbr-dev/klbr/internal/store"
)

// Spend is GET /v1/spend: the ledger since Since, in total and by group,
// and the meter's current periods against the caps (nil when the agent
// does not run).
type Spend struct {
	By     string             `json:"by"`
	Since  time.Time          `json:"since"`
	Total  store.SpendTotal   `json:"total"`
	Groups []store.SpendTotal `json:"groups"`
	State  *spend.State       `json:"state,omitempty"`
}

// SpendCap is POST /v1/spend/caps/{name}'s body.
type SpendCap struct {
	USD float64 `json:"usd"`
}

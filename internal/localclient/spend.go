package localclient

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
)

// Spend reads the spend ledger since since (zero: all of it), grouped by
// by (day, route, session, tree or purpose).
func (c *Client) Spend(ctx context.Context, by string, since time.Time) (api.Spend, error) {
	q := url.Values{"by": {by}}
	if !since.IsZero() {
		q.Set("since", since.Format(time.RFC3339))
	}
	var out api.Spend
	err := c.do(ctx, http.MethodGet, "/v1/spend?"+q.Encode(), nil, &out)
	return out, err
}

// SetSpendCap sets the daily or monthly cap in USD, durably.
func (c *Client) SetSpendCap(ctx context.Context, name string, usd float64) (api.Spend, error) {
	var out api.Spend
	err := c.do(ctx, http.MethodPost, "/v1/spend/caps/"+url.PathEscape(name), api.SpendCap{USD: usd}, &out)
	return out, err
}

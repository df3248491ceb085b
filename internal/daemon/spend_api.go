package daemon

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/klbr-dev/klbr/internal/api"
	"github.com/klbr-dev/klbr/internal/config"
	"github.com/klbr-dev/klbr/internal/localapi"
	"github.com/klbr-dev/klbr/internal/store"
)

// spendAPI serves the spend ledger and caps to the operator API.
type spendAPI struct {
	d   *daemon
	loc *time.Location
}

func (s spendAPI) Spend(ctx context.Context, by string, since time.Time) (api.Spend, error) {
	out := api.Spend{By: by, Since: since}
	groups, err := s.d.store.SpendBy(ctx, by, since, s.loc)
	if err != nil {
		return out, err
	}
	if out.Total, err = s.d.store.SpendSince(ctx, since); err != nil {
		return out, err
	}
	out.Groups = groups
	if s.d.spendMeter() != nil {
		st := s.d.spendMeter().State()
		out.State = &st
	}
	return out, nil
}

func (s spendAPI) SetSpendCap(ctx context.Context, name string, usd float64) error {
	if name != "daily" && name != "monthly" {
		return fmt.Errorf("%w: %q: the caps are daily and monthly", localapi.ErrInvalidCap, name)
	}
	if math.IsNaN(usd) || usd <= 0 || usd > config.MaxSpendUSD {
		return fmt.Errorf("%w: %v: a cap is more than 0 and at most %d USD", localapi.ErrInvalidCap, usd, config.MaxSpendUSD)
	}
	if s.d.spendMeter() == nil {
		return fmt.Errorf("%w: the agent does not run (%s)", localapi.ErrInvalidCap, s.d.agentState())
	}
	if err := s.d.store.Write(ctx, func(tx *store.Tx) error { return tx.SetSpendCap(name, usd) }); err != nil {
		return err
	}
	return s.d.spendMeter().SetCap(name, usd)
}

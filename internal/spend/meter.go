package spend

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/klbr-dev/klbr/internal/config"
)

// Caps' names, as holds, notices and klbr-core spend cap name them.
const (
	CapDailyUSD    = "daily_usd"
	CapMonthlyUSD  = "monthly_usd"
	CapDailyTokens = "daily_tokens"
)

// Options configure a Meter.
type Options struct {
	Spend config.Spend // [spend], resolved
	// Overrides are the caps the operator set (store.SpendCaps: "daily",
	// "monthly"), which replace Spend's.
	Overrides map[string]float64
	Prices    Prices
	// Used reads the ledger's totals from since on (store.SpendSince).
	Used func(ctx context.Context, since time.Time) (usd float64, tokens int64, err error)
	// DefaultOut is the answer bound assumed for a request that sets no
	// max_tokens (agent.reserve_output_tokens).
	DefaultOut int
	// Now and After are the clock; nil: time.Now, time.After.
	Now   func() time.Time
	After func(time.Duration) <-chan time.Time
	// Warn is told once per cap and period when the spend passes warn_at.
	Warn func(cap string, used, limit float64)
	// Spent is told of each settled request (for metrics).
	Spent func(route, purpose string, usd float64, tokens int)
}

// Hold is a session whose next model request waits at a cap.
type Hold struct {
	Session string    `json:"session"`
	Cap     string    `json:"cap"` // daily_usd, monthly_usd or daily_tokens
	Resets  time.Time `json:"resets"`
	Since   time.Time `json:"since"`
}

// String is the waiting state status shows.
func (h Hold) String() string {
	return fmt.Sprintf("spend cap: %s, resets %s", h.Cap, h.Resets.Format("2006-01-02 15:04 MST"))
}

// Meter reserves each model request's largest cost against the caps before
// it starts and settles it with what the provider reported, so that
// requests started at once overshoot a cap by no more than those in
// flight. At a cap, Reserve waits until the period ends or the cap is
// raised. It is safe for concurrent use.
type Meter struct {
	opts Options
	loc  *time.Location

	mu       sync.Mutex // guards the fields below and opts.Spend.DailyTokens, WarnAt (Reconfigure)
	day      period
	month    period
	daily    *float64 // USD caps in force (config, or the operator's)
	monthly  *float64
	resUSD   float64 // reserved by requests in flight
	resTok   int64
	holds    map[string]Hold
	warned   map[string]time.Time // cap -> start of the period it was warned in
	changed  chan struct{}        // closed (and replaced) when a waiter should look again
	inFlight int
}

type period struct {
	start, end time.Time
	usd        float64
	tokens     int64
}

// New returns a Meter whose current day and month start from the ledger.
func New(ctx context.Context, opts Options) (*Meter, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.After == nil {
		opts.After = time.After
	}
	if opts.Used == nil {
		opts.Used = func(context.Context, time.Time) (float64, int64, error) { return 0, 0, nil }
	}
	loc, err := opts.Spend.Location()
	if err != nil {
		return nil, fmt.Errorf("spend: time zone: %w", err)
	}
	opts.Spend = opts.Spend.Resolved()
	m := &Meter{opts: opts, loc: loc, daily: opts.Spend.DailyUSD, monthly: opts.Spend.MonthlyUSD,
		holds: map[string]Hold{}, warned: map[string]time.Time{}, changed: make(chan struct{})}
	if v, ok := opts.Overrides["daily"]; ok {
		m.daily = &v
	}
	if v, ok := opts.Overrides["monthly"]; ok {
		m.monthly = &v
	}
	now := opts.Now()
	m.day, m.month = m.dayOf(now), m.monthOf(now)
	if m.day.usd, m.day.tokens, err = opts.Used(ctx, m.day.start); err != nil {
		return nil, fmt.Errorf("spend: read today's ledger: %w", err)
	}
	if m.month.usd, m.month.tokens, err = opts.Used(ctx, m.month.start); err != nil {
		return nil, fmt.Errorf("spend: read this month's ledger: %w", err)
	}
	return m, nil
}

func (m *Meter) dayOf(t time.Time) period {
	t = t.In(m.loc)
	s := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, m.loc)
	return period{start: s, end: s.AddDate(0, 0, 1)}
}

func (m *Meter) monthOf(t time.Time) period {
	t = t.In(m.loc)
	s := time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, m.loc)
	return period{start: s, end: s.AddDate(0, 1, 0)}
}

// roll starts a new day or month when now is past the current one. m.mu held.
func (m *Meter) roll(now time.Time) {
	if !now.Before(m.day.end) {
		m.day = m.dayOf(now)
	}
	if !now.Before(m.month.end) {
		m.month = m.monthOf(now)
	}
}

// reached names the first cap the spend and the reservations in flight
// have reached, and when it resets; "" when none. m.mu held.
func (m *Meter) reached() (string, time.Time) {
	switch {
	case m.monthly != nil && m.month.usd+m.resUSD >= *m.monthly:
		return CapMonthlyUSD, m.month.end
	case m.daily != nil && m.day.usd+m.resUSD >= *m.daily:
		return CapDailyUSD, m.day.end
	case m.opts.Spend.DailyTokens > 0 && m.day.tokens+m.resTok >= m.opts.Spend.DailyTokens:
		return CapDailyTokens, m.day.end
	}
	return "", time.Time{}
}

// Reservation is a request's reserved cost, until Settle.
type Reservation struct {
	m       *Meter
	usd     float64
	tokens  int64
	settled bool
}

// Reserve reserves the largest cost of a request of session to route
// (prompt tokens, at most maxOut answer tokens: DefaultOut when 0). While
// a cap is reached (counting the requests in flight), it waits, the
// session showing the hold, until the period ends, the cap is raised or
// ctx ends.
func (m *Meter) Reserve(ctx context.Context, session, route string, prompt, maxOut int) (*Reservation, error) {
	if maxOut <= 0 {
		maxOut = m.opts.DefaultOut
	}
	r := &Reservation{m: m, usd: m.opts.Prices.Bound(route, prompt, maxOut), tokens: int64(prompt + maxOut)}
	defer func() {
		m.mu.Lock()
		delete(m.holds, session)
		m.mu.Unlock()
	}()
	for {
		now := m.opts.Now()
		m.mu.Lock()
		m.roll(now)
		which, resets := m.reached()
		if which == "" {
			m.resUSD += r.usd
			m.resTok += r.tokens
			m.inFlight++
			m.mu.Unlock()
			return r, nil
		}
		h, ok := m.holds[session]
		if !ok || h.Cap != which || !h.Resets.Equal(resets) {
			m.holds[session] = Hold{Session: session, Cap: which, Resets: resets, Since: now}
		}
		changed := m.changed
		m.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("spend cap %s (resets %s): %w", which, resets.Format(time.RFC3339), context.Cause(ctx))
		case <-changed:
		case <-m.opts.After(resets.Sub(now)):
		}
	}
}

// Settle replaces the reservation with what the request cost (usd nil:
// no cost known, the tokens only) and counts it in the day and month.
func (r *Reservation) Settle(route, purpose string, usd *float64, tokens int) {
	m := r.m
	var warn []func()
	m.mu.Lock()
	if !r.settled {
		r.settled = true
		m.resUSD -= r.usd
		m.resTok -= r.tokens
		m.inFlight--
		m.roll(m.opts.Now())
		cost := 0.0
		if usd != nil {
			cost = *usd
		}
		m.day.usd += cost
		m.month.usd += cost
		m.day.tokens += int64(tokens)
		m.month.tokens += int64(tokens)
		warn = m.warnings()
		m.wake()
	}
	m.mu.Unlock()
	for _, w := range warn {
		w()
	}
	if m.opts.Spent != nil {
		c := 0.0
		if usd != nil {
			c = *usd
		}
		m.opts.Spent(route, purpose, c, tokens)
	}
}

// warnings returns the Warn calls due: each cap past warn_at, once per
// period. m.mu held.
func (m *Meter) warnings() []func() {
	if m.opts.Warn == nil {
		return nil
	}
	var out []func()
	check := func(name string, used, limit float64, p period) {
		if limit > 0 && used >= m.opts.Spend.WarnAt*limit && !m.warned[name].Equal(p.start) {
			m.warned[name] = p.start
			out = append(out, func() { m.opts.Warn(name, used, limit) })
		}
	}
	if m.daily != nil {
		check(CapDailyUSD, m.day.usd, *m.daily, m.day)
	}
	if m.monthly != nil {
		check(CapMonthlyUSD, m.month.usd, *m.monthly, m.month)
	}
	check(CapDailyTokens, float64(m.day.tokens), float64(m.opts.Spend.DailyTokens), m.day)
	return out
}

// wake tells every waiter to look again. m.mu held.
func (m *Meter) wake() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// SetCap sets the daily or monthly USD cap (the operator's klbr-core spend
// cap): waiters look again at once.
func (m *Meter) SetCap(name string, usd float64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch name {
	case "daily":
		m.daily = &usd
	case "monthly":
		m.monthly = &usd
	default:
		return fmt.Errorf("spend cap %q: daily or monthly", name)
	}
	m.wake()
	return nil
}

// Holds returns the sessions waiting at a cap, by session.
func (m *Meter) Holds() map[string]Hold {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.holds)
}

// State is the meter's view of the current periods.
type State struct {
	DayStart      time.Time `json:"day_start"`
	DayResets     time.Time `json:"day_resets"`
	DayUSD        float64   `json:"day_usd"`
	DayTokens     int64     `json:"day_tokens"`
	MonthStart    time.Time `json:"month_start"`
	MonthResets   time.Time `json:"month_resets"`
	MonthUSD      float64   `json:"month_usd"`
	DailyUSD      *float64  `json:"daily_usd_cap,omitempty"`
	MonthlyUSD    *float64  `json:"monthly_usd_cap,omitempty"`
	DailyTokens   int64     `json:"daily_tokens_cap,omitempty"`
	WarnAt        float64   `json:"warn_at"`
	ReservedUSD   float64   `json:"reserved_usd"`
	InFlight      int       `json:"in_flight"`
	Held          []Hold    `json:"held"`
	TimeZone      string    `json:"time_zone"`
	Warned        []string  `json:"warned,omitempty"` // caps past warn_at this period
	ReservedToken int64     `json:"reserved_tokens"`
}

// State returns the current periods' spend against the caps.
func (m *Meter) State() State {
	now := m.opts.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.roll(now)
	s := State{DayStart: m.day.start, DayResets: m.day.end, DayUSD: m.day.usd, DayTokens: m.day.tokens,
		MonthStart: m.month.start, MonthResets: m.month.end, MonthUSD: m.month.usd, DailyUSD: m.daily, MonthlyUSD: m.monthly,
		DailyTokens: m.opts.Spend.DailyTokens, WarnAt: m.opts.Spend.WarnAt, ReservedUSD: m.resUSD, ReservedToken: m.resTok,
		InFlight: m.inFlight, TimeZone: m.loc.String()}
	for _, k := range slices.Sorted(maps.Keys(m.holds)) {
		s.Held = append(s.Held, m.holds[k])
	}
	for _, c := range slices.Sorted(maps.Keys(m.warned)) {
		p := m.day
		if c == CapMonthlyUSD {
			p = m.month
		}
		if m.warned[c].Equal(p.start) {
			s.Warned = append(s.Warned, c)
		}
	}
	return s
}

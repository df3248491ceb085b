package store

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Cost sources of a ledger row.
const (
	CostReported = "reported" // the provider reported the cost itself
	CostPrice    = "price"    // the route's configured price
	CostNone     = "none"     // neither: counted in tokens only
)

// SpendEntry is one model request in the spend ledger.
type SpendEntry struct {
	Session string // "" for a request of no session
	Route   string
	Purpose string // turn, summary, test
	// Usage as the provider reported it (a count it did not report is 0).
	Prompt, Completion, CacheRead, CacheWrite int
	// CostUSD is nil when the request has no cost (CostSource CostNone).
	CostUSD    *float64
	CostSource string
}

// RecordSpend commits one ledger row; step is the model step it belongs to
// (0: none, e.g. a summary or a request a route failed and passed on).
// The row's tree is the root of Session's tree.
func (t *Tx) RecordSpend(e SpendEntry, step int64) error {
	var session, stepID any
	if e.Session != "" {
		session = e.Session
	}
	if step > 0 {
		stepID = step
	}
	src := e.CostSource
	if src == "" || (e.CostUSD == nil && src != CostNone) {
		src = CostNone
	}
	if e.CostUSD != nil && src == CostNone {
		src = CostPrice
	}
	_, err := t.exec(`INSERT INTO spend (at, session_id, tree_id, route, purpose, step_id, prompt_tokens, completion_tokens,
		cache_read_tokens, cache_write_tokens, cost_usd, cost_source)
		VALUES (?, ?, (WITH RECURSIVE up(id, parent, depth) AS (
			SELECT id, parent_id, 0 FROM sessions WHERE id = ?
			UNION ALL SELECT s.id, s.parent_id, up.depth + 1 FROM sessions s JOIN up ON s.id = up.parent WHERE up.depth < 1000)
			SELECT id FROM up WHERE parent IS NULL), ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		t.now.UnixMilli(), session, session, e.Route, e.Purpose, stepID, max(e.Prompt, 0), max(e.Completion, 0),
		max(e.CacheRead, 0), max(e.CacheWrite, 0), e.CostUSD, src)
	if err != nil {
		return fmt.Errorf("record spend: %w", err)
	}
	return nil
}

// SpendTotal is what the ledger holds over a period.
type SpendTotal struct {
	Key      string  `json:"key,omitempty"` // the group (a day, route, session, tree or purpose)
	Requests int64   `json:"requests"`
	Tokens   int64   `json:"tokens"` // prompt + completion
	Prompt   int64   `json:"prompt_tokens"`
	Cached   int64   `json:"cache_read_tokens"`
	USD      float64 `json:"usd"`
	// Unpriced counts the requests without a cost (counted in tokens only).
	Unpriced int64 `json:"unpriced_requests"`
}

// SpendSince sums the ledger from since on.
func (s *Store) SpendSince(ctx context.Context, since time.Time) (SpendTotal, error) {
	var t SpendTotal
	err := s.rdb.QueryRowContext(ctx, `SELECT count(*), COALESCE(SUM(prompt_tokens + completion_tokens), 0), COALESCE(SUM(prompt_tokens), 0),
		COALESCE(SUM(cache_read_tokens), 0), COALESCE(SUM(cost_usd), 0), COALESCE(SUM(cost_usd IS NULL), 0) FROM spend WHERE at >= ?`, since.UnixMilli()).
		Scan(&t.Requests, &t.Tokens, &t.Prompt, &t.Cached, &t.USD, &t.Unpriced)
	if err != nil {
		return t, fmt.Errorf("spend since: %w", err)
	}
	return t, nil
}

// SpendGroups are the ways SpendBy groups the ledger.
var SpendGroups = []string{"day", "route", "session", "tree", "purpose"}

// SpendBy sums the ledger from since on by group (one of SpendGroups); a
// day is a calendar day in loc. Groups are ordered by key.
func (s *Store) SpendBy(ctx context.Context, group string, since time.Time, loc *time.Location) ([]SpendTotal, error) {
	col := map[string]string{"route": "route", "session": "COALESCE(session_id, '')", "tree": "COALESCE(tree_id, '')",
		"purpose": "purpose", "day": "at"}[group]
	if col == "" {
		return nil, fmt.Errorf("spend by %q: group by one of %v", group, SpendGroups)
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT `+col+`, count(*), SUM(prompt_tokens + completion_tokens), SUM(prompt_tokens),
		SUM(cache_read_tokens), COALESCE(SUM(cost_usd), 0), SUM(cost_usd IS NULL) FROM spend WHERE at >= ? GROUP BY 1`, since.UnixMilli())
	if err != nil {
		return nil, fmt.Errorf("spend by %s: %w", group, err)
	}
	defer rows.Close()
	byKey := map[string]*SpendTotal{}
	var keys []string
	for rows.Next() {
		var key any
		var t SpendTotal
		if err := rows.Scan(&key, &t.Requests, &t.Tokens, &t.Prompt, &t.Cached, &t.USD, &t.Unpriced); err != nil {
			return nil, fmt.Errorf("spend by %s: %w", group, err)
		}
		k := fmt.Sprint(key)
		if group == "day" {
			k = time.UnixMilli(key.(int64)).In(loc).Format(time.DateOnly)
		}
		acc := byKey[k]
		if acc == nil {
			acc = &SpendTotal{Key: k}
			byKey[k] = acc
			keys = append(keys, k)
		}
		acc.Requests += t.Requests
		acc.Tokens += t.Tokens
		acc.Prompt += t.Prompt
		acc.Cached += t.Cached
		acc.USD += t.USD
		acc.Unpriced += t.Unpriced
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("spend by %s: %w", group, err)
	}
	slices.Sort(keys)
	out := make([]SpendTotal, 0, len(keys))
	for _, k := range keys {
		out = append(out, *byKey[k])
	}
	return out, nil
}

// SetSpendCap records the operator's cap (daily or monthly, USD > 0): it
// replaces klbr.toml's until set again, across restarts.
func (t *Tx) SetSpendCap(name string, usd float64) error {
	if _, err := t.exec(`INSERT INTO spend_caps (name, usd, set_at) VALUES (?, ?, ?)
		ON CONFLICT(name) DO UPDATE SET usd = excluded.usd, set_at = excluded.set_at`, name, usd, t.now.UnixMilli()); err != nil {
		return fmt.Errorf("set spend cap: %w", err)
	}
	return nil
}

// SpendCaps returns the caps the operator set, by name.
func (s *Store) SpendCaps(ctx context.Context) (map[string]float64, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT name, usd FROM spend_caps`)
	if err != nil {
		return nil, fmt.Errorf("spend caps: %w", err)
	}
	defer rows.Close()
	out := map[string]float64{}
	for rows.Next() {
		var n string
		var v float64
		if err := rows.Scan(&n, &v); err != nil {
			return nil, fmt.Errorf("spend caps: %w", err)
		}
		out[n] = v
	}
	return out, rows.Err()
}

// subtreeSpend sums the ledger's cost over a session and the sessions
// under it, on the index spend_by_session (budget.usd's check before each
// of a child's model requests). CROSS JOIN keeps SQLite's loop order: the
// few sessions of the subtree outside, the ledger searched by each.
const subtreeSpend = `WITH RECURSIVE down(id, depth) AS (
		SELECT ?, 0
		UNION ALL SELECT s.id, down.depth + 1 FROM sessions s JOIN down ON s.parent_id = down.id WHERE down.depth < 1000)
	SELECT COALESCE(SUM(sp.cost_usd), 0) FROM down CROSS JOIN spend sp ON sp.session_id = down.id`

// SubtreeSpendUSD sums the ledger's cost of session's model requests and
// of every session under it (a child's budget.usd covers its subtree).
func (s *Store) SubtreeSpendUSD(ctx context.Context, session string) (float64, error) {
	var usd float64
	err := s.rdb.QueryRowContext(ctx, subtreeSpend, session).Scan(&usd)
	if err != nil {
		return 0, fmt.Errorf("subtree spend of %s: %w", session, err)
	}
	return usd, nil
}

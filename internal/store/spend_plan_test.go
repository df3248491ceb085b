package store

import (
	"strings"
	"testing"
)

// queryPlan is SQLite's EXPLAIN QUERY PLAN of query with args, one line per
// step ("SCAN jobs", "SEARCH sp USING COVERING INDEX ...").
func queryPlan(t *testing.T, s *Store, query string, args ...any) []string {
	t.Helper()
	rows, err := s.rdb.QueryContext(t.Context(), "EXPLAIN QUERY PLAN "+query, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return plan
}

// The queries that run per spawn and per child model request read an index
// rather than scanning the table: agents.max_spawns_per_day's count of the
// day's children (jobs by created_at), budget.usd's sum of a subtree's
// spend (the ledger by session) and the walk down the subtree (sessions by
// parent). Without the indexes each is a scan that grows with the ledger
// and the job history.
func TestSpendAndSpawnQueriesUseIndexes(t *testing.T) {
	s := newStore(t)
	for _, tc := range []struct {
		name  string
		query string
		want  []string // each must appear in some step of the plan
	}{
		{"children spawned today", childrenSpawnedSince, []string{"USING COVERING INDEX jobs_child_created"}},
		{"a subtree's spend", subtreeSpend, []string{"USING COVERING INDEX spend_by_session", "USING INDEX sessions_by_parent"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := queryPlan(t, s, tc.query, "x")
			joined := strings.Join(plan, "\n")
			for _, w := range tc.want {
				if !strings.Contains(joined, w) {
					t.Errorf("plan lacks %q:\n%s", w, joined)
				}
			}
			if strings.Contains(joined, "AUTOMATIC") {
				t.Errorf("plan builds a temporary index on each run (a scan of the table):\n%s", joined)
			}
			for _, step := range plan {
				for _, table := range []string{"SCAN jobs", "SCAN sp", "SCAN s"} {
					if step == table || strings.HasPrefix(step, table+" ") { // a scan, even of an index, reads it all
						t.Errorf("plan scans a table (%q):\n%s", step, joined)
					}
				}
			}
		})
	}
}

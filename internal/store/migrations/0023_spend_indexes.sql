-- compat: readable-by-previous
-- Indexes for the queries that run per spawn and per child model request,
-- which scanned their tables: agents.max_spawns_per_day counts the child
-- jobs created since the day's start (covered by jobs_child_created);
-- budget.usd sums the ledger's cost over a child's subtree (covered by
-- spend_by_session), walking down sessions by parent (sessions_by_parent).
-- Indexes only: a binary of the schema before reads the file as it was.
CREATE INDEX jobs_child_created ON jobs(kind, created_at);
CREATE INDEX spend_by_session ON spend(session_id, cost_usd);
CREATE INDEX sessions_by_parent ON sessions(parent_id);

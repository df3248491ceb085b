-- compat: readable-by-previous
-- The spend ledger: one row per model request klbr makes (a step of any
-- session, a summary, a request a route failed and passed on), committed with
-- the step's record where there is one, by session, tree (the root session),
-- route and purpose. cost_usd is the provider's reported cost
-- (cost_source 'reported'), else the route's price ('price'), else NULL: the
-- route is counted in tokens only ('none').
--
-- spend_caps holds the caps the operator set (klbr-core spend cap), which
-- replace klbr.toml's [spend] caps of the same name until set again.
--
-- A binary of the schema before ignores both tables (it keeps no ledger).
CREATE TABLE spend (
    id                 INTEGER PRIMARY KEY,
    at                 INTEGER NOT NULL,
    session_id         TEXT,
    tree_id            TEXT,
    route              TEXT    NOT NULL,
    purpose            TEXT    NOT NULL,
    step_id            INTEGER REFERENCES model_steps(id),
    prompt_tokens      INTEGER NOT NULL DEFAULT 0 CHECK (prompt_tokens >= 0),
    completion_tokens  INTEGER NOT NULL DEFAULT 0 CHECK (completion_tokens >= 0),
    cache_read_tokens  INTEGER NOT NULL DEFAULT 0 CHECK (cache_read_tokens >= 0),
    cache_write_tokens INTEGER NOT NULL DEFAULT 0 CHECK (cache_write_tokens >= 0),
    cost_usd           REAL    CHECK (cost_usd IS NULL OR cost_usd >= 0),
    cost_source        TEXT    NOT NULL CHECK (cost_source IN ('reported', 'price', 'none'))
);
CREATE INDEX spend_at ON spend(at);

CREATE TABLE spend_caps (
    name       TEXT    PRIMARY KEY CHECK (name IN ('daily', 'monthly')),
    usd        REAL    NOT NULL CHECK (usd > 0),
    set_at     INTEGER NOT NULL
);

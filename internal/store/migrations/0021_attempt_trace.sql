-- compat: readable-by-previous
-- The trace of each attempt ([telemetry] otlp_endpoint): its OpenTelemetry
-- trace id in hex, NULL when tracing was off. A binary of the schema before
-- ignores the column.
ALTER TABLE attempts ADD COLUMN trace_id TEXT CHECK (trace_id IS NULL OR length(trace_id) = 32);

-- The prompt tokens a provider reports as missing its cache (DeepSeek's
-- prompt_cache_miss_tokens), stored like cache reads and writes: NULL when
-- the provider did not report it, which is a different statement from 0.
ALTER TABLE model_steps ADD COLUMN cache_miss_tokens INTEGER;

-- 0009: a placeholder on the issue-15 branch only, so that 0010 follows
-- without a gap. Its number belongs to issue 14; drop this file when
-- merging with it.
SELECT 1;

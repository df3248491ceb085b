-- 0008: a placeholder on the issue-15 branch only, so that 0010 follows
-- without a gap. Its number belongs to issue 13's history tables; drop this
-- file when merging with them.
SELECT 1;

-- compat: readable-by-previous
-- 0013: a placeholder on branch issue-21 only, so that 0014 loads gaplessly
-- here; the real 0013 comes from a parallel branch and replaces this file at merge.
SELECT 1;

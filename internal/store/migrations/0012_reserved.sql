-- 0012: reserved for issue 17's migration (this file only keeps the versions gapless on
-- the issue-18 branch; drop it when the real 0012 is merged).
SELECT 1;

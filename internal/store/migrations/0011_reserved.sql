-- 0011: reserved for issue 16's migration (this file only keeps the versions gapless on
-- the issue-18 branch; drop it when the real 0011 is merged).
SELECT 1;

-- 0011: a placeholder on this branch for issue 16's migration (the coordinator replaces it at merge).
SELECT 1;

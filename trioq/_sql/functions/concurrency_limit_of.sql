-- The limit that applies to `key`: the longest matching pattern (the whole key before a
-- prefix of the same length), else the job's own limit, else 1 (a key nobody gave a limit runs one job at a time).
CREATE OR REPLACE FUNCTION {schema}.concurrency_limit_of(key text, job_limit integer) RETURNS integer
-- (Its qualified names: see db_now; called per key of a keyed claim.)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT l.max_running FROM {schema}.concurrency_limits l
         WHERE l.pattern OPERATOR(pg_catalog.=) key
            OR (pg_catalog.right(l.pattern, 1) OPERATOR(pg_catalog.=) '*'
                AND pg_catalog.starts_with(key, pg_catalog.left(l.pattern, -1)))
         ORDER BY pg_catalog.length(l.pattern) DESC,
                  pg_catalog.right(l.pattern, 1) OPERATOR(pg_catalog.=) '*'
         LIMIT 1),
        job_limit, 1)
$$;

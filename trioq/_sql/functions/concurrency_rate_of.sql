-- The rate that applies to `key`: the longest matching pattern (the whole key before a prefix
-- of the same length), as concurrency_limit_of picks a limit; no row: the key has no rate.
CREATE OR REPLACE FUNCTION {schema}.concurrency_rate_of(key text)
RETURNS TABLE (rate_allowed integer, rate_period double precision)
-- (Its qualified names: see db_now; called per key of a rated claim.)
LANGUAGE sql STABLE AS $$
    SELECT r.rate_allowed, r.rate_period FROM {schema}.concurrency_rates r
    WHERE r.pattern OPERATOR(pg_catalog.=) key
       OR (pg_catalog.right(r.pattern, 1) OPERATOR(pg_catalog.=) '*'
           AND pg_catalog.starts_with(key, pg_catalog.left(r.pattern, -1)))
    ORDER BY pg_catalog.length(r.pattern) DESC,
             pg_catalog.right(r.pattern, 1) OPERATOR(pg_catalog.=) '*'
    LIMIT 1
$$;

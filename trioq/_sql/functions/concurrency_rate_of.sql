-- The rate that applies to `key`: the longest matching pattern (the whole key before a prefix
-- of the same length), as concurrency_limit_of picks a limit; no row: the key has no rate.
CREATE OR REPLACE FUNCTION {schema}.concurrency_rate_of(key text)
RETURNS TABLE (rate_allowed integer, rate_period double precision)
LANGUAGE sql STABLE AS $$
    SELECT r.rate_allowed, r.rate_period FROM {schema}.concurrency_rates r
    WHERE r.pattern = key
       OR (right(r.pattern, 1) = '*' AND starts_with(key, left(r.pattern, -1)))
    ORDER BY length(r.pattern) DESC, right(r.pattern, 1) = '*' LIMIT 1
$$;

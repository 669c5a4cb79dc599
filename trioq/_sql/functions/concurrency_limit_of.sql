-- The limit that applies to `key`: the longest matching pattern (the whole key before a
-- prefix of the same length), else the job's own limit, else 1 (a key nobody gave a limit runs one job at a time).
CREATE OR REPLACE FUNCTION {schema}.concurrency_limit_of(key text, job_limit integer) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT l.max_running FROM {schema}.concurrency_limits l
         WHERE l.pattern = key
            OR (right(l.pattern, 1) = '*' AND starts_with(key, left(l.pattern, -1)))
         ORDER BY length(l.pattern) DESC, right(l.pattern, 1) = '*' LIMIT 1),
        job_limit, 1)
$$;

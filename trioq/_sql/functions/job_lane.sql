-- The partition a job's row lives in (`jobs.lane`, migration 0038), from its finished_at:
-- 0 (jobs_live) while it is unfinished, else the UTC day it finished on, counted from
-- 1970-01-01 (jobs_d<yyyymmdd>). Every statement that sets finished_at sets lane from it, so
-- PostgreSQL moves the row as it finishes, or back when a retry makes it unfinished.
-- Inlined by the planner (plain SQL, IMMUTABLE, no SET clause), so it names its functions and
-- operators by schema (trioq/_sql/__init__.py). Inlined only if every function in the body is
-- immutable: `date_part('epoch', finished)` is STABLE (date_part of a timestamptz reads the
-- time zone for other fields), which kept it a call, one SQL-function execution per row, 6.4 us
-- of every completion's job in a drain; the epoch of the interval since 1970 is the same number.
CREATE OR REPLACE FUNCTION {schema}.job_lane(finished timestamptz) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN finished IS NULL THEN 0
                ELSE pg_catalog.floor(pg_catalog.date_part(
                         'epoch', finished OPERATOR(pg_catalog.-)
                                  '1970-01-01 00:00:00+00'::pg_catalog.timestamptz)
                     OPERATOR(pg_catalog./) 86400)::integer END
$$;

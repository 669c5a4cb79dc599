-- The partition a job's row lives in (`jobs.lane`, migration 0038), from its finished_at:
-- 0 (jobs_live) while it is unfinished, else the UTC day it finished on, counted from
-- 1970-01-01 (jobs_d<yyyymmdd>). Every statement that sets finished_at sets lane from it, so
-- PostgreSQL moves the row as it finishes, or back when a retry makes it unfinished.
-- Inlined by the planner (plain SQL, IMMUTABLE, no SET clause), so it names its functions and
-- operators by schema (trioq/_sql/__init__.py).
CREATE OR REPLACE FUNCTION {schema}.job_lane(finished timestamptz) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN finished IS NULL THEN 0
                ELSE pg_catalog.floor(pg_catalog.date_part('epoch', finished)
                                      OPERATOR(pg_catalog./) 86400)::integer END
$$;

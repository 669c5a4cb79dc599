-- What a row leaving jobs_live leaves behind (trigger jobs_live_left, migrations 0044, 0047): a
-- due row's copy in job_due (a scheduled job cancelled or past its deadline moves to its day of
-- finished jobs: PostgreSQL fires AFTER DELETE on the partition it leaves, not AFTER UPDATE).
-- A running job's concurrency slot is released by its run's delete (concurrency_release(),
-- migration 0047). The WHEN clause is checked per row without calling it, so a completion
-- pays its comparison.
CREATE OR REPLACE FUNCTION {schema}.jobs_live_left() RETURNS trigger
-- (Its qualified names: see db_now; a trigger of a due job's end.)
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {schema}.job_due d WHERE d.job_id OPERATOR(pg_catalog.=) OLD.id;
    RETURN NULL;
END
$$;

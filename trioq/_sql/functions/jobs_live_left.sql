-- What a row leaving jobs_live leaves behind (trigger jobs_live_left, migration 0044): a due
-- row's copy in job_due (a scheduled job cancelled or past its deadline moves to its day of
-- finished jobs: PostgreSQL fires AFTER DELETE on the partition it leaves, not AFTER UPDATE),
-- or a running job's concurrency slot (a completion, a `keep=False` delete; as
-- concurrency_release() does for a row that stops running in place). The WHEN clause is
-- checked per row without calling it, so a completion without a key pays its comparisons.
CREATE OR REPLACE FUNCTION {schema}.jobs_live_left() RETURNS trigger
-- (Its qualified names: see db_now; a trigger of every job's end.)
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state OPERATOR(pg_catalog.=) 'running' THEN
        DELETE FROM {schema}.concurrency_holds h
        WHERE h.concurrency_key OPERATOR(pg_catalog.=) OLD.concurrency_key
          AND h.job_id OPERATOR(pg_catalog.=) OLD.id;
    ELSE
        DELETE FROM {schema}.job_due d WHERE d.job_id OPERATOR(pg_catalog.=) OLD.id;
    END IF;
    RETURN NULL;
END
$$;

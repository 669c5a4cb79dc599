-- The registered deadline of a (task, version) in seconds (NULL: none), for the enqueue fast
-- paths (job_insert_one, job_insert_batch). plpgsql, so that it is never inlined: a statement
-- that does not call it (its enqueuer gave a deadline, or registers the task itself) has no
-- task_defaults in its plan at all. As a join, the relation cost a single enqueue 1.08x the
-- backend CPU even when its one-time filter skipped the scan (bench/RESULTS.md, "Design
-- decisions").
CREATE OR REPLACE FUNCTION {schema}.task_deadline_seconds(task text, version integer)
RETURNS double precision
-- (Its qualified names: see db_now; called by single enqueues.)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT d.deadline_seconds FROM {schema}.task_defaults d
            WHERE d.task OPERATOR(pg_catalog.=) task_deadline_seconds.task
              AND d.version OPERATOR(pg_catalog.=) task_deadline_seconds.version);
END
$$;

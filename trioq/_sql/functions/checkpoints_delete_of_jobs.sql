-- The trigger of jobs_deleted (migration 0038; jobs_checkpoints_delete before it): a statement
-- that deletes jobs (`trioq purge`'s rows, `keep=False`'s completions) deletes what belongs to
-- them too, once per statement: checkpoints, attempts, messages, values and partition locks.
-- None of these has a foreign key to jobs: a row moved to its day's partition is a DELETE
-- from jobs_live, and a cascade would take a finishing job's history with it; a checkpoint's
-- per-row check was also a fifth of a checkpoint write. Every writer of them updates the job
-- row fenced first, so the job exists and stays locked until the write commits; a DELETE of
-- the job waits for that lock and this DELETE then sees the committed rows. A whole day
-- dropped by job_history_rotate() goes without them (they go with their id's epoch:
-- satellite_epochs_rotate()). A move between partitions fires no DELETE statement trigger.
-- Checkpoints are looked for only for jobs whose checkpoint_count says they have some (the
-- claim trusts it the same way to load a history), and partition locks only for jobs with a
-- partition key: a `keep=False` drain of plain jobs then runs neither DELETE (each starts
-- up a plan over every epoch's partition). Replayed `keep=False` drain: 0.96x the backend CPU
-- (three alternating runs, inside their spread; bench/RESULTS.md, "Satellites by epoch").
CREATE OR REPLACE FUNCTION {schema}.checkpoints_delete_of_jobs() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM deleted_jobs d WHERE d.checkpoint_count > 0) THEN
        DELETE FROM {schema}.checkpoints c USING deleted_jobs d
        WHERE d.checkpoint_count > 0 AND c.job_id = d.id;
    END IF;
    DELETE FROM {schema}.attempts a USING deleted_jobs d WHERE a.job_id = d.id;
    DELETE FROM {schema}.messages m USING deleted_jobs d WHERE m.job_id = d.id;
    DELETE FROM {schema}.workflow_values v USING deleted_jobs d WHERE v.job_id = d.id;
    IF EXISTS (SELECT 1 FROM deleted_jobs d WHERE d.partition_key IS NOT NULL) THEN
        DELETE FROM {schema}.partition_locks l USING deleted_jobs d
        WHERE d.partition_key IS NOT NULL AND l.job_id = d.id;
    END IF;
    RETURN NULL;
END
$$;

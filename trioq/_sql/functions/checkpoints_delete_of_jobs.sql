-- The trigger of jobs_checkpoints_delete (migration 0033): a statement that deletes jobs
-- (retention, purge) deletes their checkpoints too, once per statement. Checkpoints have no
-- foreign key to jobs: its per-row check was a fifth of a checkpoint write, and every writer
-- already updates the job row fenced first, so the job exists and stays locked until the
-- checkpoint commits; a DELETE of the job waits for that lock and this DELETE then sees the
-- committed checkpoints.
CREATE OR REPLACE FUNCTION {schema}.checkpoints_delete_of_jobs() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM {schema}.checkpoints c USING deleted_jobs d WHERE c.job_id = d.id;
    RETURN NULL;
END
$$;

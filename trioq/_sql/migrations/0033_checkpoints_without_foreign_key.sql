-- trioq schema, version 33: the checkpoints table loses its foreign key to jobs; a trigger on
-- jobs deletes a deleted job's checkpoints instead (what ON DELETE CASCADE did).
--
-- The key's check ran once per inserted checkpoint (a `SELECT ... FOR KEY SHARE` of the job
-- row through SPI): 0.19-0.21 of a checkpoint batch's 0.84-0.96 ms of execution for 25 writes
-- (EXPLAIN ANALYZE; bench/RESULTS.md, "3-step workflows: checkpoints without the foreign
-- key"), paid three times in every 3-step workflow. It checked nothing the writers do not
-- already: every statement that inserts a checkpoint (checkpoint_insert_many, the event,
-- receive, spawn and children writes) first updates the job row fenced by (id, attempt,
-- lease_token, running), so the job exists and stays locked until the insert commits. A
-- DELETE of that job waits for the lock; the trigger's own DELETE then runs with a newer
-- snapshot and removes the committed checkpoints too, as the cascade did.
-- One statement-level trigger per DELETE statement (retention and purge delete in batches),
-- where the cascade ran one row-level delete per job, with or without history.
-- Locks: ALTER TABLE ... DROP CONSTRAINT takes ACCESS EXCLUSIVE on checkpoints and jobs for
-- the catalog change only (no scan, no rewrite).
ALTER TABLE {schema}.checkpoints DROP CONSTRAINT checkpoints_job_id_fkey;

-- checkpoints_delete_of_jobs(): its current body is trioq/_sql/functions/checkpoints_delete_of_jobs.sql.

CREATE TRIGGER jobs_checkpoints_delete AFTER DELETE ON {schema}.jobs
REFERENCING OLD TABLE AS deleted_jobs
FOR EACH STATEMENT EXECUTE FUNCTION {schema}.checkpoints_delete_of_jobs();

-- trioq schema, version 37: dedup keys in a table of their own (docs/uniqueness.md, "How it
-- stays race-free"). The unique index jobs_dedup_key_idx covers one table; the storage change
-- puts ready, running and finished jobs in different tables (finished ones in partitions that
-- retention drops), so uniqueness moves first into `job_keys`: one row per key naming the job
-- that holds it. Every enqueue upserts its keys there (the primary key serialises two enqueuers
-- of one key) and inserts a job only for a key it won; a finished holder that no longer holds
-- its key hands the row over in the same upsert. jobs.dedup_key stays the key the job was
-- enqueued with; the key a job *holds* is the one job_keys names it for (job_records and
-- the dashboard read that).
--
-- UPGRADE: stop-migrate-start. Old workers' and producers' enqueue statements name the dropped
-- index (ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL) and fail once it is gone, and an
-- old enqueue running beside a new one would not see the other's keys: stop them all before
-- `trioq migrate`. The backfill reads every keyed job once (ACCESS EXCLUSIVE on jobs for the
-- DROP INDEX, after it).

-- Small, hot and updated in place on a hand-over (the key, its only indexed column, never
-- changes: the update is HOT when the page has room), like jobs: free space on each page and
-- an early vacuum; never truncated (migration 0024).
CREATE TABLE {schema}.job_keys (
    key    {schema}.job_dedup_key PRIMARY KEY,
    job_id bigint                 NOT NULL,
    task   {schema}.job_task      NOT NULL
) WITH (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    vacuum_truncate = off
);

-- Today the holders are exactly the jobs with a key: the index was unique and the enqueue that
-- took a released key set the old job's dedup_key to NULL.
INSERT INTO {schema}.job_keys (key, job_id, task)
SELECT dedup_key, id, task FROM {schema}.jobs WHERE dedup_key IS NOT NULL;

-- A deleted job (purge, retention, `keep=False`'s discard) gives its key up at once: the key row
-- always names a job that exists (or one a concurrent enqueue has not committed yet).
-- job_keys_delete_of_jobs(): its current body is trioq/_sql/functions/job_keys_delete_of_jobs.sql.
CREATE TRIGGER jobs_keys_delete AFTER DELETE ON {schema}.jobs
REFERENCING OLD TABLE AS deleted_jobs
FOR EACH STATEMENT EXECUTE FUNCTION {schema}.job_keys_delete_of_jobs();

-- The whole-row reader (migration 0036) shows the key a job holds: the one job_keys names it
-- for. A finished job whose key a newer job took reads no key, as when the enqueue cleared
-- its dedup_key (the same column, name and type: CREATE OR REPLACE keeps the view's readers).
CREATE OR REPLACE VIEW {schema}.job_records AS
SELECT j.id, j.queue, j.task, j.payload, j.state, j.priority, j.run_at, j.partition_key,
       (SELECT k.key FROM {schema}.job_keys k
        WHERE k.key = j.dedup_key AND k.job_id = j.id) AS dedup_key,
       j.attempt,
       coalesce(j.max_attempts, (SELECT d.max_attempts FROM {schema}.task_defaults d
                                 WHERE d.task = j.task AND d.version = j.version), 5)
           AS max_attempts,
       j.worker_id, j.result, j.error, j.created_at, j.started_at, j.finished_at, j.executions,
       j.deadline_at, j.deadline_source
FROM {schema}.jobs j;

DROP INDEX {schema}.jobs_dedup_key_idx;

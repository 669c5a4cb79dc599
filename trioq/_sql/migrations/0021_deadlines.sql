-- trioq schema, version 21: a whole-workflow deadline (`deadline=` at enqueue, or per task).
--
-- deadline_at: when the job (a workflow, across all its executions, retries, sleeps and waits)
-- must be finished; NULL for the jobs without one, which every statement below skips, so they
-- pay nothing. deadline_source says who set it, for the stored error: 'set at enqueue',
-- 'set by task <name>', 'inherited from job <id>'. Adding nullable columns without a default
-- rewrites no row.
ALTER TABLE {schema}.jobs
    ADD COLUMN deadline_at timestamptz,
    ADD COLUMN deadline_source text;

-- The leader's deadline pass (job_deadline_pass) reads this index only: the unfinished jobs
-- with a deadline that are not already being cancelled, in deadline order. Jobs without a
-- deadline are not in it at all.
CREATE INDEX jobs_deadline_idx ON {schema}.jobs (deadline_at)
    WHERE deadline_at IS NOT NULL AND NOT cancel_requested
      AND state IN ('scheduled', 'ready', 'running', 'sleeping', 'waiting');

-- deadline_error(): its current body is trioq/_sql/functions/deadline_error.sql.

-- job_deadline_pass(): its current body is trioq/_sql/functions/job_deadline_pass.sql.

-- The SQL enqueue gains `deadline` (an absolute time; NULL: none). A new argument changes the
-- signature, so the function is dropped and created again; calls from before keep working
-- (the new argument is last).
DROP FUNCTION IF EXISTS {schema}.enqueue(text, jsonb, text, timestamptz, smallint, text, text, integer,
                               interval, text[], text);

-- enqueue(): its current body is trioq/_sql/functions/enqueue.sql.

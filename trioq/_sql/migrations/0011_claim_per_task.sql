-- The claim's unkeyed source probes the ready rows of each served task in claim order
-- (so a backlog of a task no worker serves is never scanned by a claim). This index
-- replaces jobs_ready_unkeyed_idx, which the claim no longer reads; the queue-wide readers
-- (status, demand) use its (queue) prefix.
CREATE INDEX jobs_ready_task_idx ON {schema}.jobs (queue, task, priority, run_at, id)
    WHERE state = 'ready' AND partition_key IS NULL;
DROP INDEX {schema}.jobs_ready_unkeyed_idx;

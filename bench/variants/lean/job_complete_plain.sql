-- The least a completion does on trioq's tables: the runs fenced by attempt and token
-- deleted, the outcomes appended. No reply, no result notification, no function.
WITH gone AS (
    DELETE FROM {schema}.job_runs u
    USING unnest(%(ids)s::bigint[], %(attempts)s::int[], %(lease_tokens)s::uuid[],
                 %(results)s::text[]) AS i(id, attempt, lease_token, result)
    WHERE u.job_id = i.id AND u.attempt = i.attempt AND u.lease_token = i.lease_token
    RETURNING u.job_id, u.attempt, u.executions, u.worker_id, u.started_at, u.queue, i.result
)
INSERT INTO {schema}.job_outcomes (job_id, state, result, error, attempt, executions,
    worker_id, started_at, finished_at, queue)
SELECT g.job_id, 'completed', g.result::jsonb, NULL, g.attempt, g.executions, g.worker_id,
    g.started_at, now(), g.queue
FROM gone g

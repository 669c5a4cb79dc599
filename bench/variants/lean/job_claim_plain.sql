-- The least a plain claim does on trioq's tables (bench/statement_variants.py): the ring's
-- entries of 'noop' jobs taken in claim order and deleted, a run written per job, the claimed
-- rows returned in job_claim_plain's columns. No probe, served-task list, pause, version or
-- ring-slot check, no lock of the record, no history.
WITH cand AS MATERIALIZED (
    SELECT c.ctid AS t, c.id FROM {schema}.ready_ring c
    WHERE c.queue = %(queue)s::text AND c.task = 'noop' AND c.run_at <= now()
    ORDER BY c.priority, c.run_at, c.id LIMIT %(limit)s::int FOR UPDATE SKIP LOCKED
),
taken AS (
    DELETE FROM {schema}.ready_ring r
    WHERE r.ctid = ANY(ARRAY(SELECT t FROM cand)) AND r.id = ANY(ARRAY(SELECT id FROM cand))
    RETURNING r.id
),
run AS (
    INSERT INTO {schema}.job_runs (job_id, attempt, lease_token, lease_expires_at, worker_id,
        traced, started_at, executions, queue, partition_key, concurrency_key, parent_id,
        result_watched)
    SELECT j.id, j.attempt + 1, gen_random_uuid(), now() + %(lease_seconds)s::float8 * interval '1 second',
        %(worker_id)s::uuid, false, now(), j.executions + 1, j.queue, NULL, NULL, j.parent_id,
        j.result_watched
    FROM taken t JOIN {schema}.job_rows j ON j.id = t.id
    RETURNING job_id, attempt, lease_token
)
SELECT NULL::bool AS blocked, NULL::bool AS keyed_ready, 0 AS promoted, now() AS now,
    NULL::timestamptz AS next_due, NULL::text AS concurrency_cursor,
    j.id, j.queue::text, j.task::text, j.payload::jsonb, u.attempt, j.max_attempts::int, u.lease_token,
    j.partition_key::text, j.priority, j.run_at, j.created_at, j.cancel_requested, j.version::int,
    NULL::jsonb AS history, j.parent_id, j.concurrency_key::text
FROM run u JOIN {schema}.job_rows j ON j.id = u.job_id

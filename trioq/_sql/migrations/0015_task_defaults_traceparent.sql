-- trioq schema, version 15: a job without an explicit max_attempts takes the declaration of the
-- worker that runs it, and `{schema}.enqueue(...)` takes the caller's trace context.

-- NULL max_attempts: the enqueuer gave none (a producer enqueuing by name, a declaration that
-- sets none, plain SQL), so the task's declaration on the worker decides (docs/producers.md,
-- "Which option wins"). Dropping NOT NULL and the default changes no row and scans nothing.
ALTER TABLE {schema}.jobs
    ALTER COLUMN max_attempts DROP NOT NULL,
    ALTER COLUMN max_attempts DROP DEFAULT;

-- Each worker writes the max_attempts its declarations give to every (task, version) it
-- serves when it registers (worker_register), so that statements without the worker's code
-- apply the same number to rows without one: lease recovery (a job whose worker died is
-- failed or retried by the leader), `trioq job` / `trioq jobs` / `explain`, and redrive. The
-- last worker to register a (task, version) wins; a task nobody declared counts 5. A small
-- table, read by primary key.
CREATE TABLE {schema}.task_defaults (
    task         text        NOT NULL,
    version      integer     NOT NULL,
    max_attempts integer     NOT NULL CHECK (max_attempts BETWEEN 1 AND 1000),
    declared_at  timestamptz NOT NULL,
    PRIMARY KEY (task, version)
);

-- The SQL enqueue gains `traceparent` (the caller's W3C trace context, stored in
-- jobs.trace_context so the handler's span links to it) and leaves max_attempts NULL unless
-- given. A new argument changes the signature, so the function is dropped and created again;
-- calls by name or by position from before keep working (the new argument is last).
DROP FUNCTION {schema}.enqueue(text, jsonb, text, timestamptz, smallint, text, text, integer,
                               interval, text[]);

CREATE FUNCTION {schema}.enqueue(
    task          text,
    payload       jsonb       DEFAULT 'null',
    queue         text        DEFAULT 'default',
    run_at        timestamptz DEFAULT NULL,
    priority      smallint    DEFAULT 0,
    partition_key text        DEFAULT NULL,
    dedup_key     text        DEFAULT NULL,
    max_attempts  integer     DEFAULT NULL,
    unique_for    interval    DEFAULT NULL,
    unique_states text[]      DEFAULT NULL,
    traceparent   text        DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    job_id bigint;
    due    timestamptz := coalesce(enqueue.run_at, {schema}.db_now());
    held   text[] := CASE WHEN enqueue.dedup_key IS NULL THEN '{}'
                          WHEN enqueue.unique_states IS NOT NULL
                              THEN ARRAY(SELECT s FROM unnest(enqueue.unique_states) AS s
                                         WHERE s IN ('completed', 'failed', 'cancelled'))
                          WHEN enqueue.unique_for IS NOT NULL THEN ARRAY['completed']
                          ELSE '{}' END;
BEGIN
    -- The W3C form (version-traceid-parentid-flags, lower-case hex): anything else would only
    -- be dropped, unlinked, by the worker's propagator much later.
    IF enqueue.traceparent IS NOT NULL
       AND enqueue.traceparent !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN
        RAISE EXCEPTION 'traceparent: % is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)',
            enqueue.traceparent USING ERRCODE = '22023';
    END IF;
    IF enqueue.dedup_key IS NOT NULL THEN
        UPDATE {schema}.jobs j SET dedup_key = NULL
        WHERE j.dedup_key = enqueue.dedup_key
          AND j.state IN ('completed', 'failed', 'cancelled')
          AND NOT (j.state = ANY(j.unique_states)
                   AND (j.unique_until IS NULL OR j.unique_until > {schema}.db_now()));
    END IF;
    -- A job due later is `scheduled` (migration 0002's state model), promoted when due.
    INSERT INTO {schema}.jobs AS j (queue, task, payload, state, priority, run_at,
                                   partition_key, dedup_key, max_attempts, created_at,
                                   unique_states, unique_until, trace_context)
    VALUES (enqueue.queue, enqueue.task, enqueue.payload,
            CASE WHEN due > {schema}.db_now() THEN 'scheduled' ELSE 'ready' END,
            enqueue.priority, due,
            enqueue.partition_key, enqueue.dedup_key, enqueue.max_attempts, {schema}.db_now(),
            held, CASE WHEN enqueue.dedup_key IS NOT NULL
                       THEN {schema}.db_now() + enqueue.unique_for END,
            enqueue.traceparent)
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL
    DO UPDATE SET dedup_key = excluded.dedup_key
    RETURNING j.id INTO job_id;
    IF due <= {schema}.db_now() THEN
        PERFORM pg_notify({schema}.ready_channel(enqueue.queue), enqueue.queue);
    END IF;
    RETURN job_id;
END
$$;

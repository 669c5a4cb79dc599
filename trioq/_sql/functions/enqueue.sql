-- Enqueue from SQL (a trigger, a procedure, any stack), inside the caller's transaction, with
-- the options of the Python enqueue (docs/producers.md, "From SQL"). Returns the job's id, or
-- the id of the job of the same task holding `dedup_key` (docs/uniqueness.md; one of another
-- task refuses the enqueue). A job is `scheduled` when due
-- later, else `ready`; its queue's ready notification is sent either way (when the caller's
-- transaction commits), as the Python statements do, so an idle worker's timer follows a job
-- due later instead of finding it at its next poll.
CREATE OR REPLACE FUNCTION {schema}.enqueue(
    task              text,
    payload           jsonb       DEFAULT 'null',
    queue             text        DEFAULT 'default',
    run_at            timestamptz DEFAULT NULL,
    priority          smallint    DEFAULT 0,
    partition_key     text        DEFAULT NULL,
    dedup_key         text        DEFAULT NULL,
    max_attempts      integer     DEFAULT NULL,
    unique_for        interval    DEFAULT NULL,
    unique_states     text[]      DEFAULT NULL,
    traceparent       text        DEFAULT NULL,
    deadline          timestamptz DEFAULT NULL,
    concurrency_key   text        DEFAULT NULL,
    concurrency_limit integer     DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
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
    job_deadline        timestamptz := enqueue.deadline;
    job_deadline_source text := CASE WHEN enqueue.deadline IS NOT NULL THEN 'set at enqueue' END;
    holder_task text;
    new_id      bigint := nextval('{schema}.jobs_id_seq');
    released    bigint;
BEGIN
    PERFORM {schema}.payload_check(enqueue.payload, '$');
    -- The W3C form (version-traceid-parentid-flags, lower-case hex): anything else would only
    -- be dropped, unlinked, by the worker's propagator much later.
    IF enqueue.traceparent IS NOT NULL
       AND enqueue.traceparent !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN
        RAISE EXCEPTION 'traceparent: % is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)',
            enqueue.traceparent USING ERRCODE = '22023';
    END IF;
    IF enqueue.deadline IS NOT NULL AND enqueue.deadline <= {schema}.db_now() THEN
        RAISE EXCEPTION 'deadline: % has passed (give a future timestamptz)',
            enqueue.deadline USING ERRCODE = '22023';
    END IF;
    IF enqueue.concurrency_key IS NOT NULL AND enqueue.partition_key IS NOT NULL THEN
        RAISE EXCEPTION 'concurrency_key: give a partition_key or a concurrency_key, not both'
            USING ERRCODE = '22023';
    END IF;
    IF enqueue.concurrency_key IS NOT NULL
       AND length(enqueue.concurrency_key) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'concurrency_key: must be 1 to 512 characters' USING ERRCODE = '22023';
    END IF;
    IF enqueue.concurrency_limit IS NOT NULL
       AND enqueue.concurrency_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'concurrency_limit: % must be a whole number from 1 to 10000',
            enqueue.concurrency_limit USING ERRCODE = '22023';
    END IF;
    -- No deadline given: the task's, as its workers registered it (version 1: this function
    -- enqueues for the default handler version).
    IF job_deadline IS NULL THEN
        SELECT {schema}.db_now() + d.deadline_seconds * interval '1 second',
               'set by task ' || d.task
        INTO job_deadline, job_deadline_source
        FROM {schema}.task_defaults d
        WHERE d.task = enqueue.task AND d.version = 1 AND d.deadline_seconds IS NOT NULL;
    END IF;
    -- The key, as job_insert_many takes it (its comment says why each step): the finished
    -- holder that no longer holds the key is share-locked first (before the key row, the
    -- deleters' order; FOR SHARE re-checks its latest version, so a holder retried meanwhile
    -- keeps its key), then the key row is upserted and names its holder. A holder this
    -- statement cannot see (a concurrent enqueuer's, committed after it began) is never
    -- `released`: it counts as holding.
    IF enqueue.dedup_key IS NOT NULL THEN
        SELECT h.id INTO released
        FROM {schema}.job_keys k
        JOIN {schema}.job_outcomes o ON o.job_id = k.job_id
        JOIN {schema}.job_rows h ON h.id = k.job_id
        WHERE k.key = enqueue.dedup_key
          AND {schema}.job_key_released(o.state, h.unique_states, h.unique_until)
        FOR SHARE OF o;
        INSERT INTO {schema}.job_keys AS k (key, job_id, task)
        VALUES (enqueue.dedup_key, new_id, enqueue.task)
        ON CONFLICT (key) DO UPDATE
        SET job_id = CASE WHEN k.job_id = released THEN excluded.job_id ELSE k.job_id END,
            task = CASE WHEN k.job_id = released THEN excluded.task ELSE k.task END
        RETURNING k.job_id, k.task INTO job_id, holder_task;
        -- A key held by a job of another task: refused, not that job (docs/uniqueness.md).
        IF holder_task <> enqueue.task THEN
            PERFORM {schema}.dedup_key_refuse(enqueue.dedup_key, enqueue.task, job_id,
                                              holder_task);
        END IF;
    END IF;
    -- A job due later is `scheduled` (migration 0002's state model), promoted when due.
    IF job_id IS NULL OR job_id = new_id THEN
        -- Its row (queries.sql keeps every writer's rows beside the one insert).
        WITH new_jobs AS (
            -- include: enqueue_new_jobs
        )
        -- include: job_insert(job_rows)
        ;
        job_id := new_id;
    END IF;
    -- Also for a job due later: the queue's idle workers wake, read its due time and set
    -- their timers to it, as they do for the Python statements' delayed jobs.
    PERFORM pg_notify({schema}.ready_channel(enqueue.queue), enqueue.queue);
    RETURN job_id;
END
$$;

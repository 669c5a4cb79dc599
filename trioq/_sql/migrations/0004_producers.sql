-- trioq schema, version 4: uniqueness that ends (unique_states, unique_until), paused queues,
-- and `{schema}.enqueue(...)`, the enqueue any language or trigger can call.

-- A job with a dedup_key holds it while unfinished; once finished it keeps holding it only in
-- the finished states listed in unique_states, and then only until unique_until (NULL: until
-- the job is pruned). The next enqueue of the key releases a key no longer held (see the
-- job_insert_many block in queries.sql). Old rows get '{}': their key frees when they finish.
ALTER TABLE {schema}.jobs
    ADD COLUMN unique_states text[] NOT NULL DEFAULT '{}'
        CHECK (unique_states <@ ARRAY['completed', 'failed', 'cancelled']),
    ADD COLUMN unique_until timestamptz;

-- `trioq queue pause NAME`: claims of a queue with a row here return nothing until it is
-- deleted (`trioq queue resume NAME`). Enqueue still works; jobs wait.
CREATE TABLE {schema}.queue_pauses (
    queue     text        PRIMARY KEY CHECK (queue ~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$'),
    paused_at timestamptz NOT NULL
);

-- Enqueue from SQL, inside the caller's transaction (a trigger, another language, psql):
--   SELECT {schema}.enqueue('send_reply', '{"conversation_id": "c1"}', queue => 'mail');
-- Returns the job id; with a dedup_key that is taken, the id of the job holding it. The same
-- rules as job_insert_many: the key is released first when its holder no longer holds it, and
-- the ready notification is sent only if the caller's transaction commits. The payload is not
-- checked against a payload class (there is no Python here): the handler's structuring does.
CREATE FUNCTION {schema}.enqueue(
    task          text,
    payload       jsonb       DEFAULT 'null',
    queue         text        DEFAULT 'default',
    run_at        timestamptz DEFAULT NULL,
    priority      smallint    DEFAULT 0,
    partition_key text        DEFAULT NULL,
    dedup_key     text        DEFAULT NULL,
    max_attempts  integer     DEFAULT 5,
    unique_for    interval    DEFAULT NULL,
    unique_states text[]      DEFAULT NULL
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
                                   unique_states, unique_until)
    VALUES (enqueue.queue, enqueue.task, enqueue.payload,
            CASE WHEN due > {schema}.db_now() THEN 'scheduled' ELSE 'ready' END,
            enqueue.priority, due,
            enqueue.partition_key, enqueue.dedup_key, enqueue.max_attempts, {schema}.db_now(),
            held, CASE WHEN enqueue.dedup_key IS NOT NULL
                       THEN {schema}.db_now() + enqueue.unique_for END)
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL
    DO UPDATE SET dedup_key = excluded.dedup_key
    RETURNING j.id INTO job_id;
    IF due <= {schema}.db_now() THEN
        PERFORM pg_notify({schema}.ready_channel(enqueue.queue), enqueue.queue);
    END IF;
    RETURN job_id;
END
$$;

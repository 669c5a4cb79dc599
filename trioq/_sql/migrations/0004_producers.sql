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

-- enqueue(): its current body is trioq/_sql/functions/enqueue.sql.

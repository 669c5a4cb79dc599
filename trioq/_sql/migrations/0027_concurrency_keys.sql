-- trioq schema, version 27: concurrency keys with a limit (docs/flow-control.md): at most N
-- running jobs per key, across every queue and worker. Partition keys stay the N = 1, ordered
-- case; a job has one kind of key or the other.

-- Nullable columns without a default rewrite nothing; live rows get no key. The CHECKs read
-- every row once (all NULL).
ALTER TABLE {schema}.jobs
    ADD COLUMN concurrency_key   text    CHECK (length(concurrency_key) BETWEEN 1 AND 512),
    -- The enqueuer's (its task's) limit; a row of concurrency_limits matching the key wins.
    ADD COLUMN concurrency_limit integer CHECK (concurrency_limit BETWEEN 1 AND 10000),
    ADD CONSTRAINT jobs_one_kind_of_key CHECK (partition_key IS NULL OR concurrency_key IS NULL);

-- The unkeyed claim source must not see concurrency-keyed rows: its index gains the predicate
-- (same columns, same scan; the claim's unkeyed_scan repeats the condition so the planner can
-- match it). Built before the old one goes, so no claim runs without an index.
CREATE INDEX jobs_ready_task_unkeyed_idx ON {schema}.jobs (queue, task, priority, run_at, id)
    WHERE state = 'ready' AND partition_key IS NULL AND concurrency_key IS NULL;
DROP INDEX {schema}.jobs_ready_task_idx;
ALTER INDEX {schema}.jobs_ready_task_unkeyed_idx RENAME TO jobs_ready_task_idx;

-- The claim's loose index scan over the keys with ready rows (one probe per key), and each
-- key's ready rows in claim order.
CREATE INDEX jobs_concurrency_ready_idx
    ON {schema}.jobs (queue, concurrency_key, priority, run_at, id)
    WHERE state = 'ready' AND concurrency_key IS NOT NULL;

-- One row per running job that holds a concurrency key: slot 0 .. limit-1 of its key. The
-- primary key is the atomic part: a claim takes a slot by inserting its row (ON CONFLICT DO
-- NOTHING), so two workers whose snapshots both saw a slot free never both take it; a claim
-- whose insert did nothing does not claim that job. Rows are removed by the trigger below, in
-- the transaction that moves the job out of `running` (any statement: settle, lease recovery,
-- suspension, cancel, purge), so no path can leak a hold.
CREATE TABLE {schema}.concurrency_holds (
    concurrency_key text    NOT NULL,
    slot            integer NOT NULL CHECK (slot >= 0),
    job_id          bigint  NOT NULL,
    PRIMARY KEY (concurrency_key, slot)
);

-- Limits set by operators (`trioq key limit PATTERN N`) or code (`client.set_key_limit`): a
-- pattern is a whole key (`tenant:42`) or a prefix ending in `*` (`tenant:*`); the longest
-- matching pattern wins over the job's own concurrency_limit. A small table, read per key the
-- claim visits.
CREATE TABLE {schema}.concurrency_limits (
    pattern     text        PRIMARY KEY
                            CHECK (length(pattern) BETWEEN 1 AND 512
                                   AND position('*' IN left(pattern, -1)) = 0),
    max_running integer     NOT NULL CHECK (max_running BETWEEN 1 AND 10000),
    updated_at  timestamptz NOT NULL
);

-- The limit that applies to `key`: the longest matching pattern (the whole key before a
-- prefix of the same length), else the job's own limit, else 1 (a key nobody gave a limit runs one job at a time).
CREATE FUNCTION {schema}.concurrency_limit_of(key text, job_limit integer) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT l.max_running FROM {schema}.concurrency_limits l
         WHERE l.pattern = key
            OR (right(l.pattern, 1) = '*' AND starts_with(key, left(l.pattern, -1)))
         ORDER BY length(l.pattern) DESC, right(l.pattern, 1) = '*' LIMIT 1),
        job_limit, 1)
$$;

-- Releases a key's slot when its job stops running. The WHEN clause is checked per updated
-- row without calling the function, so a job without a concurrency key pays one comparison.
CREATE FUNCTION {schema}.concurrency_release() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {schema}.concurrency_holds h
    WHERE h.concurrency_key = OLD.concurrency_key AND h.job_id = OLD.id;
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_concurrency_release_update AFTER UPDATE OF state ON {schema}.jobs
    FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL AND OLD.state = 'running' AND NEW.state <> 'running')
    EXECUTE FUNCTION {schema}.concurrency_release();
CREATE TRIGGER jobs_concurrency_release_delete AFTER DELETE ON {schema}.jobs
    FOR EACH ROW WHEN (OLD.concurrency_key IS NOT NULL AND OLD.state = 'running')
    EXECUTE FUNCTION {schema}.concurrency_release();

-- The SQL enqueue gains `concurrency_key` and `concurrency_limit` (last, after migration
-- 0021's `deadline`, so calls by name or position from before keep working); the signature
-- changes, so it is dropped and created.
DROP FUNCTION {schema}.enqueue(text, jsonb, text, timestamptz, smallint, text, text, integer,
                               interval, text[], text, timestamptz);

CREATE FUNCTION {schema}.enqueue(
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
                                   unique_states, unique_until, trace_context,
                                   concurrency_key, concurrency_limit, deadline_at,
                                   deadline_source)
    VALUES (enqueue.queue, enqueue.task, enqueue.payload,
            CASE WHEN due > {schema}.db_now() THEN 'scheduled' ELSE 'ready' END,
            enqueue.priority, due,
            enqueue.partition_key, enqueue.dedup_key, enqueue.max_attempts, {schema}.db_now(),
            held, CASE WHEN enqueue.dedup_key IS NOT NULL
                       THEN {schema}.db_now() + enqueue.unique_for END,
            enqueue.traceparent, enqueue.concurrency_key, enqueue.concurrency_limit,
            enqueue.deadline, CASE WHEN enqueue.deadline IS NOT NULL THEN 'set at enqueue' END)
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL
    DO UPDATE SET dedup_key = excluded.dedup_key
    RETURNING j.id INTO job_id;
    IF due <= {schema}.db_now() THEN
        PERFORM pg_notify({schema}.ready_channel(enqueue.queue), enqueue.queue);
    END IF;
    RETURN job_id;
END
$$;

-- queue_probe (migration 0010) reads the ready rows through the claim's partial indexes: the
-- unkeyed one now leaves concurrency-keyed rows out, so they get a probe of their own.
CREATE OR REPLACE FUNCTION {schema}.queue_probe(queues text[])
RETURNS TABLE (queue text, work_due boolean, next_due timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT q.queue,
           EXISTS (SELECT 1 FROM {schema}.jobs j
                   WHERE j.queue = q.queue AND j.state = 'ready' AND j.partition_key IS NULL
                     AND j.concurrency_key IS NULL)
           OR EXISTS (SELECT 1 FROM {schema}.jobs j
                      WHERE j.queue = q.queue AND j.state = 'ready'
                        AND j.partition_key IS NOT NULL)
           OR EXISTS (SELECT 1 FROM {schema}.jobs j
                      WHERE j.queue = q.queue AND j.state = 'ready'
                        AND j.concurrency_key IS NOT NULL)
           OR coalesce(d.run_at <= {schema}.db_now(), false),
           CASE WHEN d.run_at > {schema}.db_now() THEN d.run_at END
    FROM unnest(queues) WITH ORDINALITY AS q(queue, ord)
    LEFT JOIN LATERAL (
        SELECT j.run_at FROM {schema}.jobs j
        WHERE j.queue = q.queue AND j.state IN ('scheduled', 'sleeping', 'waiting')
          AND j.run_at IS NOT NULL
        ORDER BY j.run_at LIMIT 1
    ) AS d ON true
    ORDER BY q.ord
$$;

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

-- concurrency_limit_of(): its current body is trioq/_sql/functions/concurrency_limit_of.sql.

-- concurrency_release(): its current body is trioq/_sql/functions/concurrency_release.sql.
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
DROP FUNCTION IF EXISTS {schema}.enqueue(text, jsonb, text, timestamptz, smallint, text, text, integer,
                               interval, text[], text, timestamptz);

-- enqueue(): its current body is trioq/_sql/functions/enqueue.sql.

-- queue_probe(): its current body is trioq/_sql/functions/queue_probe.sql.

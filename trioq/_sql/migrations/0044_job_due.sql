-- trioq schema, version 44: the scheduled, sleeping and waiting jobs are filed in a narrow table
-- of their own, job_due, kept exact by triggers on jobs_live; the claims' promotion, their
-- next due time, the probes and the pages read it instead of jobs_live's two partial indexes
-- (docs/concepts.md, "Storage").
--
-- Why: the job records are to be partitioned by id epoch (bench/plans/write_once_layout.md),
-- and a partial index on every epoch cannot serve a claim (an ORDER BY run_at LIMIT over N
-- partitions is a MergeAppend of N probes). A table of the due rows alone, unpartitioned,
-- serves it with one probe whatever the layout of the records.
--
-- job_due: one row per jobs_live row in state scheduled, sleeping or waiting, with only what
-- the readers choose rows by: `queue` and `run_at` (the claim's promotion and next due time,
-- the probes: index (queue, run_at)), `state` (the pages count and list by it: index (state,
-- job_id), newest first). Everything else is read from the job's row by primary key, which
-- a claim locks anyway before it promotes or claims. `run_at` is NULL for a wait without a
-- timeout (listed and counted, never promoted by time).
--
-- The triggers (functions/jobs_live_file.sql, functions/jobs_live_left.sql):
--  * job_due_filed_insert: a row inserted due (a delayed enqueue, a delayed spawn) is filed;
--    ready_ring_filed_insert stays as it was, so an enqueue of a ready job checks the same
--    one WHEN as before.
--  * jobs_live_filed replaces ready_ring_filed_update: one WHEN for both tables (an INSERT
--    trigger's WHEN cannot read OLD, so the inserts keep a trigger of their own). A claim of
--    a ready job (ready -> running) fails its first two comparisons and calls nothing.
--  * jobs_live_left replaces jobs_concurrency_release_delete, on jobs_live only: a row that
--    leaves jobs_live (a final state moves it to its day: PostgreSQL fires AFTER DELETE on
--    the partition it leaves, not AFTER UPDATE; a DELETE) leaves job_due when it was due, and
--    releases its concurrency slot when it ran with a key. Running rows never lived in the
--    other partitions (their CHECKs), so their copies of the old trigger checked a WHEN for
--    nothing, and a completion still checks one WHEN.
--
-- Online: this transaction is quick (an empty table, three triggers swapped under jobs_live's
-- lock). Migration 0045 files the due rows already there, in batches; 0046 drops the two
-- partial indexes. A worker of the previous release promotes and claims through jobs_live's
-- indexes until 0046, and its writes file job_due through the triggers like anyone's.
CREATE TABLE {schema}.job_due (
    job_id bigint PRIMARY KEY,
    queue  text NOT NULL,
    state  text NOT NULL CHECK (state IN ('scheduled', 'sleeping', 'waiting')),
    run_at timestamptz
)
-- A row per delay, sleep and wait, deleted when it ends: vacuumed as often as jobs_live, and
-- never truncated (its ACCESS EXCLUSIVE lock would stall the claims: migration 0024).
WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
      autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02,
      autovacuum_vacuum_cost_delay = 1, vacuum_truncate = off);
CREATE INDEX job_due_queue_idx ON {schema}.job_due (queue, run_at);
CREATE INDEX job_due_state_idx ON {schema}.job_due (state, job_id);

-- The triggers write job_due with the privileges of whoever writes jobs (their functions run
-- as the caller): a producer's event_emit(), send() or cancel ends a wait and deletes its row,
-- which the producer role may not do anywhere else (docs/operations.md, "Roles: least
-- privilege"). So a role that may write jobs may write job_due, and one that may read jobs
-- may read it, whatever the schema's default privileges gave it: its grants follow jobs's.
DO $$
DECLARE
    grant_row record;
BEGIN
    FOR grant_row IN
        SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                             ELSE quote_ident(pg_get_userbyid(a.grantee)) END AS grantee,
               a.privilege_type <> 'SELECT' AS writes
        FROM pg_class c, aclexplode(c.relacl) a
        WHERE c.oid = '{schema}.jobs'::regclass AND a.grantee <> c.relowner
          AND a.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE')
    LOOP
        EXECUTE format('GRANT %s ON {schema}.job_due TO %s',
                       CASE WHEN grant_row.writes THEN 'SELECT, INSERT, UPDATE, DELETE'
                            ELSE 'SELECT' END,
                       grant_row.grantee);
    END LOOP;
END
$$;

DROP TRIGGER ready_ring_filed_update ON {schema}.jobs_live;
CREATE TRIGGER job_due_filed_insert AFTER INSERT ON {schema}.jobs_live
    FOR EACH ROW WHEN (new.state IN ('scheduled', 'sleeping', 'waiting'))
    EXECUTE FUNCTION {schema}.jobs_live_file();
-- The first line is the claim's way out (ready -> running), in two comparisons; then a row
-- turning ready with no key (the ring), or a row entering, leaving or moving within the due
-- states (job_due). A statement that writes a due row's state or run_at unchanged (a parent's
-- children count, `state = CASE ... ELSE state END`) calls nothing.
CREATE TRIGGER jobs_live_filed AFTER UPDATE OF state, run_at ON {schema}.jobs_live
    FOR EACH ROW WHEN ((new.state <> 'running' OR old.state <> 'ready')
                       AND ((new.state = 'ready' AND old.state <> 'ready'
                             AND new.partition_key IS NULL AND new.concurrency_key IS NULL)
                            OR ((old.state IN ('scheduled', 'sleeping', 'waiting')
                                 OR new.state IN ('scheduled', 'sleeping', 'waiting'))
                                AND (new.state <> old.state
                                     OR new.run_at IS DISTINCT FROM old.run_at))))
    EXECUTE FUNCTION {schema}.jobs_live_file();
DROP TRIGGER jobs_concurrency_release_delete ON {schema}.jobs;
CREATE TRIGGER jobs_live_left AFTER DELETE ON {schema}.jobs_live
    FOR EACH ROW WHEN ((old.state = 'running' AND old.concurrency_key IS NOT NULL)
                       OR old.state IN ('scheduled', 'sleeping', 'waiting'))
    EXECUTE FUNCTION {schema}.jobs_live_left();

-- Migration 0045's batches, here because a no-transaction migration holds no `$$` body; a
-- procedure, so that it commits each batch (and so it pins no search_path: a procedure with
-- a SET clause cannot commit; every name in it is qualified). 0046 drops it.
-- A batch: the next due rows of jobs_live in id order that job_due lacks, each locked FOR
-- SHARE with SKIP LOCKED and inserted ON CONFLICT DO NOTHING. The lock is what keeps a copy
-- exact: a writer that changed the row after this statement's snapshot has committed (in READ
-- COMMITTED the lock then rechecks `state` on the row's newest version and leaves out a row
-- no longer due, which its writer's trigger already left out of job_due), or it is still
-- running and the row is skipped (its trigger files it), or it comes after the commit and
-- its trigger sees the copy. A row skipped and still due is taken by a later pass: passes run
-- until no due row lacks its copy, waiting 50 ms after a pass that copied nothing (every
-- missing row held by a writer). Safe to run again: a filed row is never read again.
CREATE PROCEDURE {schema}.job_due_fill(batch_size integer DEFAULT 10000)
LANGUAGE plpgsql AS $$
DECLARE
    cursor_id bigint;
    last_id bigint;
    copied bigint;
    pass_copied bigint;
BEGIN
    LOOP
        cursor_id := -9223372036854775808;
        pass_copied := 0;
        LOOP
            WITH filed AS (
                INSERT INTO {schema}.job_due (job_id, queue, state, run_at)
                SELECT j.id, j.queue, j.state, j.run_at FROM {schema}.jobs_live j
                WHERE j.id OPERATOR(pg_catalog.>) cursor_id
                  AND j.state OPERATOR(pg_catalog.=) ANY ('{scheduled,sleeping,waiting}'::pg_catalog.text[])
                  AND NOT EXISTS (SELECT 1 FROM {schema}.job_due d
                                  WHERE d.job_id OPERATOR(pg_catalog.=) j.id)
                ORDER BY j.id LIMIT batch_size
                FOR SHARE OF j SKIP LOCKED
                ON CONFLICT (job_id) DO NOTHING
                RETURNING job_id
            )
            SELECT pg_catalog.max(job_id), pg_catalog.count(*) INTO last_id, copied FROM filed;
            COMMIT;
            EXIT WHEN copied OPERATOR(pg_catalog.=) 0;
            cursor_id := last_id;
            pass_copied := pass_copied OPERATOR(pg_catalog.+) copied;
        END LOOP;
        EXIT WHEN NOT EXISTS (
            SELECT 1 FROM {schema}.jobs_live j
            WHERE j.state OPERATOR(pg_catalog.=) ANY ('{scheduled,sleeping,waiting}'::pg_catalog.text[])
              AND NOT EXISTS (SELECT 1 FROM {schema}.job_due d
                              WHERE d.job_id OPERATOR(pg_catalog.=) j.id));
        IF pass_copied OPERATOR(pg_catalog.=) 0 THEN
            PERFORM pg_catalog.pg_sleep(0.05);
        END IF;
    END LOOP;
END
$$;

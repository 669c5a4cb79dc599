-- Leases in a narrow table of their own, `job_runs` (bench/plans/write_once_layout.md, stage 5):
-- a claim of a ready job writes no new version of the job's wide row. It locks the job's ring
-- entry and its row (SKIP LOCKED, both: the plan's race) and inserts the run; the completion
-- deletes the run (fenced by attempt + lease token) and moves the row to its day as before.
-- "running" now means "has a job_runs row". The table keeps what the wide row held in place
-- while a job ran; the row keeps `phase`, its state as last written in place:
--   scheduled | ready | claimed | sleeping | waiting | completed | failed | cancelled
-- (`claimed`: a keyed or due job claimed by the full claim, which still writes its row, so it
-- leaves the keyed partial indexes until stage 3 replaces them, and job_due (migration 0044)
-- through its trigger; a job claimed from the ring keeps `ready`). `state` is renamed so that every reader is revisited:
-- the derived state is `CASE WHEN run THEN 'running' ELSE phase END` (queries.sql, fragment
-- job_state), which the `jobs` view below spells out too.
-- `filed` counts the row's moves into ready in place; the ring entry carries it, and a claim
-- takes an entry only while the row's count still matches (an entry filed before the job ran
-- and came back is stale even when the row reads ready again).
--
-- The table itself becomes `job_rows_legacy`, the name of what stage 6 replaces with
-- epoch-partitioned `job_rows`; `jobs` becomes a read-only view over it and job_runs with the
-- columns docs/api.md lists (and the lease columns), for tools. Its partitions keep their
-- names (jobs_live, jobs_unfiled, jobs_d<day>, jobs_before).
--
-- UPGRADE: stop first (docs/operations.md, "Upgrading"). Old workers' statements name the
-- columns and the table this drops and renames. With the workers stopped, the running rows are
-- those of crashed workers: each becomes a run with its lease as it was (recovery takes it when
-- it expires), its row `claimed`, attempt and executions those before the run.

CREATE TABLE {schema}.job_runs (
    job_id           bigint PRIMARY KEY,
    -- The fence: the run's attempt (the row's + 1) and a fresh token per claim.
    attempt          integer     NOT NULL,
    lease_token      uuid        NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    worker_id        uuid,
    traced           boolean     NOT NULL,
    started_at       timestamptz,
    -- The row's executions + 1: written back to the row by the settle.
    executions       integer     NOT NULL,
    -- Copied at the claim, so that no completion, settle or renewal reads the wide row:
    -- queue (the completion's and recovery's ready notifications, the queue limit's running
    -- count, status per queue), partition_key (the settle's key release, recovery's),
    -- concurrency_key (the trigger below releases the hold from the deleted run alone),
    -- parent_id (a final outcome wakes the parent), result_watched (the completion's result
    -- notification; job_result_watch sets it here too when the job runs).
    queue            text        NOT NULL,
    partition_key    text,
    concurrency_key  text,
    parent_id        bigint,
    result_watched   boolean     NOT NULL
) WITH (
    -- A row per running job, inserted and deleted per job like a ring slot: free space on each
    -- page for the renewal's HOT updates, and an early vacuum.
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    vacuum_truncate = off
);
-- Recovery of expired leases, as jobs_lease_idx was.
CREATE INDEX job_runs_lease_idx ON {schema}.job_runs (lease_expires_at);

INSERT INTO {schema}.job_runs (job_id, attempt, lease_token, lease_expires_at, worker_id,
                               traced, started_at, executions, queue, partition_key,
                               concurrency_key, parent_id, result_watched)
SELECT id, attempt, lease_token, lease_expires_at, worker_id, traced, started_at, executions,
       queue, partition_key, concurrency_key, parent_id, result_watched
FROM {schema}.jobs_live
WHERE state = 'running';

ALTER TABLE {schema}.jobs ADD COLUMN filed integer NOT NULL DEFAULT 0;
ALTER TABLE {schema}.ready_ring ADD COLUMN filed integer NOT NULL DEFAULT 0;

DROP VIEW {schema}.job_records;
DROP TRIGGER jobs_concurrency_release_update ON {schema}.jobs;
-- Migration 0044's triggers on jobs_live, made again below on `phase` and `filed` (their
-- function's current body names those columns: dropped before this migration writes a row).
DROP TRIGGER jobs_live_filed ON {schema}.jobs_live;
DROP TRIGGER jobs_live_left ON {schema}.jobs_live;
DROP INDEX {schema}.jobs_lease_idx;
DROP INDEX {schema}.jobs_deadline_idx;
ALTER TABLE {schema}.jobs DROP CONSTRAINT jobs_check;
ALTER TABLE {schema}.jobs DROP CONSTRAINT jobs_state_check;
-- The partitions made by LIKE ... INCLUDING CONSTRAINTS hold their own copies (local as well as
-- inherited), which the parent's DROP leaves behind.
DO $$
DECLARE
    found record;
BEGIN
    FOR found IN
        SELECT c.conrelid::regclass AS part, c.conname
        FROM pg_catalog.pg_constraint c
        JOIN pg_catalog.pg_inherits i ON i.inhrelid = c.conrelid
        WHERE i.inhparent = '{schema}.jobs'::regclass
          AND c.conname IN ('jobs_check', 'jobs_state_check')
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', found.part, found.conname);
    END LOOP;
END
$$;

UPDATE {schema}.jobs_live
SET state = 'claimed', attempt = attempt - 1, executions = executions - 1
WHERE state = 'running';

ALTER TABLE {schema}.jobs DROP COLUMN lease_token, DROP COLUMN lease_expires_at;
ALTER TABLE {schema}.jobs RENAME COLUMN state TO phase;
-- An array constant, as migration 0012 wrote the state's (cheaper to prepare than IN's list).
ALTER TABLE {schema}.jobs ADD CONSTRAINT jobs_phase_check
    CHECK (phase = ANY ('{scheduled,ready,claimed,sleeping,waiting,completed,failed,cancelled}'::text[]));
ALTER TABLE {schema}.jobs RENAME TO job_rows_legacy;

-- job_deadline_pass()'s scan: a running job's row reads ready or claimed.
CREATE INDEX jobs_deadline_idx ON {schema}.jobs_live (deadline_at)
    WHERE deadline_at IS NOT NULL AND NOT cancel_requested
      AND phase IN ('scheduled', 'ready', 'claimed', 'sleeping', 'waiting');

-- A run's end releases its concurrency hold: "only running counts" is "has a run". Every end
-- of a run deletes it (completion, settle, recovery, discard, cancel of the tree, purge).
CREATE TRIGGER job_runs_concurrency_release AFTER DELETE ON {schema}.job_runs
    FOR EACH ROW WHEN (old.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION {schema}.concurrency_release();

-- Filing (functions/jobs_live_file.sql; migration 0044's trigger, on the columns renamed here):
-- a move into ready in place, or a run of a job claimed from the ring (its row still reads
-- ready) ending in ready again, which bumps `filed`, files the ring; a row entering, leaving
-- or moving within the due phases files job_due (a due claim writes `claimed`: it leaves).
-- The first line is the claim's way out: a keyed claim (ready -> claimed) fails its first two
-- comparisons; a claim from the ring writes no row at all.
CREATE TRIGGER jobs_live_filed AFTER UPDATE OF phase, run_at, filed ON {schema}.jobs_live
    FOR EACH ROW WHEN ((new.phase <> 'claimed' OR old.phase <> 'ready')
                       AND ((new.phase = 'ready'
                             AND (old.phase <> 'ready' OR old.filed <> new.filed)
                             AND new.partition_key IS NULL AND new.concurrency_key IS NULL)
                            OR ((old.phase IN ('scheduled', 'sleeping', 'waiting')
                                 OR new.phase IN ('scheduled', 'sleeping', 'waiting'))
                                AND (new.phase <> old.phase
                                     OR new.run_at IS DISTINCT FROM old.run_at))))
    EXECUTE FUNCTION {schema}.jobs_live_file();
-- A due row leaving jobs_live (a cancel or a deadline moving it to its day) leaves job_due;
-- the concurrency hold is the run's now (job_runs_concurrency_release above).
CREATE TRIGGER jobs_live_left AFTER DELETE ON {schema}.jobs_live
    FOR EACH ROW WHEN (old.phase IN ('scheduled', 'sleeping', 'waiting'))
    EXECUTE FUNCTION {schema}.jobs_live_left();

-- The read interface of docs/api.md, "The tables": the row with its run, the state derived as
-- queries.sql's fragment job_state derives it (written out: a migration's text never changes).
CREATE VIEW {schema}.jobs AS
SELECT j.id, j.queue, j.task, j.payload,
       CASE WHEN u.job_id IS NOT NULL THEN 'running' ELSE j.phase END AS state,
       j.priority, j.run_at, j.partition_key, j.dedup_key,
       coalesce(u.attempt, j.attempt) AS attempt, j.max_attempts,
       u.lease_token, u.lease_expires_at,
       coalesce(u.worker_id, j.worker_id) AS worker_id, j.cancel_requested, j.result,
       CASE WHEN u.job_id IS NOT NULL THEN NULL ELSE j.error END AS error,
       j.created_at, coalesce(u.started_at, j.started_at) AS started_at, j.finished_at,
       j.checkpoint_count, j.parent_id, j.parent_position, j.wait_event_key, j.wait_children,
       j.children_settled, j.unique_states, j.unique_until, j.trace_context, j.version,
       j.wait_topic, j.on_parent_cancel, coalesce(u.executions, j.executions) AS executions,
       j.deadline_at, j.deadline_source, coalesce(u.traced, j.traced) AS traced,
       j.wait_position, j.concurrency_key, j.concurrency_limit,
       j.result_watched OR coalesce(u.result_watched, false) AS result_watched
FROM {schema}.job_rows_legacy j
LEFT JOIN {schema}.job_runs u ON u.job_id = j.id;

CREATE VIEW {schema}.job_records AS
SELECT j.id, j.queue, j.task, j.payload, j.state, j.priority, j.run_at, j.partition_key,
       (SELECT k.key FROM {schema}.job_keys k
        WHERE k.key = j.dedup_key AND k.job_id = j.id) AS dedup_key,
       j.attempt,
       coalesce(j.max_attempts, (SELECT d.max_attempts FROM {schema}.task_defaults d
                                 WHERE d.task = j.task AND d.version = j.version), 5)
           AS max_attempts,
       j.worker_id, j.result, j.error, j.created_at, j.started_at, j.finished_at, j.executions,
       j.deadline_at, j.deadline_source
FROM {schema}.jobs j;

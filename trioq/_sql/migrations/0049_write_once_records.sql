-- trioq schema, version 49: a job's wide record is written once (bench/plans/write_once_layout.md,
-- stage 6; docs/concepts.md, "Storage").
--
--   job_rows      the record, inserted at enqueue and, on the fast path, never written again:
--                 RANGE-partitioned by id in the satellite epochs (job_rows_e<n>: 2^32 ids, a
--                 UTC day each; migration 0043), like checkpoints, attempts and values. Its
--                 `phase` is the state as last written in place: scheduled | ready | claimed |
--                 sleeping | waiting | done. A job claimed from the ring and completed keeps
--                 `ready` (its entry is gone and `filed` invalidates a stale one).
--   job_outcomes  a finished job's outcome, appended when it finishes (completed | failed |
--                 cancelled, result, error, attempt, executions, worker, start, finish, queue),
--                 in the same epochs, so that retention empties or drops both whole.
-- The state read by tools is derived, outcome over run over phase (queries.sql, fragment
-- job_state; the `jobs` view below spells it out: a migration's text never changes).
-- Why: the completion moved the wide row to its day partition (a new version of every column,
-- every index of the day, the old version left in jobs_live): bench/RESULTS.md, "The wide
-- record written once, drained live", 0.82x the server CPU per job without the move.
--
-- What goes: job_rows_legacy with jobs_live, its day partitions, jobs_before and jobs_unfiled;
-- `lane`, `result` and `finished_at` on the record (the outcome's); the statistics
-- jobs_queue_state. The id sequence jobs_id_seq moves to job_rows with its next value.
--
-- UPGRADE: stop first, in the same release as 0047 and 0048 (docs/operations.md, "Upgrading"):
-- the previous release's workers write the table this drops. The copy is one INSERT per table:
-- the unfinished rows and the finished ones into job_rows (routed to their epoch by id), the
-- finished ones' outcomes into job_outcomes; the ring, ready_keyed, job_due and job_runs keep
-- their rows (they name jobs by id).

CREATE TABLE {schema}.job_rows
    (LIKE {schema}.job_rows_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (id);
ALTER TABLE {schema}.job_rows DROP CONSTRAINT jobs_phase_check,
    DROP CONSTRAINT jobs_run_at_check;
ALTER TABLE {schema}.job_rows DROP COLUMN result, DROP COLUMN finished_at, DROP COLUMN lane;
-- An array constant, as migration 0012 wrote the state's (cheaper to prepare than IN's list).
ALTER TABLE {schema}.job_rows ADD CONSTRAINT jobs_phase_check
    CHECK (phase = ANY ('{scheduled,ready,claimed,sleeping,waiting,done}'::text[]));
ALTER TABLE {schema}.job_rows ADD CONSTRAINT jobs_run_at_check
    CHECK (run_at IS NOT NULL OR phase = ANY ('{waiting,done}'::text[]));
ALTER TABLE {schema}.job_rows ADD PRIMARY KEY (id);

CREATE TABLE {schema}.job_outcomes (
    job_id      bigint      NOT NULL,
    state       text        NOT NULL
        CHECK (state = ANY ('{completed,failed,cancelled}'::text[])),
    result      jsonb,
    error       jsonb,
    attempt     integer     NOT NULL,
    executions  integer     NOT NULL,
    worker_id   uuid,
    started_at  timestamptz,
    finished_at timestamptz NOT NULL,
    queue       text        NOT NULL,
    PRIMARY KEY (job_id)
) PARTITION BY RANGE (job_id);

-- One partition of each per satellite epoch, present and made ahead (the first from MINVALUE,
-- as checkpoints_e0); satellite_epochs_rotate() makes the next ones with the satellites'.
DO $$
DECLARE
    epoch_row record;
BEGIN
    FOR epoch_row IN SELECT e.* FROM {schema}.satellite_epochs e ORDER BY e.epoch LOOP
        EXECUTE format('CREATE TABLE {schema}.%I PARTITION OF {schema}.job_rows '
                       'FOR VALUES FROM (%s) TO (%s) '
                       'WITH (vacuum_truncate = off, toast.vacuum_truncate = off)',
                       'job_rows_e' || epoch_row.epoch,
                       coalesce(epoch_row.low::text, 'MINVALUE'), epoch_row.high);
        EXECUTE format('CREATE TABLE {schema}.%I PARTITION OF {schema}.job_outcomes '
                       'FOR VALUES FROM (%s) TO (%s) '
                       'WITH (vacuum_truncate = off, toast.vacuum_truncate = off)',
                       'job_outcomes_e' || epoch_row.epoch,
                       coalesce(epoch_row.low::text, 'MINVALUE'), epoch_row.high);
    END LOOP;
END
$$;

INSERT INTO {schema}.job_rows
    (id, queue, task, payload, phase, priority, run_at, partition_key, dedup_key, attempt,
     max_attempts, worker_id, cancel_requested, error, created_at, started_at,
     checkpoint_count, parent_id, parent_position, wait_event_key, wait_children,
     children_settled, unique_states, unique_until, trace_context, version, wait_topic,
     on_parent_cancel, executions, deadline_at, deadline_source, traced, wait_position,
     concurrency_key, concurrency_limit, result_watched, filed)
SELECT id, queue, task, payload,
       CASE WHEN phase = ANY ('{completed,failed,cancelled}'::text[]) THEN 'done' ELSE phase END,
       priority, run_at, partition_key, dedup_key, attempt, max_attempts, worker_id,
       cancel_requested, error, created_at, started_at, checkpoint_count, parent_id,
       parent_position, wait_event_key, wait_children, children_settled, unique_states,
       unique_until, trace_context, version, wait_topic, on_parent_cancel, executions,
       deadline_at, deadline_source, traced, wait_position, concurrency_key, concurrency_limit,
       result_watched, filed
FROM {schema}.job_rows_legacy;
INSERT INTO {schema}.job_outcomes (job_id, state, result, error, attempt, executions, worker_id,
                                   started_at, finished_at, queue)
SELECT id, phase, result, error, attempt, executions, worker_id, started_at,
       coalesce(finished_at, created_at), queue
FROM {schema}.job_rows_legacy
WHERE phase = ANY ('{completed,failed,cancelled}'::text[]);

-- The id sequence, with its next value (an epoch's jump, setval(low, false), included).
CREATE TEMPORARY TABLE jobs_next_id ON COMMIT DROP AS
    SELECT greatest((SELECT CASE WHEN s.is_called THEN s.last_value + 1 ELSE s.last_value END
                     FROM {schema}.jobs_id_seq s),
                    (SELECT coalesce(max(j.id), 0) + 1 FROM {schema}.job_rows j)) AS next_id;
DROP VIEW {schema}.job_records;
DROP VIEW {schema}.jobs;
ALTER TABLE {schema}.job_rows_legacy ALTER COLUMN id DROP IDENTITY;
DROP TABLE {schema}.job_rows_legacy;
ALTER TABLE {schema}.job_rows ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY
    (SEQUENCE NAME {schema}.jobs_id_seq);
SELECT setval('{schema}.jobs_id_seq', next_id, false) FROM jobs_next_id;

-- The indexes of every epoch's records: a child's arbiter (spawn) and the parents' reads; an
-- event's waiters; job_deadline_pass()'s scan (a job completed on the fast path keeps
-- `ready` until the pass sees its outcome and writes `done`: lazy, off the hot path). No
-- claim-path index: the claims read the ring, ready_keyed and job_due.
CREATE INDEX jobs_parent_idx ON {schema}.job_rows (parent_id, parent_position)
    WHERE parent_id IS NOT NULL;
CREATE INDEX jobs_wait_event_idx ON {schema}.job_rows (wait_event_key)
    WHERE wait_event_key IS NOT NULL;
CREATE INDEX jobs_deadline_idx ON {schema}.job_rows (deadline_at)
    WHERE deadline_at IS NOT NULL AND NOT cancel_requested AND phase <> 'done';
-- The finished lists, the throughput and purge read outcomes by finish time.
CREATE INDEX job_outcomes_finished_idx ON {schema}.job_outcomes (finished_at);

-- What belongs to a deleted record goes with it (a `keep=False` completion, a purge).
CREATE TRIGGER jobs_deleted AFTER DELETE ON {schema}.job_rows
    REFERENCING OLD TABLE AS deleted_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.checkpoints_delete_of_jobs();
CREATE TRIGGER jobs_keys_delete AFTER DELETE ON {schema}.job_rows
    REFERENCING OLD TABLE AS deleted_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.job_keys_delete_of_jobs();
-- The filing triggers of migrations 0044, 0047 and 0048, on the records: the fast path (an
-- insert of a ready unkeyed job, a claim from the ring that writes no record, a completion
-- that writes none) calls one function, the ring's.
CREATE TRIGGER ready_ring_filed_insert AFTER INSERT ON {schema}.job_rows
    FOR EACH ROW WHEN (new.phase = 'ready' AND new.partition_key IS NULL
                       AND new.concurrency_key IS NULL)
    EXECUTE FUNCTION {schema}.ready_ring_file();
CREATE TRIGGER job_due_filed_insert AFTER INSERT ON {schema}.job_rows
    FOR EACH ROW WHEN (new.phase = ANY ('{scheduled,sleeping,waiting}'::text[]))
    EXECUTE FUNCTION {schema}.jobs_live_file();
CREATE TRIGGER jobs_live_filed AFTER UPDATE OF phase, run_at, filed ON {schema}.job_rows
    FOR EACH ROW WHEN ((new.phase <> 'claimed' OR old.phase <> 'ready')
                       AND ((new.phase = 'ready'
                             AND (old.phase <> 'ready' OR old.filed <> new.filed)
                             AND new.partition_key IS NULL AND new.concurrency_key IS NULL)
                            OR ((old.phase IN ('scheduled', 'sleeping', 'waiting')
                                 OR new.phase IN ('scheduled', 'sleeping', 'waiting'))
                                AND (new.phase <> old.phase
                                     OR new.run_at IS DISTINCT FROM old.run_at))))
    EXECUTE FUNCTION {schema}.jobs_live_file();
-- A due record deleted (a purge) leaves job_due.
CREATE TRIGGER jobs_live_left AFTER DELETE ON {schema}.job_rows
    FOR EACH ROW WHEN (old.phase IN ('scheduled', 'sleeping', 'waiting'))
    EXECUTE FUNCTION {schema}.jobs_live_left();
CREATE TRIGGER ready_keyed_filed_insert AFTER INSERT ON {schema}.job_rows
    FOR EACH ROW WHEN ((new.partition_key IS NOT NULL OR new.concurrency_key IS NOT NULL)
                       AND new.phase = 'ready')
    EXECUTE FUNCTION {schema}.ready_keyed_file();
CREATE TRIGGER ready_keyed_filed_update
    AFTER UPDATE OF phase, run_at, filed, priority ON {schema}.job_rows
    FOR EACH ROW WHEN ((new.partition_key IS NOT NULL OR new.concurrency_key IS NOT NULL)
                       AND (new.phase = 'ready' OR old.phase = 'ready')
                       AND (new.phase <> 'claimed' OR old.phase <> 'ready')
                       AND (new.phase <> old.phase OR new.filed <> old.filed
                            OR new.run_at IS DISTINCT FROM old.run_at
                            OR new.priority <> old.priority))
    EXECUTE FUNCTION {schema}.ready_keyed_file();
CREATE TRIGGER ready_keyed_left AFTER DELETE ON {schema}.job_rows
    FOR EACH ROW WHEN ((old.partition_key IS NOT NULL OR old.concurrency_key IS NOT NULL)
                       AND old.phase = 'ready')
    EXECUTE FUNCTION {schema}.ready_keyed_file();

-- The read interface of docs/api.md, "The tables": the record with its run and its outcome,
-- the state derived as queries.sql's fragment job_state derives it.
CREATE VIEW {schema}.jobs AS
SELECT j.id, j.queue, j.task, j.payload,
       CASE WHEN o.job_id IS NOT NULL THEN o.state
            WHEN u.job_id IS NOT NULL THEN 'running' ELSE j.phase END AS state,
       j.priority, j.run_at, j.partition_key, j.dedup_key,
       coalesce(o.attempt, u.attempt, j.attempt) AS attempt, j.max_attempts,
       u.lease_token, u.lease_expires_at,
       coalesce(o.worker_id, u.worker_id, j.worker_id) AS worker_id, j.cancel_requested,
       o.result,
       CASE WHEN o.job_id IS NOT NULL THEN o.error
            WHEN u.job_id IS NOT NULL THEN NULL ELSE j.error END AS error,
       j.created_at, coalesce(o.started_at, u.started_at, j.started_at) AS started_at,
       o.finished_at,
       j.checkpoint_count, j.parent_id, j.parent_position, j.wait_event_key, j.wait_children,
       j.children_settled, j.unique_states, j.unique_until, j.trace_context, j.version,
       j.wait_topic, j.on_parent_cancel,
       coalesce(o.executions, u.executions, j.executions) AS executions,
       j.deadline_at, j.deadline_source, coalesce(u.traced, j.traced) AS traced,
       j.wait_position, j.concurrency_key, j.concurrency_limit,
       j.result_watched OR coalesce(u.result_watched, false) AS result_watched
FROM {schema}.job_rows j
LEFT JOIN {schema}.job_runs u ON u.job_id = j.id
LEFT JOIN {schema}.job_outcomes o ON o.job_id = j.id;

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

-- The completions end their runs through job_runs_finish(), which returns the queue too.
DROP FUNCTION IF EXISTS {schema}.job_runs_end(bigint[], integer[], uuid[]);

-- The day rotation is gone with its partitions: retention is satellite_epochs_rotate(retention)'s,
-- by epoch (the one without an argument was called by job_history_rotate()).
DROP FUNCTION IF EXISTS {schema}.job_history_rotate(interval);
DROP FUNCTION IF EXISTS {schema}.job_history_drop();
DROP FUNCTION IF EXISTS {schema}.job_history_add(integer);
DROP FUNCTION IF EXISTS {schema}.job_lane(timestamptz);
DROP FUNCTION IF EXISTS {schema}.satellite_epochs_rotate();

-- The dashboard's estimates by (queue, state) (migration 0014's statistics, dropped with
-- jobs_live): of job_due's rows, the future-dated jobs.
CREATE STATISTICS {schema}.jobs_queue_state (mcv) ON queue, state FROM {schema}.job_due;

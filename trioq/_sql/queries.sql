-- Every statement trioq runs, as named blocks. `{schema}` is replaced by the validated, quoted
-- schema name when the file is loaded; every other value is a bound parameter (%(name)s).
-- The driver (trioq/_pg/driver.py and its concern modules beside it) has one method per block;
-- the in-memory driver mirrors them.

-- name: migration_lock
-- Serialises `trioq migrate` runs (transaction-scoped advisory lock, released at COMMIT).
SELECT pg_advisory_xact_lock(hashtext('trioq-migrate:' || %(schema_name)s));

-- name: migration_prepare
-- The schema is created only when missing: CREATE SCHEMA IF NOT EXISTS checks the database's
-- CREATE privilege even when the schema exists, and the least-privilege owner of
-- docs/operations.md has none (a superuser creates the schema for it). A schema that exists,
-- holds no trioq migrations and belongs to a role the migrating one is not a member of is
-- refused: whoever prepared it would own what the migration puts in it (and could, say,
-- replace trioq's functions).
DO $$
DECLARE
    owner_name name;
BEGIN
    SELECT nspowner::regrole::name INTO owner_name
    FROM pg_namespace WHERE nspname = '{schema_name}';
    IF NOT FOUND THEN
        CREATE SCHEMA {schema};
    ELSIF NOT pg_has_role(owner_name, 'MEMBER')
        AND to_regclass('{schema}.migrations') IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'insufficient_privilege',
            MESSAGE = format('schema %s belongs to role %s and holds no trioq tables: '
                'migrate as that role, or drop the schema or give it to %s '
                '(ALTER SCHEMA %s OWNER TO %s)', '{schema_name}', owner_name, current_user,
                '{schema_name}', current_user);
    END IF;
END
$$;
CREATE TABLE IF NOT EXISTS {schema}.migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_function_digest_kept
-- Whether the schema keeps the functions' digest yet (migration 0035).
SELECT to_regclass('{schema}.function_digest') IS NOT NULL AS kept;

-- name: migration_function_digest
-- The digest of the function bodies the last migrate applied (no row: none recorded).
SELECT digest FROM {schema}.function_digest;

-- name: migration_function_digest_record
WITH forgotten AS (DELETE FROM {schema}.function_digest)
INSERT INTO {schema}.function_digest (digest, applied_at) VALUES (%(digest)s, now());

-- name: migration_functions_unchecked
-- While migrate applies the functions' bodies, before the pending migrations: a body is not
-- checked against tables a pending migration has yet to create (this transaction only);
-- PostgreSQL checks it when it runs.
SET LOCAL check_function_bodies = off;

-- name: migration_functions_checked
SET LOCAL check_function_bodies = on;

-- name: migration_applied
SELECT version FROM {schema}.migrations ORDER BY version;

-- name: migration_record
INSERT INTO {schema}.migrations (version, name) VALUES (%(version)s, %(name)s);

-- name: migration_lock_timeout
-- Every lock the migration's transaction takes waits at most this long: a request queued behind
-- a long reader (a pg_dump's ACCESS SHARE) would otherwise hold up every enqueue and claim
-- queued behind it for as long as the reader runs. `migrate` rolls back and tries again.
SELECT set_config('lock_timeout', %(milliseconds)s, true);

-- name: migration_session_timeouts_save
-- `own`: trioq set its timeouts for this session (startup options or SET: a direct
-- connection), so the session is trioq's alone; behind a transaction pooler they are SET LOCAL
-- per transaction and the session shows the server's.
SELECT current_setting('statement_timeout') AS statement_timeout,
       current_setting('lock_timeout') AS lock_timeout,
       current_setting('idle_in_transaction_session_timeout') AS idle_timeout,
       (SELECT source IN ('client', 'session') FROM pg_settings
        WHERE name = 'statement_timeout') AS own;

-- name: migration_session_timeouts_default
-- A no-transaction migration's statements (an index built CONCURRENTLY on a big table) run in
-- autocommit under the session's values without trioq's 30 s statement timeout (what RESET
-- would give: the server's, role's or conninfo's), their locks bounded as in a transaction.
SELECT set_config('statement_timeout', reset_val, false),
       set_config('lock_timeout', %(milliseconds)s, false)
FROM pg_settings WHERE name = 'statement_timeout';

-- name: migration_session_timeouts_restore
SELECT set_config('statement_timeout', %(statement_timeout)s, false),
       set_config('lock_timeout', %(lock_timeout)s, false),
       set_config('idle_in_transaction_session_timeout', %(idle_timeout)s, false);

-- name: server_pid
-- The process id of the server process running this statement: a producer compares it with the
-- one its connection announced at startup to find a connection pooler in front.
SELECT pg_backend_pid() AS pid;

-- fragment: job_insert(target)
-- THE insert of a new job: every writer (job_insert_many, job_insert_batch, job_insert_one,
-- schedule_fire_many, job_spawn_many and the SQL function enqueue()) writes its rows through
-- these lines, so the job's columns are listed once and each is derived once. The writer names
-- its rows `new_jobs`, with these columns: id (NULL: drawn here), queue, task, payload (jsonb),
-- priority, now (db_now(), read once), due_at, partition_key, dedup_key, max_attempts,
-- unique_states (NULL: none), unique_until, version, trace_context, concurrency_key,
-- concurrency_limit, deadline_at, deadline (seconds from now), deadline_source, task_seconds
-- (the task's registered deadline, for a job without its own; NULL: none, or not read),
-- parent_id, parent_position and on_parent_cancel (NULL: the column's default). A job due later
-- is `scheduled` (promoted when due), else `ready`. `target` is `jobs`, or `jobs_live` for an
-- insert whose ON CONFLICT needs that table's own unique index (job_spawn_many). The writer
-- adds its ON CONFLICT and RETURNING after it.
INSERT INTO {schema}.@target@ AS j (id, queue, task, payload, phase, priority, run_at,
                                   partition_key, dedup_key, max_attempts, created_at,
                                   unique_states, unique_until, version, trace_context,
                                   concurrency_key, concurrency_limit, deadline_at,
                                   deadline_source, parent_id, parent_position,
                                   on_parent_cancel)
SELECT coalesce(n.id, nextval('{schema}.jobs_id_seq')), n.queue, n.task, n.payload,
       CASE WHEN n.due_at > n.now THEN 'scheduled' ELSE 'ready' END,
       n.priority, n.due_at, n.partition_key, n.dedup_key, n.max_attempts, n.now,
       coalesce(n.unique_states, '{}'), n.unique_until, n.version, n.trace_context,
       n.concurrency_key, n.concurrency_limit,
       coalesce(n.deadline_at,
                n.now + coalesce(n.deadline, n.task_seconds) * interval '1 second'),
       coalesce(n.deadline_source,
                CASE WHEN n.task_seconds IS NOT NULL THEN 'set by task ' || n.task END),
       n.parent_id, n.parent_position, coalesce(n.on_parent_cancel, 'cancel')
FROM new_jobs AS n

-- fragment: enqueue_new_jobs
-- The row of the SQL function enqueue() (functions/enqueue.sql includes it), from its arguments
-- and variables: here beside job_insert and the other writers' rows, so that a column added to
-- jobs is given by every writer in this one file. Only a function body can run it.
    SELECT new_id AS id, enqueue.queue AS queue, enqueue.task AS task,
           enqueue.payload AS payload, enqueue.priority AS priority, {schema}.db_now() AS now,
           due AS due_at, enqueue.partition_key AS partition_key,
           enqueue.dedup_key AS dedup_key, enqueue.max_attempts AS max_attempts,
           held AS unique_states,
           CASE WHEN enqueue.dedup_key IS NOT NULL
                THEN {schema}.db_now() + enqueue.unique_for END AS unique_until,
           1 AS version, enqueue.traceparent AS trace_context,
           enqueue.concurrency_key AS concurrency_key,
           enqueue.concurrency_limit AS concurrency_limit, job_deadline AS deadline_at,
           NULL::float8 AS deadline, job_deadline_source AS deadline_source,
           NULL::float8 AS task_seconds, NULL::bigint AS parent_id,
           NULL::int AS parent_position, NULL::text AS on_parent_cancel

-- fragment: new_job_arrays
-- The rows of a writer that sends one array per field of `NewJob` (trioq/_seam/records.py),
-- each parameter named after its field (trioq/_pg/inserts.py builds them from that one list),
-- with their position (`ord`). unique_states is each row's states joined by commas.
    FROM unnest(%(queue)s::text[], %(task)s::text[], %(payload_json)s::text[],
                %(priority)s::smallint[], %(run_at)s::timestamptz[],
                %(delay_seconds)s::float8[], %(partition_key)s::text[], %(dedup_key)s::text[],
                %(max_attempts)s::int[], %(unique_for_seconds)s::float8[],
                %(unique_states)s::text[], %(version)s::int[], %(trace_context)s::text[],
                %(concurrency_key)s::text[], %(concurrency_limit)s::int[],
                %(deadline_at)s::timestamptz[], %(deadline_seconds)s::float8[],
                %(deadline_source)s::text[], %(task_deadline)s::boolean[])
         WITH ORDINALITY AS t(queue, task, payload, priority, run_at, delay, partition_key,
                              dedup_key, max_attempts, unique_for, unique_states, version,
                              trace_context, concurrency_key, concurrency_limit, deadline_at,
                              deadline, deadline_source, task_deadline, ord)

-- name: job_insert_many
-- One statement for a whole batch (unnest of parallel arrays). Ids are drawn first so each input
-- row can be matched to its result even when a dedup key returns an existing job instead. A key
-- repeated inside one batch is taken once (its first occurrence); its later occurrences return
-- that job.
-- Uniqueness (docs/uniqueness.md): a key is a row of job_keys naming the job that holds it, and
-- its primary key alone decides conflicts, race-free. `keys` upserts the batch's distinct keys
-- in key order (two batches lock shared keys in the same order: no deadlock between them) and
-- always returns the key's holder. ON CONFLICT DO UPDATE, not DO NOTHING: it waits for a
-- concurrent inserter of the key and then *returns* its row even though this statement's
-- snapshot cannot see it; DO NOTHING would return nothing (Oban's "ghost duplicate"). The
-- update hands the key to this batch's new job only when its holder is in `released`;
-- otherwise it rewrites the holder as it was. Only the rows whose key names their own new id
-- (or that have no key) are inserted into jobs; the others return the holder.
-- `released`: the finished holders that no longer hold their key (not in their unique_states,
-- or past their unique_until), share-locked, and locked BEFORE any key row (its count is read
-- in the upsert's WHERE, an InitPlan run before the first row): FOR SHARE waits for a
-- concurrent retry or delete of the holder and re-checks its latest version, so a holder
-- retried meanwhile keeps its key, and a deleter (which holds the job row, then takes the key
-- row in its trigger) never waits for us in the other order. The decision reads this set, not
-- the holder's row again: the upsert may wait for a key row's locker, but this statement's
-- snapshot stays the one it started with. A holder this snapshot cannot see (a concurrent
-- enqueuer's, committed after our snapshot began) is never in `released`, so it counts as
-- HOLDING: it is a new, unfinished job, and reading "no row" as "released" would hand its key
-- to a second job. With no keys, `released` joins an empty input and costs nothing.
-- Against the unique index this replaced (bench/RESULTS.md, "The key table in
-- job_insert_many"): 1.06-1.11x the backend CPU per job on new keys (the `released` probe),
-- 0.89-0.90x on keys taken over from finished jobs.
-- The ready notification (one per queue) is sent by pg_notify inside the same transaction, so
-- it is delivered only if the enqueue commits.
-- A job due later is inserted `scheduled` (outside the claim indexes) and promoted when due;
-- it wakes its queue too, so an idle claim loop learns its due time and sets its timer to it
-- (one round per enqueue statement, instead of finding it at the next poll).
WITH input AS MATERIALIZED (
    SELECT nextval('{schema}.jobs_id_seq') AS new_id, t.*
    -- include: new_job_arrays
),
released AS (
    SELECT h.id
    FROM (SELECT DISTINCT dedup_key FROM input WHERE dedup_key IS NOT NULL) AS i
    JOIN {schema}.job_keys k ON k.key = i.dedup_key
    -- The holder's outcome (migration 0049: a finished job is one with an outcome), locked:
    -- a redrive deletes it, so FOR SHARE waits for it and then finds the holder unfinished.
    JOIN {schema}.job_outcomes o ON o.job_id = k.job_id
    JOIN {schema}.job_rows h ON h.id = k.job_id
    WHERE {schema}.job_key_released(o.state, h.unique_states, h.unique_until)
    FOR SHARE OF o
),
keys AS (
    INSERT INTO {schema}.job_keys AS k (key, job_id, task)
    SELECT DISTINCT ON (dedup_key) dedup_key, new_id, task FROM input
    WHERE dedup_key IS NOT NULL AND (SELECT count(*) FROM released) >= 0
    ORDER BY dedup_key, ord
    ON CONFLICT (key) DO UPDATE
    SET job_id = CASE WHEN k.job_id IN (SELECT id FROM released) THEN excluded.job_id
                      ELSE k.job_id END,
        task = CASE WHEN k.job_id IN (SELECT id FROM released) THEN excluded.task
                    ELSE k.task END
    RETURNING k.key, k.job_id, k.task
),
new_jobs AS (
    -- Every row without a key, and the rows whose key names their own new id, in input order.
    SELECT i.new_id AS id, i.queue, i.task, i.payload::jsonb AS payload, i.priority, n.now,
           coalesce(i.run_at, n.now + coalesce(i.delay, 0) * interval '1 second') AS due_at,
           i.partition_key, i.dedup_key, i.max_attempts,
           string_to_array(coalesce(i.unique_states, ''), ',') AS unique_states,
           n.now + i.unique_for * interval '1 second' AS unique_until,
           coalesce(i.version, 1) AS version, i.trace_context, i.concurrency_key,
           i.concurrency_limit, i.deadline_at, i.deadline, i.deadline_source,
           t.deadline_seconds AS task_seconds, NULL::bigint AS parent_id,
           NULL::int AS parent_position, NULL::text AS on_parent_cancel
    FROM input i
    CROSS JOIN (SELECT {schema}.db_now() AS now) AS n
    -- The task's registered deadline for rows without their own (per row: a batch may mix
    -- tasks; job_insert_one reads it once).
    LEFT JOIN {schema}.task_defaults t
           ON i.task_deadline AND i.deadline_at IS NULL AND i.deadline IS NULL
          AND t.task = i.task AND t.version = coalesce(i.version, 1)
          AND t.deadline_seconds IS NOT NULL
    WHERE i.dedup_key IS NULL OR i.new_id IN (SELECT job_id FROM keys)
    ORDER BY i.ord
),
inserted AS (
    -- include: job_insert(job_rows)
    RETURNING j.id, j.queue
),
notified AS (
    SELECT count(pg_notify({schema}.ready_channel(due.queue), due.queue)) AS n
    FROM (SELECT DISTINCT queue FROM inserted) AS due
)
SELECT i.ord, coalesce(fresh.id, holder.job_id) AS id, fresh.id IS NOT NULL AS created
FROM input i
LEFT JOIN inserted fresh ON fresh.id = i.new_id
LEFT JOIN keys holder ON holder.key = i.dedup_key
CROSS JOIN notified
-- A key held by a job of another task refuses the whole statement (dedup_key_refuse raises;
-- docs/uniqueness.md): CASE, so the function is called for such a row only.
WHERE CASE WHEN fresh.id IS NULL AND holder.task <> i.task
           THEN {schema}.dedup_key_refuse(i.dedup_key, i.task, holder.job_id, holder.task)
           ELSE true END
ORDER BY i.ord;

-- fragment: new_job_options
-- The options of an enqueue whose jobs share them (job_insert_batch, job_insert_one) as one row
-- of job_insert's columns, from scalar parameters named after `NewJob`'s fields (as
-- new_job_arrays, without the payload). A job with a dedup or a concurrency key never comes
-- here (trioq/_pg/inserts.py sends it to job_insert_many), so the keys' columns are NULL
-- constants, which the planner folds (as parameters they cost a single enqueue 1.05x the
-- backend CPU: bench/RESULTS.md, "One insert: every writer through job_insert"). db_now() is
-- read once, and the task's registered deadline (for jobs without their own, unless the
-- enqueuer registers the task itself: %(task_deadline)s false) is read by
-- task_deadline_seconds() only then (CASE) and once for the batch (OFFSET 0 keeps this a
-- subquery, not one call per row or reference).
        SELECT NULL::bigint AS id, %(queue)s::text AS queue, %(task)s::text AS task,
               %(priority)s::smallint AS priority, d.now,
               coalesce(%(run_at)s::timestamptz,
                        d.now + coalesce(%(delay_seconds)s::float8, 0) * interval '1 second')
                   AS due_at,
               %(partition_key)s::text AS partition_key, NULL::text AS dedup_key,
               %(max_attempts)s::int AS max_attempts, NULL::text[] AS unique_states,
               NULL::timestamptz AS unique_until, %(version)s::int AS version,
               %(trace_context)s::text AS trace_context, NULL::text AS concurrency_key,
               NULL::int AS concurrency_limit,
               %(deadline_at)s::timestamptz AS deadline_at,
               %(deadline_seconds)s::float8 AS deadline,
               %(deadline_source)s::text AS deadline_source,
               CASE WHEN %(task_deadline)s::boolean AND %(deadline_at)s::timestamptz IS NULL
                         AND %(deadline_seconds)s::float8 IS NULL
                    THEN {schema}.task_deadline_seconds(%(task)s::text, %(version)s::int)
               END AS task_seconds,
               NULL::bigint AS parent_id, NULL::int AS parent_position,
               NULL::text AS on_parent_cancel
        FROM (SELECT {schema}.db_now() AS now) AS d OFFSET 0

-- name: job_insert_batch
-- The fast path of job_insert_many for a batch without dedup keys in which every job shares its
-- options (one `enqueue` or `enqueue_many` call): the options are scalars and the payloads one
-- text[] (sent as one array literal), so neither side handles nineteen arrays per row. Without
-- keys there is nothing to release, deduplicate or match, so no CTE of drawn ids, no key
-- upsert and no joins: job_insert from the options' one row times the unnest of the payloads
-- (`new_jobs` has no volatile function, so PostgreSQL inlines it: the plan is one INSERT ...
-- SELECT), each id drawn as the row is inserted. The rows are inserted in payload order
-- (ORDER BY ord) and a sequence only grows, so the returned ids sorted ascending are the
-- payloads' ids in order. Every column is written as job_insert_many writes it for a job
-- without a key (the same fragment; tests/test_enqueue_fast_path.py compares the two row for
-- row); a job due later is inserted `scheduled`. ONE ready notification for the batch's
-- queue, sent inside the transaction (delivered only if it commits); a delayed batch sends it
-- too, so an idle claim loop learns the new due time (as job_insert_many does).
WITH new_jobs AS (
    SELECT p.payload::jsonb AS payload, o.*
    FROM (
        -- include: new_job_options
    ) AS o,
    unnest(%(payloads)s::text[]) WITH ORDINALITY AS p(payload, ord)
    ORDER BY p.ord
),
inserted AS (
    -- include: job_insert(job_rows)
    RETURNING j.id, j.phase AS state
)
-- The ids come back as ONE array (one row), not one row per job: decoding 20,000 result rows
-- took 36 ms of a 20,000-row enqueue_many's client time, the array about 2.
SELECT coalesce(array_agg(i.id ORDER BY i.id), '{}') AS ids,
       (SELECT count(pg_notify({schema}.ready_channel(%(queue)s::text), %(queue)s::text))
        FROM (SELECT 1 FROM inserted LIMIT 1) AS any_row) AS sent
FROM inserted i;

-- name: job_insert_one
-- The single `enqueue` without a dedup key: job_insert_batch for exactly one payload, without
-- the unnest, the ordering and the data-modifying CTE (measured on a durable cluster: 76 us of
-- server time against 90 us; `new_jobs` is inlined, not a CTE of the plan). Prepared once per
-- session on the native path (trioq/_pg/native.py), so it is planned once, not per call; every
-- parameter is a scalar, so the generic plan is the custom one. Writes every column as
-- job_insert_batch writes it (the same fragments; tests/test_enqueue_fast_path.py compares
-- them); a job due later is `scheduled`. Its queue's ready notification is sent by
-- RETURNING, inside the transaction (delivered only if it commits), also for a delayed job, as
-- job_insert_batch does.
-- A job without a deadline of its own takes its task's, as the task's workers registered it
-- (task_defaults, migration 0029; the rule: trioq/_core/deadlines.py `own_deadline`), from
-- the enqueue, unless its enqueuer registers the task itself (%(task_deadline)s false: its
-- declaration decides): new_job_options says how.
WITH new_jobs AS (
    SELECT %(payload_json)s::jsonb AS payload, o.*
    FROM (
        -- include: new_job_options
    ) AS o
)
-- include: job_insert(job_rows)
RETURNING j.id, pg_notify({schema}.ready_channel(j.queue), j.queue) AS notified;

-- fragment: ring_low
-- The ready ring's lowest slot that readers read (migration 0041: a bank the ring has left,
-- while a `pg_dump` holds it, lies below); a state emptied by hand (a test suite truncating
-- every table) reads as 0, the first bank, as ready_ring_file() files there. Read once per
-- statement by this sub-select (an InitPlan), which prunes the slots below as the statement
-- runs: their scans are never executed. Written into each statement, not called: a call of
-- ready_ring_low() (PL/pgSQL; its body is this fragment, kept for the previous release's
-- claims) cost 28 us of every claim (EXPLAIN ANALYZE), the sub-select 2.
(SELECT coalesce((SELECT s.low FROM {schema}.ready_ring_state s), 0::smallint))

-- fragment: unkeyed_scan
-- The unkeyed claim source of both claim statements, per served task (`served.task`): the
-- ready ring's entries (migration 0039; every slot, one index scan each, merged) in claim
-- order, each with its job's row by primary key, locked as it is read (SKIP LOCKED:
-- concurrent claimers skip each other's jobs and keep scanning, and a job row another
-- transaction holds, a send or a result watch, is skipped, its entry left for the next
-- claim), the worker's handler versions only. The entry is locked too (migration 0047): the
-- claim writes no version of the job's row, which still reads ready while the job runs, so a
-- claimer whose snapshot predates another's committed claim would find the row lockable and
-- ready; the entry that claim deleted is not, and is skipped (tests/test_runs.py, "no double
-- claim from an old snapshot"). The row's `filed` must be the entry's: an entry filed before
-- the job last left ready and came back is stale. The columns the run copies are the locked
-- version's (a row lock returns the newest version: a result watch committed after the
-- statement's snapshot is not lost). What the scan steps over is bounded by the
-- slots not yet truncated (a few seconds of jobs), not by how long a snapshot has pinned the
-- horizon. An entry whose job is no longer ready (cancelled, or claimed by a worker of the
-- previous release) is stepped over and goes with its slot.
-- `run_at <= db_now()`: ready means due; a guard for rows written by hand.
        FROM {schema}.ready_ring r
        -- One primary-key probe per entry, in the ring's order (a LIMIT keeps the planner from
        -- flattening it into a join: a generic plan made it a hash join over a sequential
        -- scan of jobs_live, 30 s a claim under a pinned horizon). The job's row lock is
        -- the claim's: two entries of one job, or two claimers, meet on it.
        CROSS JOIN LATERAL (
            SELECT j.attempt, j.executions, j.parent_id, j.result_watched, j.task, j.payload,
                   j.max_attempts, j.created_at, j.cancel_requested, j.version,
                   j.checkpoint_count
            FROM {schema}.job_rows j
            WHERE j.id = r.id AND j.phase = 'ready' AND j.filed = r.filed
            LIMIT 1
            FOR UPDATE OF j SKIP LOCKED
        ) AS job
        WHERE r.queue = (SELECT %(queue)s::text)
          AND r.task = served.task
          -- No bank the ring has left (migration 0041): pruned as the claim runs. Read once, by
          -- a sub-select: compared with the call itself, the planner filtered every entry
          -- scanned by it as well as pruning with it, one SQL-function execution per entry
          -- (10 us of every claimed job in a drain).
          AND r.slot >=
              -- include: ring_low
          AND r.run_at <= {schema}.db_now()
          AND ((SELECT %(task_versions)s::text[]) IS NULL
               OR r.task || '@' || r.version = ANY((SELECT %(task_versions)s::text[])::text[]))
        ORDER BY r.priority, r.run_at, r.id
        LIMIT (SELECT %(limit)s::int)
        FOR UPDATE OF r SKIP LOCKED

-- fragment: ring_taken
-- Both claim statements: the ring entries of the claimed candidates are deleted
-- (ready_ring_take(), by row address), once, when the statement's final SELECT reads it; a
-- claim that took none calls nothing (an idle queue's claim: 251 us of the server's CPU with
-- the call, 208-217 without).
ring_taken AS MATERIALIZED (
    SELECT CASE WHEN EXISTS (SELECT 1 FROM candidates WHERE ring_slot IS NOT NULL)
                THEN {schema}.ready_ring_take(
                         ARRAY(SELECT ring_row FROM candidates WHERE ring_slot IS NOT NULL),
                         ARRAY(SELECT id FROM candidates WHERE ring_slot IS NOT NULL))
                ELSE 0 END AS n
),

-- fragment: job_state
-- A job's state (docs/state-machine.md) from its record `j`, its run `u` (LEFT JOIN
-- {schema}.job_runs u ON u.job_id = j.id) and its outcome `o` (LEFT JOIN {schema}.job_outcomes
-- o ON o.job_id = j.id): the outcome's once it has one, running while it has a run, else the
-- record's phase (migrations 0047, 0049; the `jobs` view spells out the same rule). `claimed`
-- never shows: a claimed record always has its run or its outcome, and `done` always has its
-- outcome.
CASE WHEN o.job_id IS NOT NULL THEN o.state WHEN u.job_id IS NOT NULL THEN 'running'
     ELSE j.phase END

-- fragment: runs_by_key
-- The runs a fenced statement names (`ids`: the lease renewal; the completions and the settle
-- end theirs in job_runs_finish_fenced() and job_runs_settle_fenced()), found by primary key:
-- a join left to the planner over a table that churns a row per job can take a scan, which a
-- pinned horizon makes long.
      AND u.job_id = ANY((SELECT %(ids)s::bigint[])::bigint[])

-- fragment: running_by_key
-- The rows of the jobs whose runs a statement ended (the completion, the settle), by primary
-- key. A running job's row reads `ready` (claimed from the ring) or `claimed` (by the full
-- claim); the day partitions' CHECKs leave them out of the plan.
      AND j.id = ANY((SELECT %(ids)s::bigint[])::bigint[])
      AND j.phase IN ('ready', 'claimed')

-- fragment: claim_run_columns
-- The run a claim inserts (job_claim and job_claim_plain): a new attempt, a fresh lease token,
-- the lease from database time, and what the completion and the settle read instead of the
-- job's row. Database time by a sub-select: read once per statement, not once per row
-- (db_now() reads a setting twice a call).
    INSERT INTO {schema}.job_runs (job_id, attempt, lease_token, lease_expires_at, worker_id,
                                   traced, started_at, executions, queue, partition_key,
                                   concurrency_key, parent_id, result_watched)

-- fragment: claim_run_values
    SELECT c.id, c.attempt + 1, gen_random_uuid(),
           (SELECT {schema}.db_now()) + %(lease_seconds)s * interval '1 second',
           %(worker_id)s, %(traced)s,

-- fragment: claim_run_rest
           c.executions + 1, c.queue, c.partition_key, c.concurrency_key, c.parent_id,
           c.result_watched

-- fragment: claim_returning
-- A claimed job as PgDriver's `_claimed_job` reads it (both claim statements), from its run
-- `u` and its row `j`: the job's columns, its history when it has any (one ordered aggregate
-- per such row), its parent.
    SELECT j.id, j.queue, j.task, j.payload, u.attempt, j.max_attempts, u.lease_token,
           j.partition_key, j.priority, j.run_at, j.created_at, j.cancel_requested,
           j.version,
           CASE WHEN j.checkpoint_count > 0 THEN
               (SELECT jsonb_agg(jsonb_build_array(c.position, c.kind, c.name, c.value)
                                 ORDER BY c.position)
                FROM {schema}.checkpoints c WHERE c.job_id = j.id) END AS history,
           j.parent_id, j.concurrency_key
    FROM run u JOIN {schema}.job_rows j ON j.id = u.job_id

-- fragment: key_visit(cte, key, kind, cursor)
-- The keys with ready jobs of one kind (@key@: ready_keyed's kind '@kind@'), visited as a loose
-- index scan of ready_keyed's primary key (migration 0048): round-robin from the cursor (the
-- last key the previous claim visited), wrapping once to the start, at most the key window per
-- claim. A recursive CTE named @cte@ that includes this yields (@key@, n, wrapped). Partition
-- keys and concurrency keys are visited the same way. An entry is a hint until its row is
-- locked (the heads below): a key whose entries were all taken since this snapshot is visited
-- and yields nothing.
    SELECT first_key.@key@, 1 AS n, first_key.wrapped
    FROM (
        SELECT after_cursor.@key@, false AS wrapped
        FROM (SELECT e.key AS @key@ FROM {schema}.ready_keyed e
              WHERE e.queue = (SELECT %(queue)s::text) AND e.kind = '@kind@'
                AND e.key > (SELECT %(@cursor@)s::text)
              ORDER BY e.key LIMIT 1) AS after_cursor
        UNION ALL
        SELECT from_start.@key@, true
        FROM (SELECT e.key AS @key@ FROM {schema}.ready_keyed e
              WHERE e.queue = (SELECT %(queue)s::text) AND e.kind = '@kind@'
              ORDER BY e.key LIMIT 1) AS from_start
        LIMIT 1
    ) AS first_key
    WHERE (SELECT %(limit)s::int) > 0
    UNION ALL
    SELECT next_key.@key@, k.n + 1, next_key.wrapped
    FROM @cte@ k
    CROSS JOIN LATERAL (
        SELECT following.@key@, k.wrapped AS wrapped
        FROM (SELECT e.key AS @key@ FROM {schema}.ready_keyed e
              WHERE e.queue = (SELECT %(queue)s::text) AND e.kind = '@kind@'
                AND e.key > k.@key@
              ORDER BY e.key LIMIT 1) AS following
        UNION ALL
        SELECT from_start.@key@, true
        FROM (SELECT e.key AS @key@ FROM {schema}.ready_keyed e
              WHERE e.queue = (SELECT %(queue)s::text) AND e.kind = '@kind@'
              ORDER BY e.key LIMIT 1) AS from_start
        WHERE NOT k.wrapped
        LIMIT 1
    ) AS next_key
    WHERE k.n < (SELECT %(key_window)s::int)
      AND NOT (next_key.wrapped AND next_key.@key@ > (SELECT %(@cursor@)s::text))
      AND NOT (next_key.wrapped AND k.wrapped AND next_key.@key@ <= k.@key@)

-- fragment: due_locked
-- The claim's `due`: a job_due row's record, locked (its comment says how and why).
     CROSS JOIN LATERAL (
         SELECT j.id, j.priority, j.run_at, j.queue, j.partition_key, j.task, j.version,
                j.phase AS state, j.concurrency_key, j.attempt, j.executions, j.parent_id,
                j.result_watched
         FROM {schema}.job_rows j
         WHERE j.id = d.job_id AND j.phase IN ('scheduled', 'sleeping', 'waiting')
           AND j.run_at <= {schema}.db_now()
                           + (SELECT %(lookahead)s::float8) * interval '1 second'
         FOR UPDATE SKIP LOCKED
     ) AS locked

-- fragment: claim(rate)
-- Two statements are this one: job_claim (`unrated`: while no key has a rate) and
-- job_claim_rated (`rated`), which differ only in the concurrency-key fragments named
-- `*_@rate@` below (the rate's start slots, migration 0028) and one reply column.
-- The claims (this one and job_claim_plain), the lease renewal and the checkpoint writes name
-- jobs_live, not jobs: every state they read or write is unfinished, so the planner left the
-- day partitions out anyway (their CHECKs), but a plan over the parent still holds every
-- partition: each execution locks them all again (four days ahead, the retention's days,
-- jobs_unfiled), and a day's detach invalidates it. With 30 days of partitions the drain's
-- replay cost 63.5 us of backend CPU per job against 79.4 through `jobs` (bench/RESULTS.md,
-- "Claims that name jobs_live"). The completions go through `jobs`: they move the row to its
-- day.
-- The claim loop's full claim: promote due work AND claim up to %(limit)s ready jobs, in one
-- statement. Outcomes are not written here: the completer writes them with job_settle_many
-- (or job_complete_plain), on its own connection, while the claim loop claims.
-- Promotion: at most %(promote_limit)s scheduled/sleeping/waiting rows of the queue whose
-- run_at has passed become ready (found in job_due, migration 0044; each job's row locked with
-- SKIP LOCKED so racing workers split them); they are claimable from the next round (same
-- snapshot), so the statement reports how many it moved and wakes the queue. It also returns
-- the queue's next due time (one probe of job_due's (queue, run_at)) so the loop's timer
-- follows it.
-- Partition keys: a keyed row is claimable only when it is its key's head (first ready row in
-- claim order, or the key's holder when the holder is ready again after a suspension) and the
-- key is free. Keyed and unkeyed rows come from two sources, so 100,000 jobs queued behind one
-- busy key are never scanned:
--  * unkeyed: per served task, the scan of the ready ring (queue, task, priority, run_at, id;
--    the unkeyed_scan fragment) in claim order, each job's row locked with SKIP LOCKED as it
--    goes (concurrent claimers skip each other's rows and keep scanning: no collapse when
--    workers compete). One probe per served
--    task, so a backlog of a task this worker does not serve is never scanned;
--    the price is that with several served tasks each holding a backlog, up to limit rows per
--    task are locked for the statement's duration and the best `limit` of them claimed;
--  * due: unkeyed rows whose run_at has passed, locked by the promotion (below), claimed in
--    the same statement;
--  * keyed: a loose index scan (recursive CTE) visits keys with ready rows, one index probe
--    each, looks up the key's lock row, takes the key's head, keeps the best 2 x limit heads in
--    claim order and locks those with SKIP LOCKED. It visits at most %(key_window)s keys,
--    starting after %(key_cursor)s and wrapping around (round-robin, bounded cost, no key
--    starves). The lock re-checks the head's attempt and due time on the row's newest version
--    (a head claimed and failed into a retry by another worker meanwhile is not taken).
-- The key itself is taken by inserting its partition_locks row (ON CONFLICT DO NOTHING): a
-- concurrent claimer of the same key waits for our commit and then skips it, so two workers
-- whose snapshots both saw the key free never both run it; a head whose key insert
-- did nothing is simply not claimed this round (no error).
-- Every CTE that feeds a LIMIT is MATERIALIZED as an optimisation fence (Oban's trick).
-- Plan stability: every parameter that shapes an estimate (the limits, queue, tasks, versions,
-- key cursor and window, lookahead) is read through a scalar sub-select,
-- `(SELECT %(x)s)`, an InitPlan the planner does not look into. A custom plan is therefore
-- estimated exactly like the generic plan, and the plan cache keeps the generic plan after its
-- five custom plans. Seen by value (LIMIT 25 against a generic 10% of the rows, one task
-- against ten, a lookahead against a default third of job_due), the custom plans looked
-- cheaper whenever the statistics showed a ready backlog or suspended rows, and the statement
-- was planned again at every call: 2-3 ms, more than it takes to run (under suspended load;
-- tests/test_claim_path.py reads pg_prepared_statements). `x = ANY((SELECT a)::text[])`: the
-- cast keeps ANY from reading the sub-select as a set.
-- History: a claimed row with checkpoint_count > 0 carries its checkpoints (one ordered
-- aggregate per such row; rows without history never touch the checkpoints table).
WITH RECURSIVE
-- job_due's rows of the queue in run_at order, each job's row locked by primary key with SKIP
-- LOCKED (a lateral sub-select with a lock is never flattened into a join, so the plan stays
-- one probe per due row whatever the statistics). The lock re-checks the state and due time
-- on the row's newest version: a job_due row read from this statement's snapshot whose job a
-- concurrent statement promoted, claimed, woke or cancelled since is stepped over, so the copy
-- can never make a claim the row itself would not.
-- Two ranges, each LIMITed after its locks (a row another claimer holds does not count): the
-- rows already due, up to promote_limit (promoted or claimed here), and the sleeping or
-- scheduled rows due within the lookahead, up to `limit` (only due_unkeyed can take them, at
-- most `limit`; the others are left alone). One range up to promote_limit locked every row of
-- the lookahead for nothing: during a drain of sleeping workflows 198 rows locked a claim, 27
-- promoted and 25 claimed (auto_explain; bench/RESULTS.md, "Sleeping workflows on records").
due AS MATERIALIZED (
    (SELECT locked.*
     FROM {schema}.job_due d
     -- include: due_locked
     WHERE d.queue = (SELECT %(queue)s::text) AND d.run_at <= {schema}.db_now()
     ORDER BY d.run_at
     LIMIT (SELECT %(promote_limit)s::int))
    UNION ALL
    (SELECT locked.*
     FROM {schema}.job_due d
     -- include: due_locked
     WHERE d.queue = (SELECT %(queue)s::text) AND d.state IN ('sleeping', 'scheduled')
       AND d.run_at > {schema}.db_now()
       AND d.run_at <= {schema}.db_now() + (SELECT %(lookahead)s::float8) * interval '1 second'
     ORDER BY d.run_at
     LIMIT (SELECT %(limit)s::int))
),
-- Due unkeyed rows this worker serves are claim candidates at once (already locked by `due`,
-- whose lock re-checked them on their newest version): a job whose sleep, delay, backoff or
-- wait deadline ends starts in the round its timer fires, not one round later. Sleeping and
-- scheduled rows due within %(lookahead)s seconds are taken too: the executor holds such a
-- job until its run_at (its claim records started_at = run_at), so a burst of wake-ups starts
-- on time rather than a statement and a batch start-up late. Keyed due rows (either kind of
-- key) are promoted and claimed next round, through their key.
due_unkeyed AS MATERIALIZED (
    SELECT d.id, d.priority, d.run_at, d.queue, NULL::text AS partition_key, true AS held,
           NULL::text AS concurrency_key, NULL::int AS slot, NULL::smallint AS ring_slot,
           NULL::tid AS ring_row, d.attempt, d.executions, d.parent_id, d.result_watched
    FROM due d
    WHERE (SELECT %(limit)s::int) > 0 AND d.partition_key IS NULL
      AND d.concurrency_key IS NULL
      AND (d.run_at <= {schema}.db_now() OR d.state IN ('sleeping', 'scheduled'))
      AND d.task = ANY((SELECT %(tasks)s::text[])::text[])
      AND ((SELECT %(task_versions)s::text[]) IS NULL
           OR d.task || '@' || d.version = ANY((SELECT %(task_versions)s::text[])::text[]))
    ORDER BY d.priority, d.run_at, d.id
    LIMIT (SELECT %(limit)s::int)
),
ready_keys AS (
    -- include: key_visit(ready_keys, partition_key, p, key_cursor)
),
-- A free key's head is its first due entry in ready_keyed (migration 0048), in claim order: one
-- probe of the primary key's (queue, kind, key) range. A held key's only candidate is its
-- holder, ready again after a suspension: its row by primary key gives the entry's priority
-- and run_at, then one exact probe of the entry, so a key with 100,000 jobs behind its
-- holder is never walked. The entry's row address rides to the claim (`ring_row`), which
-- deletes it.
heads AS MATERIALIZED (
    SELECT head.id, head.filed, head.priority, head.run_at, head.entry_row, head.held
    FROM ready_keys k
    LEFT JOIN {schema}.partition_locks l
           ON l.queue = (SELECT %(queue)s::text) AND l.partition_key = k.partition_key
    CROSS JOIN LATERAL (
        (SELECT e.id, e.filed, e.priority, e.run_at, e.task, e.version, e.ctid AS entry_row,
                false AS held
         FROM {schema}.ready_keyed e
         WHERE l.job_id IS NULL
           AND e.queue = (SELECT %(queue)s::text) AND e.kind = 'p'
           AND e.key = k.partition_key
           AND e.run_at <= {schema}.db_now()
         ORDER BY e.priority, e.run_at, e.id
         LIMIT 1)
        UNION ALL
        (SELECT e.id, e.filed, e.priority, e.run_at, e.task, e.version, e.ctid, true AS held
         FROM {schema}.job_rows j
         JOIN {schema}.ready_keyed e
           ON e.queue = j.queue AND e.kind = 'p' AND e.key = j.partition_key
          AND e.priority = j.priority AND e.run_at = j.run_at AND e.id = j.id
         WHERE j.id = l.job_id AND j.phase = 'ready')
    ) AS head
    WHERE head.task = ANY((SELECT %(tasks)s::text[])::text[])
      AND ((SELECT %(task_versions)s::text[]) IS NULL
           OR head.task || '@' || head.version = ANY((SELECT %(task_versions)s::text[])::text[]))
    ORDER BY head.priority, head.run_at, head.id
    LIMIT 2 * (SELECT %(limit)s::int)
),
-- Driven from the heads, one primary-key probe each (a join left to the planner took a seq scan
-- of jobs as its outer side in a generic plan made while the table was empty: every row of a
-- later backlog read at every claim). The lock rechecks the row's newest version against the
-- entry: still ready, filed as the entry says (an entry read from this statement's snapshot
-- whose job was claimed, cancelled or left ready and came back since is stale, and claims
-- nothing), with the entry's priority and due time (so the entry read is the one its delete
-- below removes).
keyed AS MATERIALIZED (
    SELECT locked.id, locked.priority, locked.run_at, locked.queue, locked.partition_key, h.held,
           NULL::text AS concurrency_key, NULL::int AS slot, NULL::smallint AS ring_slot,
           h.entry_row AS ring_row, locked.attempt, locked.executions, locked.parent_id,
           locked.result_watched
    FROM heads h
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at, j.queue, j.partition_key, j.attempt, j.executions,
               j.parent_id, j.result_watched
        FROM {schema}.job_rows j
        WHERE j.id = h.id AND j.filed = h.filed AND j.priority = h.priority
          AND j.run_at = h.run_at AND j.phase = 'ready' AND j.run_at <= {schema}.db_now()
        FOR UPDATE SKIP LOCKED
    ) AS locked
),
-- Concurrency keys (migration 0027): at most the key's limit running, across queues and
-- workers. The same loose index scan as ready_keys, over ready_keyed's kind 'c', visiting
-- at most %(key_window)s keys round-robin after %(concurrency_cursor)s. Per key: its limit
-- (concurrency_limit_of: the longest matching pattern of concurrency_limits, else the
-- concurrency_limit of the key's first ready row, else 1: trioq/_core/concurrency.py
-- `claim_limit`, which job_explain reports too), the slots held (one
-- concurrency_holds row per running job of the key, any queue), and up to limit - held of its
-- due ready rows in claim order, each paired with one of the free slots below the limit,
-- lowest first. A saturated key yields no row and the scan goes on to the next key, so it
-- never leaves a slot idle. Atomicity is the holds' primary key (key_concurrency_taken
-- below). Lowest-first keeps a lowered limit safe too: a slot at or above the new limit is
-- only ever released, and a claim that saw h of them held picks slots below limit - h.
ready_concurrency_keys AS (
    -- include: key_visit(ready_concurrency_keys, concurrency_key, c, concurrency_cursor)
),
-- include: concurrency_room_@rate@
-- include: concurrency_heads_@rate@
concurrency_keyed AS MATERIALIZED (
    SELECT locked.id, locked.priority, locked.run_at, locked.queue, NULL::text AS partition_key,
           true AS held, h.concurrency_key, h.slot, NULL::smallint AS ring_slot,
           h.entry_row AS ring_row, locked.attempt, locked.executions, locked.parent_id,
           locked.result_watched
    FROM concurrency_heads h
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at, j.queue, j.attempt, j.executions, j.parent_id,
               j.result_watched
        FROM {schema}.job_rows j
        -- As `keyed`'s lock: the entry's filed, priority and due time on the newest version.
        WHERE j.id = h.id AND j.filed = h.filed AND j.priority = h.priority
          AND j.run_at = h.run_at AND j.phase = 'ready' AND j.run_at <= {schema}.db_now()
        FOR UPDATE SKIP LOCKED
    ) AS locked
),
unkeyed AS MATERIALIZED (
    SELECT per_task.*
    FROM unnest((SELECT %(tasks)s::text[])) AS served(task)
    CROSS JOIN LATERAL (
        SELECT r.id, r.priority, r.run_at, r.queue, NULL::text AS partition_key, true AS held,
               NULL::text AS concurrency_key, NULL::int AS slot, r.slot AS ring_slot,
               r.ctid AS ring_row, job.attempt, job.executions, job.parent_id,
               job.result_watched
        -- include: unkeyed_scan
    ) AS per_task
),
candidates AS MATERIALIZED (
    SELECT * FROM (SELECT * FROM unkeyed UNION ALL SELECT * FROM keyed
                   UNION ALL SELECT * FROM concurrency_keyed
                   UNION ALL SELECT * FROM due_unkeyed) AS all_sources
    -- A paused queue (`trioq queue pause`) claims nothing; its completions still go through.
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.queue_pauses p
                      WHERE p.queue = (SELECT %(queue)s::text))
    ORDER BY priority, run_at, id
    LIMIT (SELECT %(limit)s::int)
),
-- include: ring_taken
key_taken AS (
    INSERT INTO {schema}.partition_locks (queue, partition_key, job_id)
    SELECT queue, partition_key, id FROM candidates WHERE NOT held
    ORDER BY queue, partition_key  -- one lock order for every claimer: no deadlock cycles
    ON CONFLICT (queue, partition_key) DO NOTHING
    RETURNING job_id
),
-- include: concurrency_taken_@rate@
-- Due rows not claimed here become ready (claimable from the next round: same snapshot).
promoted AS (
    UPDATE {schema}.job_rows j SET phase = 'ready', filed = j.filed + 1
    FROM due d
    WHERE j.id = d.id AND d.id NOT IN (SELECT id FROM candidates)
      AND j.phase IN ('scheduled', 'sleeping', 'waiting')
      AND j.run_at <= {schema}.db_now()
    RETURNING j.id
),
ready_notified AS (
    SELECT count(pg_notify({schema}.ready_channel(q.queue), q.queue)) AS n
    FROM (SELECT (SELECT %(queue)s::text) AS queue WHERE EXISTS (SELECT 1 FROM promoted)) AS q
),
-- The claim writes the run (migration 0047); the candidates are locked rows (ready, or due).
run AS (
    -- include: claim_run_columns
    -- include: claim_run_values
    -- include: claim_started_at_@rate@
           ,
    -- include: claim_run_rest
    FROM candidates c
    WHERE (c.held AND c.slot IS NULL) OR c.id IN (SELECT job_id FROM key_taken)
          OR c.id IN (SELECT job_id FROM concurrency_taken)
    RETURNING job_id, attempt, lease_token
),
-- The entries in ready_keyed of the keyed jobs claimed here (migration 0048), by row address
-- (`ring_row` carries a keyed candidate's entry, ring_slot NULL; ready_keyed_take(), as
-- ring_taken calls ready_ring_take()): the lock above rechecked the row against the entry's
-- filed, priority and due time, so the address read is the entry filed for this spell in
-- ready. Read by the final SELECT; a claim that took no keyed job calls nothing.
keyed_taken AS MATERIALIZED (
    SELECT CASE WHEN EXISTS (SELECT 1 FROM candidates c JOIN run u ON u.job_id = c.id
                             WHERE c.ring_slot IS NULL AND c.ring_row IS NOT NULL)
                THEN {schema}.ready_keyed_take(
                         ARRAY(SELECT c.ring_row FROM candidates c JOIN run u ON u.job_id = c.id
                               WHERE c.ring_slot IS NULL AND c.ring_row IS NOT NULL),
                         ARRAY(SELECT c.id FROM candidates c JOIN run u ON u.job_id = c.id
                               WHERE c.ring_slot IS NULL AND c.ring_row IS NOT NULL))
                ELSE 0 END AS n
),
-- A keyed or due job claimed here leaves ready, scheduled, sleeping and waiting in place
-- (`claimed`): its entry is gone (keyed_taken, due_left), and the readers that still
-- find a job by its row's phase (the pages, the explanation, the rechecks of the locks) see
-- it is not ready; a job claimed from the ring keeps `ready`, its entry gone.
claimed_in_place AS (
    UPDATE {schema}.job_rows j SET phase = 'claimed'
    FROM run u, candidates c
    WHERE j.id = u.job_id AND c.id = u.job_id AND c.ring_slot IS NULL
      AND j.phase IN ('ready', 'scheduled', 'sleeping', 'waiting')
    RETURNING j.id
),
-- The due rows promoted or claimed here leave job_due (migration 0050: no trigger writes it),
-- through job_due_leave()'s fresh snapshot (its comment says why not a DELETE here). A claim
-- that locked no due row calls nothing.
due_left AS MATERIALIZED (
    SELECT CASE WHEN EXISTS (SELECT 1 FROM due)
                THEN {schema}.job_due_leave(
                         ARRAY(SELECT id FROM promoted
                               UNION ALL
                               SELECT u.job_id FROM run u JOIN due d ON d.id = u.job_id))
                ELSE 0 END AS n
),
claimed AS (
    -- include: claim_returning
)
-- The statement's own columns on every row (their sub-selects run once, as InitPlans), then
-- the claimed row's; one row of NULL job columns when nothing was claimed.
SELECT (SELECT partition_key FROM ready_keys ORDER BY n DESC LIMIT 1) AS key_cursor,
       -- Each key scan is bounded by key_window: the window is full when either one's is.
       greatest((SELECT count(*) FROM ready_keys),
                (SELECT count(*) FROM ready_concurrency_keys)) AS keys_visited,
       (SELECT count(*) FROM promoted) AS promoted,
       -- Database time as the statement ends (db_now() is its start, plus the time it ran),
       -- read per row as it is produced: the last row's is the latest. A job claimed early is
       -- held until its run_at mapped from these (trioq/_runtime/job/dbclock.py), never before.
       {schema}.db_now() + (clock_timestamp() - now()) AS now,
       (SELECT d.run_at FROM {schema}.job_due d
        WHERE d.queue = (SELECT %(queue)s::text)
          AND d.run_at > {schema}.db_now()
          AND d.job_id NOT IN (SELECT id FROM candidates)  -- claimed early, here
        ORDER BY d.run_at LIMIT 1) AS next_due,
       (SELECT concurrency_key FROM ready_concurrency_keys ORDER BY n DESC LIMIT 1)
           AS concurrency_cursor,
       claimed.*
       -- include: claim_reply_@rate@
FROM (SELECT 1) AS one
LEFT JOIN claimed ON true
-- A one-time filter that is always true reads ready_notified, ring_taken, keyed_taken and
-- due_left, so its NOTIFY and the entries' deletes run (a CTE without a data change runs only
-- when read).
WHERE (SELECT n FROM ready_notified) >= 0 AND (SELECT n FROM ring_taken) >= 0
  AND (SELECT n FROM keyed_taken) >= 0 AND (SELECT n FROM due_left) >= 0;

-- fragment: concurrency_key_limit_held
-- Both concurrency_room variants: per ready key `k`, the limit the claim applies
-- (`lim.max_running`: a pattern's, else its first ready job's, trioq/_core/concurrency.py
-- `claim_limit`) and its held slots (`held.n`). The first ready job's limit is its entry's
-- (ready_keyed, migration 0048: the first of the key's range, no job row read).
    CROSS JOIN LATERAL (
        SELECT {schema}.concurrency_limit_of(k.concurrency_key, f.concurrency_limit)
                   AS max_running
        FROM {schema}.ready_keyed f
        WHERE f.queue = (SELECT %(queue)s::text) AND f.kind = 'c'
          AND f.key = k.concurrency_key
        ORDER BY f.priority, f.run_at, f.id LIMIT 1
    ) AS lim
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM {schema}.concurrency_holds h
        WHERE h.concurrency_key = k.concurrency_key
    ) AS held

-- fragment: concurrency_key_heads_free
-- Both concurrency_heads variants: per key with room `r`, its first `r.room` due jobs in
-- claim order (`head`, from the key's entries in ready_keyed, migration 0048, with their row
-- addresses for the claim's delete), each paired with one of the key's free holds slots
-- (`free`).
    CROSS JOIN LATERAL (
        SELECT e.id, e.filed, e.priority, e.run_at, e.ctid AS entry_row,
               row_number() OVER (ORDER BY e.priority, e.run_at, e.id) AS rank
        FROM {schema}.ready_keyed e
        WHERE e.queue = (SELECT %(queue)s::text) AND e.kind = 'c'
          AND e.key = r.concurrency_key AND e.run_at <= {schema}.db_now()
          AND e.task = ANY((SELECT %(tasks)s::text[])::text[])
          AND ((SELECT %(task_versions)s::text[]) IS NULL
               OR e.task || '@' || e.version = ANY((SELECT %(task_versions)s::text[])::text[]))
        ORDER BY e.priority, e.run_at, e.id
        LIMIT r.room
    ) AS head
    JOIN LATERAL (
        SELECT s.slot, row_number() OVER (ORDER BY s.slot) AS rank
        FROM generate_series(0, r.max_running - 1) AS s(slot)
        WHERE NOT EXISTS (SELECT 1 FROM {schema}.concurrency_holds h
                          WHERE h.concurrency_key = r.concurrency_key AND h.slot = s.slot)
        ORDER BY s.slot
        LIMIT r.room
    ) AS free ON free.rank = head.rank

-- fragment: concurrency_room_unrated
concurrency_room AS MATERIALIZED (
    SELECT k.concurrency_key, lim.max_running,
           least(greatest(lim.max_running - held.n, 0), (SELECT %(limit)s::int)) AS room
    FROM ready_concurrency_keys k
    -- include: concurrency_key_limit_held
),
-- fragment: concurrency_heads_unrated
concurrency_heads AS MATERIALIZED (
    SELECT head.id, head.filed, head.priority, head.run_at, head.entry_row, r.concurrency_key,
           free.slot
    FROM concurrency_room r
    -- include: concurrency_key_heads_free
    WHERE r.room > 0
    ORDER BY head.priority, head.run_at, head.id
    LIMIT 2 * (SELECT %(limit)s::int)
),
-- fragment: concurrency_taken_unrated
-- A concurrency key's slot is taken by inserting its holds row, after the partition keys
-- (the scalar read of key_taken orders the two inserts the same way in every claimer, and the
-- ORDER BY orders the slots: no deadlock cycles); a conflicting insert waits for the other
-- claimer's commit, then does nothing, and that job is not claimed this round.
concurrency_taken AS (
    INSERT INTO {schema}.concurrency_holds (concurrency_key, slot, job_id)
    SELECT concurrency_key, slot, id FROM candidates
    WHERE slot IS NOT NULL AND (SELECT count(*) FROM key_taken) >= 0
    ORDER BY concurrency_key, slot
    ON CONFLICT (concurrency_key, slot) DO NOTHING
    RETURNING job_id
),
-- fragment: claim_started_at_unrated
        -- A keyed job (a partition or a concurrency key) starts when its key or slot was
        -- taken, after this statement's snapshot (the statement's start can precede the
        -- commit that freed the key, when the claim waited for its lock: a few ms under
        -- load): stored start and finish times then never show a key's runs overlapping or
        -- more than its limit at once.
           CASE WHEN c.slot IS NULL AND c.partition_key IS NULL
                THEN greatest({schema}.db_now(), c.run_at)
                ELSE greatest({schema}.db_now() + (clock_timestamp() - now()), c.run_at) END
-- fragment: claim_reply_unrated
-- Nothing: the reply's columns end with the claimed row's.

-- fragment: concurrency_room_rated
-- As concurrency_room_unrated, and per key the rate of concurrency_rate_of
-- with the key's starts in its window (concurrency_rate_starts, counted at the statement's
-- start: an earlier time counts more starts, never fewer), read in one pass over the key's
-- slot rows (at most rate_allowed of them, the primary key's prefix): the count, the slots
-- free again (`stale`, their start a period old) and the next slot never used. `room` is
-- the tighter of the limit's and the rate's; `rate_room` and `other_room` tell the reply
-- whether the rate is what held the key back, `oldest` when its window first changes.
concurrency_room AS MATERIALIZED (
    SELECT k.concurrency_key, lim.max_running, rate.rate_allowed, rate.rate_period,
           recent.stale, recent.next_slot, recent.oldest,
           CASE WHEN rate.rate_allowed IS NOT NULL
                THEN greatest(rate.rate_allowed - recent.n, 0) END AS rate_room,
           least(greatest(lim.max_running - held.n, 0), (SELECT %(limit)s::int)) AS other_room,
           least(greatest(lim.max_running - held.n, 0), (SELECT %(limit)s::int),
                 CASE WHEN rate.rate_allowed IS NOT NULL
                      THEN greatest(rate.rate_allowed - recent.n, 0) END) AS room
    FROM ready_concurrency_keys k
    -- include: concurrency_key_limit_held
    LEFT JOIN LATERAL {schema}.concurrency_rate_of(k.concurrency_key) AS rate ON true
    LEFT JOIN LATERAL (
        SELECT count(*) FILTER (WHERE s.started_at > w.start) AS n,
               min(s.started_at) FILTER (WHERE s.started_at > w.start) AS oldest,
               coalesce(array_agg(s.slot ORDER BY s.slot)
                            FILTER (WHERE s.started_at <= w.start
                                      AND s.slot < rate.rate_allowed), '{}') AS stale,
               coalesce(max(s.slot) + 1, 0) AS next_slot
        FROM (SELECT {schema}.db_now() - rate.rate_period * interval '1 second' AS start) AS w
        LEFT JOIN {schema}.concurrency_rate_starts s ON s.concurrency_key = k.concurrency_key
    ) AS recent ON rate.rate_allowed IS NOT NULL
),

-- fragment: concurrency_heads_rated
-- As concurrency_heads_unrated, each head of a rated key also paired with one of the key's
-- free start slots, lowest first: the slots free again, then new ones after the highest
-- (slots are taken lowest first, so a key's rows are slots 0 to next_slot - 1). Racing
-- claimers that saw the same rows pick the same slots and collide, as with holds, which
-- keeps a lowered rate exact (a start in a slot at or above the new rate still counts in
-- `room`, and its slot is never taken again). No slot is probed one by one: the free ones
-- come from the one pass over the key's rows above, so a rate of thousands per period costs
-- a read of its rows, not a probe per candidate slot (at 10000/s over 50 keys the two ways
-- drained at the same 0.67-0.68x of the unrated statement's rate: bench/RESULTS.md).
concurrency_heads AS MATERIALIZED (
    SELECT head.id, head.filed, head.priority, head.run_at, head.entry_row, r.concurrency_key,
           free.slot, rate_free.slot AS rate_slot, r.rate_period
    FROM concurrency_room r
    -- include: concurrency_key_heads_free
    LEFT JOIN LATERAL (
        SELECT f.slot, row_number() OVER (ORDER BY f.slot) AS rank
        FROM (SELECT unnest(r.stale) AS slot
              UNION ALL
              SELECT generate_series(r.next_slot,
                                     least(r.rate_allowed, r.next_slot + r.room) - 1)) AS f
        WHERE r.rate_allowed IS NOT NULL  -- least() skips a NULL: no slots for unrated keys
        ORDER BY f.slot
        LIMIT r.room
    ) AS rate_free ON rate_free.rank = head.rank
    WHERE r.room > 0 AND (r.rate_allowed IS NULL OR rate_free.slot IS NOT NULL)
    ORDER BY head.priority, head.run_at, head.id
    LIMIT 2 * (SELECT %(limit)s::int)
),

-- fragment: concurrency_taken_rated
-- A rated key's start slot is taken first (after the partition keys, slots in one order for
-- every claimer), then its holds row, only for the jobs whose start slot was taken: a holds
-- row of a job that is not claimed would never be released. The slot's start time is the
-- clock as the row is written (after this statement's snapshot, as a keyed job's start must
-- be; a limited queue's queue_limit_spend keeps it), and the WHERE compares
-- the slot's newest version against the time being stored (SET evaluates after it, later or
-- equal), so stored starts of one slot are always a period apart. A start slot taken for a job whose holds insert then conflicts is
-- spent without a start (the key starts one fewer in that window: never more).
rate_taken AS (
    INSERT INTO {schema}.concurrency_rate_starts AS s (concurrency_key, slot, started_at,
                                                      rate_period, job_id)
    SELECT DISTINCT ON (h.concurrency_key, h.rate_slot)
           h.concurrency_key, h.rate_slot,
           {schema}.db_now() + (clock_timestamp() - now()), h.rate_period, h.id
    FROM concurrency_heads h
    WHERE h.rate_slot IS NOT NULL AND h.id IN (SELECT id FROM candidates)
      AND (SELECT count(*) FROM key_taken) >= 0
    ORDER BY h.concurrency_key, h.rate_slot
    ON CONFLICT (concurrency_key, slot) DO UPDATE
        SET started_at = {schema}.db_now() + (clock_timestamp() - now()),
            rate_period = excluded.rate_period, job_id = excluded.job_id
        WHERE s.started_at <= {schema}.db_now() + (clock_timestamp() - now())
                              - excluded.rate_period * interval '1 second'
    RETURNING s.job_id, s.concurrency_key, s.started_at
),
concurrency_taken AS (
    INSERT INTO {schema}.concurrency_holds (concurrency_key, slot, job_id)
    SELECT c.concurrency_key, c.slot, c.id FROM candidates c
    WHERE c.slot IS NOT NULL AND (SELECT count(*) FROM key_taken) >= 0
      AND (c.id NOT IN (SELECT h.id FROM concurrency_heads h WHERE h.rate_slot IS NOT NULL)
           OR c.id IN (SELECT t.job_id FROM rate_taken t))
    ORDER BY c.concurrency_key, c.slot
    ON CONFLICT (concurrency_key, slot) DO NOTHING
    RETURNING job_id
),

-- fragment: claim_started_at_rated
        -- As claim_started_at_unrated; a rated key's job starts at its start slot's time, so
        -- the stored starts show the rate exactly.
           CASE WHEN c.slot IS NULL AND c.partition_key IS NULL
                THEN greatest({schema}.db_now(), c.run_at)
                ELSE greatest(coalesce((SELECT t.started_at FROM rate_taken t
                                        WHERE t.job_id = c.id),
                                       {schema}.db_now() + (clock_timestamp() - now())),
                              c.run_at) END

-- fragment: claim_reply_rated
       -- The earliest time a visited key that its rate held back may start again: the oldest
       -- start in its window leaves it (the first taken here, when the window had none). The
       -- claim loop's timer follows it (no poll while a key waits for its rate); NULL: no key
       -- was held back by its rate (a key held back by its limit waits for a slot).
       , (SELECT min(coalesce(r.oldest, taken.first) + r.rate_period * interval '1 second')
          FROM concurrency_room r
          CROSS JOIN LATERAL (SELECT count(*) AS n, min(t.started_at) AS first FROM rate_taken t
                              WHERE t.concurrency_key = r.concurrency_key) AS taken
          WHERE r.rate_room < r.other_room AND r.rate_room <= taken.n)
           AS key_rate_limited_until

-- name: job_claim
-- The claim loop's full claim (the claim fragment above) while no key rate is set anywhere.
-- include: claim(unrated)

-- name: job_claim_rated
-- The full claim while some key has a rate (a row of concurrency_rates, migration 0028): the
-- same statement, its concurrency-key part also taking each rated key's start slots, and
-- one more column, key_rate_limited_until. PgDriver runs it instead of job_claim only then,
-- so a cluster without key rates claims with the statement it had before.
-- include: claim(rated)

-- name: job_settle_many
-- The completer's flush (and a handler's transactional completion): record the outcomes of
-- finished executions, fenced, in one statement; the batch is the unit of transfer. A row
-- changes only if this attempt still owns it (id, attempt, lease_token, running). One row per
-- outcome, carrying the values its kind's rule decided (trioq/_core/outcomes.py: new state,
-- run_at, attempt change, key release, history entry, final); docs/state-machine.md lists
-- them. Final outcomes of jobs somebody waits for (result_watched) are announced on the result
-- channels (one pg_notify per channel per batch); rows that became ready wake their queue (one
-- pg_notify per queue); finished children wake their parents. Nothing is claimed or promoted
-- here (the claim loop's job_claim does both), so outcomes are written beside the next claim
-- instead of inside it. The reply is one row: the ids and states whose fence held, database
-- time, and the earliest new run_at among the rows suspended or scheduled here (the claim
-- loop's timer takes it: a claim sent before this commit could not see them).
-- Every parameter is read through a scalar sub-select, as in the claim (plan stability).
WITH input AS MATERIALIZED (
    SELECT t.*,
           CASE WHEN t.moves_run_at
                THEN coalesce(t.wake_at, {schema}.db_now() + t.delay * interval '1 second')
                END AS next_run_at
    FROM unnest((SELECT %(ids)s::bigint[]), (SELECT %(attempts)s::int[]),
                (SELECT %(lease_tokens)s::uuid[]), (SELECT %(states)s::text[]),
                (SELECT %(ready_when_due)s::bool[]), (SELECT %(moves_run_at)s::bool[]),
                (SELECT %(attempt_changes)s::int[]), (SELECT %(releases_key)s::bool[]),
                (SELECT %(histories)s::text[]), (SELECT %(finals)s::bool[]),
                (SELECT %(clears_worker)s::bool[]), (SELECT %(results)s::text[]),
                (SELECT %(errors)s::text[]), (SELECT %(delays)s::float8[]),
                (SELECT %(wake_ats)s::timestamptz[]))
         AS t(id, attempt, lease_token, state, ready_when_due, moves_run_at, attempt_change,
              releases_key, history, final, clears_worker, result, error, delay, wake_at)
),
-- The values were decided by the outcome rules (trioq/_core/outcomes.py); this only applies
-- them, to rows the settling lease still holds. The one comparison left is the database's: a
-- time-based outcome whose new run_at has passed is ready at once.
-- The fence is the run (migration 0047), ended by job_runs_settle_fenced() (by primary key
-- whatever job_runs' size, as the completions' job_runs_finish_fenced()), and each of the
-- batch's rows is joined to its run by the whole fence (a batch may name a job twice: that
-- function says when); a cancelled outcome is recorded only for a stored request (a cancel or
-- a passed deadline sets it on the row): a worker told to cancel by anything else changes
-- nothing here.
gone AS MATERIALIZED (
    SELECT u.run_job_id AS job_id, u.run_attempt AS attempt, u.run_executions AS executions,
           u.run_worker_id AS worker_id, u.run_traced AS traced,
           u.run_started_at AS started_at, u.run_result_watched AS result_watched,
           u.run_lease_token AS lease_token
    FROM {schema}.job_runs_settle_fenced((SELECT %(ids)s::bigint[]),
                                         (SELECT %(attempts)s::int[]),
                                         (SELECT %(lease_tokens)s::uuid[]),
                                         (SELECT %(states)s::text[])) AS u
),
-- Then the record, for the outcomes that are not final: the outcome's phase, the run's attempt
-- (changed as the rule says: a release gives it back), executions, worker and start. A move
-- into ready counts in `filed`, which files the job's entry (the trigger) even when the record
-- read ready while the job ran.
moved AS (
    UPDATE {schema}.job_rows j
    SET phase = CASE WHEN i.ready_when_due AND i.next_run_at <= {schema}.db_now() THEN 'ready'
                     ELSE i.state END,
        filed = j.filed + CASE WHEN i.state = 'ready'
                                    OR (i.ready_when_due AND i.next_run_at <= {schema}.db_now())
                               THEN 1 ELSE 0 END,
        run_at = CASE WHEN i.moves_run_at THEN i.next_run_at ELSE j.run_at END,
        attempt = g.attempt + i.attempt_change,
        executions = g.executions,
        traced = g.traced,
        error = i.error::jsonb,
        worker_id = CASE WHEN i.clears_worker THEN NULL ELSE g.worker_id END,
        started_at = CASE WHEN i.clears_worker THEN NULL ELSE g.started_at END
    FROM gone g
    JOIN input i
      ON i.id = g.job_id AND i.attempt = g.attempt AND i.lease_token = g.lease_token
    WHERE j.id = g.job_id AND NOT i.final
      -- include: running_by_key
    -- The run's attempt, worker and start: the attempt history records the execution's.
    RETURNING j.id, g.attempt, j.phase AS state, j.queue, j.partition_key,
              g.worker_id, g.started_at, j.error, j.run_at, i.releases_key, i.history,
              i.final, j.parent_id, j.result_watched OR g.result_watched AS result_watched
),
-- A record suspended here (sleeping, waiting, scheduled for a retry) is filed in job_due in
-- this statement (migration 0050; a row trigger did it, a PL/pgSQL call per sleep): a plain
-- insert, since a running job's record is ready or claimed (running_by_key) and has no copy.
due_filed AS (
    INSERT INTO {schema}.job_due (job_id, queue, state, run_at)
    SELECT m.id, m.queue, m.state, m.run_at
    FROM moved m
    WHERE m.state IN ('scheduled', 'sleeping', 'waiting')
),
-- A final outcome is appended (migration 0049) and the record is left as it is (its phase
-- reads ready or claimed under the outcome, which decides the state): read, not written.
ended AS MATERIALIZED (
    SELECT g.job_id AS id, g.attempt, g.executions, g.worker_id, g.started_at,
           g.result_watched, i.state, i.result, i.error, i.attempt_change, i.clears_worker,
           i.releases_key, i.history, j.queue, j.partition_key, j.run_at, j.parent_id,
           j.result_watched AS row_watched, j.deadline_at, j.deadline_source
    FROM gone g
    JOIN input i
      ON i.id = g.job_id AND i.attempt = g.attempt AND i.lease_token = g.lease_token
    JOIN {schema}.job_rows j ON j.id = g.job_id
    WHERE i.final
),
finished AS (
    INSERT INTO {schema}.job_outcomes (job_id, state, result, error, attempt, executions,
                                       worker_id, started_at, finished_at, queue)
    SELECT e.id, e.state, e.result::jsonb,
           -- A cancelled attempt of a job past its deadline was cancelled by the deadline
           -- pass (job_deadline_pass): its error says so. Rows without a deadline compare one
           -- NULL, and only when cancelled.
           CASE WHEN e.state = 'cancelled' AND e.deadline_at <= {schema}.db_now()
                THEN {schema}.deadline_error(e.deadline_at, e.deadline_source)
                ELSE e.error::jsonb END,
           e.attempt + e.attempt_change, e.executions,
           CASE WHEN e.clears_worker THEN NULL ELSE e.worker_id END,
           CASE WHEN e.clears_worker THEN NULL ELSE e.started_at END,
           {schema}.db_now(), e.queue
    FROM ended e
    RETURNING job_id, state, error
),
settled AS (
    SELECT * FROM moved
    UNION ALL
    SELECT f.job_id, e.attempt, f.state, e.queue, e.partition_key, e.worker_id, e.started_at,
           f.error, e.run_at, e.releases_key, e.history, true, e.parent_id,
           e.row_watched OR e.result_watched
    FROM finished f JOIN ended e ON e.id = f.job_id
),
unlocked AS (
    DELETE FROM {schema}.partition_locks l
    USING settled s
    WHERE s.releases_key AND s.partition_key IS NOT NULL
      AND l.queue = s.queue AND l.partition_key = s.partition_key AND l.job_id = s.id
    RETURNING l.job_id
),
history AS (
    INSERT INTO {schema}.attempts (job_id, attempt, outcome, error_type, error_message,
                                   traceback, trace_id, worker_id, started_at, finished_at)
    SELECT id, attempt, history,
           error ->> 'type', error ->> 'message', error ->> 'traceback', error ->> 'trace_id',
           worker_id, started_at, {schema}.db_now()
    FROM settled WHERE history IS NOT NULL
),
-- Only jobs a waiter registered for (result_watched, job_result_watch): a commit that sent a
-- NOTIFY takes a database-wide lock, and the flushes of 8 workers queued on it.
results_notified AS (
    SELECT count(pg_notify(channel, ids)) AS n
    FROM (SELECT {schema}.result_channel(id) AS channel, string_agg(id::text, ',') AS ids
          FROM settled WHERE final AND result_watched
          GROUP BY 1) AS per_channel
),
ready_notified AS (
    SELECT count(pg_notify({schema}.ready_channel(q.queue), q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM settled WHERE state = 'ready') AS q
),
-- Children finished here wake their parents IN THIS STATEMENT: parents_notify (its file in
-- functions/) holds the rule, docs/workflows.md "Lock order" says why no wake-up is lost. Parents
-- this statement settles itself are left to it. A batch that finished no child does not
-- enter the function.
parents_woken AS MATERIALIZED (
    SELECT CASE WHEN EXISTS (SELECT 1 FROM settled WHERE final AND parent_id IS NOT NULL)
                THEN {schema}.parents_notify(
                         ARRAY(SELECT id FROM settled WHERE final AND parent_id IS NOT NULL),
                         ARRAY(SELECT id FROM input))
                ELSE 0 END AS n
)
-- The notification CTEs are read here (scalar sub-selects always run), so they fire even when
-- nothing was settled.
SELECT coalesce(array_agg(id ORDER BY id), '{}') AS ids,
       coalesce(array_agg(state ORDER BY id), '{}') AS states,
       {schema}.db_now() + (clock_timestamp() - now()) AS now,
       min(run_at) FILTER (WHERE state IN ('scheduled', 'sleeping', 'waiting')) AS next_due,
       (SELECT n FROM results_notified) + (SELECT n FROM ready_notified)
       + (SELECT n FROM parents_woken) AS notified
FROM settled;


-- name: job_claim_plain
-- The claim loop's claim in the common case, as a statement of its own: a plan a fifth the size
-- of job_claim's. PostgreSQL builds a prepared statement's whole plan at every execution (every
-- CTE, InitPlan, result relation and its indexes and CHECKs), used or not: that start-up is
-- paid per claim, about half a millisecond for the full statement, and a drain of plain jobs
-- needs none of its keyed, due and promotion parts. The claim loop asks for it (`Claim.plain`)
-- when the queue's last claim said the next may be plain (`ClaimResult.plain_next`: it saw no
-- ready keyed row, promoted nothing, and its next due time was beyond the lookahead), so there
-- is likely nothing to promote, nothing to claim early and no key head to take. A queue whose
-- delayed jobs or retries are due later still claims plainly.
-- The same pause check and unkeyed claim (per served task and version, SKIP LOCKED, claim
-- order) as job_claim. Two probes run first: a ready keyed row in the queue (`keyed_ready`) and
-- the queue's earliest scheduled, sleeping or waiting run_at (`next_due`). When there is a
-- keyed row, or a row due within the lookahead, this statement claims nothing (`blocked`) and
-- PgDriver runs job_claim at once on the same connection, so a claim takes exactly what the
-- full statement would have, and the next claims are full ones until a full claim sees no such
-- row. `next_due` also sets the loop's timer, as the full statement's does.
-- The claim's UPDATE finds its rows through the primary key (`= ANY(ARRAY(...))`): a join
-- left to the planner took a seq scan of jobs in a generic plan (estimates of a LIMIT read
-- through a sub-select are a tenth of the table). One enqueue, then one claim of it, 300 times,
-- on a durable cluster (load 2.3): the claim's round trip, commit included, 0.590 ms (p50)
-- (the raw loop's claim on its own table: 0.362 ms).
WITH probe AS MATERIALIZED (
    SELECT keyed.ready AS keyed_ready, due.run_at AS next_due,
           keyed.ready OR coalesce(due.run_at <= {schema}.db_now()
                                   + (SELECT %(lookahead)s::float8) * interval '1 second',
                                   false) AS blocked
    -- ready_keyed (migration 0048): one probe of its primary key's queue prefix, both kinds of
    -- key. An entry taken since this snapshot still counts: the full claim then finds nothing
    -- keyed, and says the next claim may be plain. The first entry in key order, not EXISTS:
    -- an EXISTS is planned as a semi-join costed to its first match, and its generic plan made
    -- while the table was small scanned ready_keyed (every other queue's keyed backlog read
    -- at every plain claim; tests/test_plain_rounds.py); the ORDER BY is served by the key.
    FROM (SELECT (SELECT e.queue FROM {schema}.ready_keyed e
                  WHERE e.queue = (SELECT %(queue)s::text)
                  ORDER BY e.queue, e.kind, e.key LIMIT 1) IS NOT NULL AS ready
          -- OFFSET 0: `keyed` is read twice above; pulled up, its index probe was planned
          -- (and run) once for each read.
          OFFSET 0) AS keyed
    -- job_due (migration 0044): one probe of its (queue, run_at).
    LEFT JOIN LATERAL (SELECT d.run_at FROM {schema}.job_due d
                       WHERE d.queue = (SELECT %(queue)s::text) AND d.run_at IS NOT NULL
                       ORDER BY d.run_at LIMIT 1) AS due ON true
),
unkeyed AS MATERIALIZED (
    SELECT per_task.*
    FROM unnest((SELECT %(tasks)s::text[])) AS served(task)
    CROSS JOIN LATERAL (
        SELECT r.id, r.priority, r.run_at, r.slot AS ring_slot, r.ctid AS ring_row, r.queue,
               job.*
        -- include: unkeyed_scan
    ) AS per_task
    WHERE NOT (SELECT blocked FROM probe)  -- a one-time filter: no row is scanned or locked
),
candidates AS MATERIALIZED (
    SELECT id, ring_slot, ring_row, run_at, queue, NULL::text AS partition_key,
           NULL::text AS concurrency_key, attempt, executions, parent_id, result_watched, task,
           payload, max_attempts, created_at, cancel_requested, version, checkpoint_count,
           priority
    FROM unkeyed
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.queue_pauses p
                      WHERE p.queue = (SELECT %(queue)s::text))
    ORDER BY priority, run_at, id
    LIMIT (SELECT %(limit)s::int)
),
-- include: ring_taken
-- The claim writes the run, not the job's row (migration 0047): the row was locked by the
-- scan, and its entry is deleted by ring_taken.
run AS (
    -- include: claim_run_columns
    -- include: claim_run_values
           greatest((SELECT {schema}.db_now()), c.run_at),
    -- include: claim_run_rest
    FROM candidates c
    RETURNING job_id, attempt, lease_token
),
-- The claimed jobs as claim_returning gives them, from the version the scan locked: no second
-- probe of jobs_live (2.5 buffer accesses a job: 32.2 against main's 29.6 with it).
-- MATERIALIZED: pulled up under the final LEFT JOIN, the history became a placeholder the
-- planner computes where its columns are first available, the scan of `candidates`, which is
-- the inner side of the join with `run` (both estimated at one row): every resumed workflow's
-- history was read once per pair, 625 times in a claim of 25 (6.3 ms of its 7.0, auto_explain
-- during a drain of sleeping workflows: bench/RESULTS.md, "Sleeping workflows on records").
-- Materialized, the join is done first and the history read once per claimed job.
claimed AS MATERIALIZED (
    SELECT c.id, c.queue, c.task, c.payload, u.attempt, c.max_attempts, u.lease_token,
           c.partition_key, c.priority, c.run_at, c.created_at, c.cancel_requested, c.version,
           CASE WHEN c.checkpoint_count > 0 THEN
               (SELECT jsonb_agg(jsonb_build_array(h.position, h.kind, h.name, h.value)
                                 ORDER BY h.position)
                FROM {schema}.checkpoints h WHERE h.job_id = c.id) END AS history,
           c.parent_id, c.concurrency_key
    FROM run u JOIN candidates c ON c.id = u.job_id
)
-- job_claim's columns, with `blocked` and `keyed_ready` where it has key_cursor and
-- keys_visited (the same positions of `now` and `next_due` let one decode read both).
SELECT (SELECT blocked FROM probe) AS blocked,
       (SELECT keyed_ready FROM probe) AS keyed_ready,
       0 AS promoted,
       {schema}.db_now() + (clock_timestamp() - now()) AS now,
       (SELECT next_due FROM probe) AS next_due,
       NULL::text AS concurrency_cursor,
       claimed.*
FROM (SELECT 1) AS one
LEFT JOIN claimed ON true
-- A one-time filter that is always true reads ring_taken, so the entries' delete runs.
WHERE (SELECT n FROM ring_taken) >= 0;

-- name: job_complete_plain
-- The completer's flush in the common case, chosen by PgDriver.job_settle_many: every outcome a
-- completion of a job without a partition key or a parent (`Settlement.plain`), so no key is
-- released, no attempt recorded, no parent woken and no row suspended. The same fenced
-- completion and result notifications as job_settle_many, without the rest: PostgreSQL builds
-- a prepared statement's whole plan at every execution. With nobody waiting the statement
-- sends no NOTIFY, so its commit skips the database-wide lock that notifying commits queue on.
WITH input AS MATERIALIZED (
    SELECT t.*
    FROM unnest((SELECT %(ids)s::bigint[]), (SELECT %(attempts)s::int[]),
                (SELECT %(lease_tokens)s::uuid[]), (SELECT %(results)s::text[]))
         AS t(id, attempt, lease_token, result)
),
-- The fence is the run (migration 0047): deleted by primary key, it returns what the outcome
-- records. Through job_runs_finish_fenced(), whose plan probes the key whatever job_runs' size
-- when it was made (a generic plan made on a page or two scanned the table whole as it
-- bloated: 573 buffer hits a completion of 25 after a 20,000-job drain, 381 through the
-- function; main's 281).
gone AS MATERIALIZED (
    SELECT u.run_job_id AS job_id, u.run_attempt AS attempt, u.run_executions AS executions,
           u.run_worker_id AS worker_id, u.run_started_at AS started_at,
           u.run_result_watched AS result_watched, u.run_queue AS queue, i.result
    FROM {schema}.job_runs_finish_fenced((SELECT %(ids)s::bigint[]),
                                      (SELECT %(attempts)s::int[]),
                                      (SELECT %(lease_tokens)s::uuid[])) AS u
    -- By the whole fence: a batch may name a job twice, a lost run's outcome beside the
    -- current one's (job_runs_finish_fenced() says when).
    JOIN input i
      ON i.id = u.run_job_id AND i.attempt = u.run_attempt
     AND i.lease_token = u.run_lease_token
),
-- The outcome is appended; the record is not written (migration 0049: it reads `ready` under
-- its outcome, which decides the state). A waiter registered by job_result_watch after the
-- claim set the run's flag too (its second write), so the run's flag is the one to read.
settled AS (
    INSERT INTO {schema}.job_outcomes (job_id, state, result, error, attempt, executions,
                                       worker_id, started_at, finished_at, queue)
    SELECT g.job_id, 'completed', g.result::jsonb, NULL, g.attempt, g.executions, g.worker_id,
           g.started_at, {schema}.db_now(), g.queue
    FROM gone g
    RETURNING job_id AS id, state
),
results_notified AS (
    SELECT count(pg_notify(channel, ids)) AS n
    FROM (SELECT {schema}.result_channel(job_id) AS channel,
                 string_agg(job_id::text, ',') AS ids
          FROM gone WHERE result_watched GROUP BY 1) AS per_channel
)
SELECT coalesce(array_agg(id ORDER BY id), '{}') AS ids,
       coalesce(array_agg(state ORDER BY id), '{}') AS states,
       (SELECT n FROM results_notified) AS notified,  -- read here, so it always runs
       {schema}.db_now() + (clock_timestamp() - now()) AS now
FROM settled;

-- name: job_complete_discard
-- The completer's flush of completions its tasks keep nothing of (`@app.task(keep=False)`; never
-- a workflow's child, whose parent reads the outcome): the row is DELETEd, fenced as in
-- job_complete_plain, instead of marked completed. What belongs to it goes with it: attempts,
-- messages, values, its partition lock and checkpoints (the jobs_deleted trigger) and its
-- concurrency slot (the run's trigger, job_runs_concurrency_release). A waiter
-- is told, as for any final outcome, and finds no row. A statement of its own, not a branch of
-- the plain completion: that one runs at every flush of every worker, and a DELETE in it would
-- be planned at each execution whether a batch discards anything or not. Its reply has
-- job_complete_plain's columns; the states read `completed`.
-- The fence is the run, ended by job_runs_finish_fenced() (found by primary key whatever
-- job_runs' size).
WITH gone AS MATERIALIZED (
    SELECT u.run_job_id AS job_id, u.run_result_watched AS result_watched
    FROM {schema}.job_runs_finish_fenced((SELECT %(ids)s::bigint[]),
                                      (SELECT %(attempts)s::int[]),
                                      (SELECT %(lease_tokens)s::uuid[])) AS u
),
discarded AS (
    DELETE FROM {schema}.job_rows j
    USING gone g
    WHERE j.id = g.job_id
      -- include: running_by_key
    RETURNING j.id, j.result_watched OR g.result_watched AS result_watched
),
results_notified AS (
    SELECT count(pg_notify(channel, ids)) AS n
    FROM (SELECT {schema}.result_channel(id) AS channel, string_agg(id::text, ',') AS ids
          FROM discarded WHERE result_watched GROUP BY 1) AS per_channel
)
SELECT coalesce(array_agg(id ORDER BY id), '{}') AS ids,
       coalesce(array_agg('completed'::text ORDER BY id), '{}') AS states,
       (SELECT n FROM results_notified) AS notified,  -- read here, so it always runs
       {schema}.db_now() + (clock_timestamp() - now()) AS now
FROM discarded;

-- fragment: checkpoint_writes
WITH input AS MATERIALIZED (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(lease_tokens)s::uuid[],
                         %(positions)s::int[], %(kinds)s::text[], %(names)s::text[],
                         %(values)s::text[], %(wake_ins)s::float8[])
             AS t(id, attempt, lease_token, position, kind, name, value, wake_in)
),
-- The fence is the run (migration 0047), locked first (docs/workflows.md, "Lock order"), then
-- the row written.
fenced AS MATERIALIZED (
    SELECT u.job_id AS id, u.attempt, u.lease_token, n.next_position
    FROM (SELECT id, attempt, lease_token, max(position) + 1 AS next_position
          FROM input GROUP BY id, attempt, lease_token) AS n
    JOIN {schema}.job_runs u
      ON u.job_id = n.id AND u.attempt = n.attempt AND u.lease_token = n.lease_token
    ORDER BY u.job_id
    FOR SHARE OF u
),
owner AS (
    UPDATE {schema}.job_rows j
    SET checkpoint_count = greatest(j.checkpoint_count, f.next_position)
    FROM fenced f
    WHERE j.id = f.id
    RETURNING j.id
),
written AS (
    INSERT INTO {schema}.checkpoints (job_id, position, kind, name, value, created_at)
    SELECT i.id, i.position, i.kind, i.name,
           CASE WHEN i.wake_in IS NULL THEN i.value::jsonb
                ELSE coalesce(i.value::jsonb, '{}'::jsonb) || jsonb_build_object(
                    'wake_at', {schema}.db_now() + i.wake_in * interval '1 second') END,
           {schema}.db_now()
    -- By the whole fence: a batch may hold a lost run's writes beside the current run's of
    -- the same job (job_runs_finish_fenced() says when); only the run's own are written.
    FROM input i
    JOIN fenced f
      ON f.id = i.id AND f.attempt = i.attempt AND f.lease_token = i.lease_token
    JOIN owner o ON o.id = i.id
    ON CONFLICT (job_id, position) DO NOTHING
    RETURNING job_id, position, value
)

-- fragment: checkpoints_written
-- A position already taken (a write repeated after a lost connection) returns the stored value,
-- read only then: coalesce runs the sub-select for a write that stored nothing, where a join
-- probed the checkpoints index once per write of every batch.
SELECT i.id, i.position,
       coalesce(w.value, (SELECT e.value FROM {schema}.checkpoints e
                          WHERE e.job_id = i.id AND e.position = i.position)) AS value
FROM input i
JOIN fenced f ON f.id = i.id AND f.attempt = i.attempt AND f.lease_token = i.lease_token
JOIN owner o ON o.id = i.id
LEFT JOIN written w ON w.job_id = i.id AND w.position = i.position

-- name: checkpoint_insert_many
-- Group commit of workflow checkpoints: the checkpoints of every concurrently running handler
-- in one statement. Fenced through the job row: the UPDATE takes the row lock and re-checks
-- (id, attempt, lease_token, running) on its newest version, so a write racing a lease recovery
-- either commits before it or changes nothing; a job not returned has lost its lease. That lock
-- is also what keeps a DELETE of the job out until the checkpoints are committed (checkpoints
-- has no foreign key, migration 0033: its per-row check was a fifth of this statement). The job
-- row's checkpoint_count becomes the next free position (the claim loads history only when it
-- is above 0). A value given as `wake_in` seconds is stored as {"wake_at": db_now() + wake_in}
-- merged into the value object: durable sleeps take their wake time from database time.
-- This form also writes the ctx.set_value values the batch carries; a batch that carries none
-- is sent as checkpoint_insert_many_plain (below).
-- include: checkpoint_writes
-- The values set since a job's last checkpoint ride on its next one. The last value of a key
-- wins when a batch carries two writes of one job; waiting `client.get_value` callers are
-- woken on the job's result channel.
,
value_input AS (
    SELECT DISTINCT ON (v.id, v.key) v.id, v.key, v.value
    FROM unnest(%(value_ids)s::bigint[], %(value_keys)s::text[], %(value_values)s::text[])
         WITH ORDINALITY AS v(id, key, value, n)
    JOIN owner o ON o.id = v.id
    ORDER BY v.id, v.key, v.n DESC
),
values_written AS (
    INSERT INTO {schema}.workflow_values AS w (job_id, key, value, updated_at)
    SELECT v.id, v.key, v.value::jsonb, {schema}.db_now() FROM value_input v
    ON CONFLICT (job_id, key) DO UPDATE SET value = excluded.value,
                                            updated_at = excluded.updated_at
    RETURNING w.job_id
),
values_notified AS (
    SELECT count(pg_notify({schema}.result_channel(job_id), job_id::text)) AS n
    FROM (SELECT DISTINCT job_id FROM values_written) AS changed
)
-- include: checkpoints_written
CROSS JOIN values_notified;

-- name: checkpoint_insert_many_plain
-- checkpoint_insert_many for a batch that carries no values (nearly every batch: a plain
-- workflow's steps): the same checkpoint writes without the values' CTEs, which a 3-step
-- workflow paid on each of its checkpoints (bench/RESULTS.md, "Messages and values").
-- include: checkpoint_writes
-- include: checkpoints_written
;

-- name: lease_renew_many
-- ONE statement per worker every lease/3: extend every lease this worker still holds and
-- heartbeat the worker row. Rows not returned are lost (recovered, cancelled or finished by
-- someone else): the runtime cancels their handlers. cancel_requested is returned so a missed
-- cancel notification still reaches the handler within one renewal interval.
-- Locking: the rows are locked with SKIP LOCKED, so one row held by another transaction (a
-- user's transaction touching a running job, say) cannot stall the renewal of every other
-- lease; such a row is returned with confirmed = false ("unconfirmed": still ours in this
-- snapshot, not extended), and the runtime neither renews nor drops it this time.
-- `registered` is false when the worker row is gone (pruned after a long pause): the runtime
-- registers again. The outer LEFT JOIN returns that one row even with no leases.
-- The heartbeat also writes the worker's admission snapshot (migration 0008): one entry per
-- queue whose effective limit is reduced, `since` as the database's time (the worker sends how
-- long ago); jsonb_object_agg of no rows is NULL, so a worker at full concurrency stores NULL.
WITH heartbeat AS (
    UPDATE {schema}.workers SET heartbeat_at = {schema}.db_now(), state = %(worker_state)s,
        admission = (
            SELECT jsonb_object_agg(a.queue, jsonb_build_object(
                'limit', a.lim, 'concurrency', a.concurrency, 'reason', a.reason,
                'cause', a.cause,
                'since', {schema}.db_now() - a.reduced_for * interval '1 second'))
            FROM unnest(%(admission_queues)s::text[], %(admission_limits)s::int[],
                        %(admission_concurrency)s::int[], %(admission_reasons)s::text[],
                        %(admission_causes)s::text[], %(admission_reduced_for)s::float8[])
                 AS a(queue, lim, concurrency, reason, cause, reduced_for))
    WHERE id = %(worker_id)s
    RETURNING id
),
-- The leases are the runs (migration 0047); the cancel flag is the job row's, read by primary
-- key without a lock (a cancel sets it while holding the row; one probe per lease, every
-- lease/3).
requested AS MATERIALIZED (
    SELECT u.job_id AS id, u.attempt, u.lease_token,
           (SELECT j.cancel_requested FROM {schema}.job_rows j WHERE j.id = u.job_id)
               AS cancel_requested
    FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(lease_tokens)s::uuid[])
         AS o(id, attempt, lease_token)
    JOIN {schema}.job_runs u ON u.job_id = o.id
    WHERE u.attempt = o.attempt AND u.lease_token = o.lease_token
      -- include: runs_by_key
),
-- The fence is part of the lock's condition, so it is re-checked on the run's newest version
-- once locked: a lease recovered and claimed by another worker meanwhile is not extended.
lockable AS MATERIALIZED (
    SELECT u.job_id AS id FROM {schema}.job_runs u
    JOIN requested r ON r.id = u.job_id
    WHERE r.attempt = u.attempt AND r.lease_token = u.lease_token
      -- include: runs_by_key
    FOR UPDATE OF u SKIP LOCKED
),
renewed AS (
    UPDATE {schema}.job_runs u
    SET lease_expires_at = {schema}.db_now() + %(lease_seconds)s * interval '1 second'
    FROM lockable l
    WHERE u.job_id = l.id
      -- include: runs_by_key
    RETURNING u.job_id AS id,
              (SELECT r.cancel_requested FROM requested r WHERE r.id = u.job_id)
                  AS cancel_requested
)
SELECT (SELECT count(*) FROM heartbeat) > 0 AS registered, r.id, r.cancel_requested, r.confirmed
FROM (SELECT 1) AS one
LEFT JOIN (
    SELECT id, cancel_requested, true AS confirmed FROM renewed
    UNION ALL
    SELECT id, cancel_requested, false FROM requested
    WHERE id NOT IN (SELECT id FROM lockable)
) AS r ON true;

-- name: leader_elect
-- A follower's periodic statement (every maintenance interval, the leader sends
-- maintenance_pass instead): try to take the leader seat (leader_elect(): free,
-- expired, or held by a leader without the scheduler while this worker runs it), with the
-- heartbeat and queue probe the leader's pass sends too (maintenance_heartbeat, below it).
WITH
-- include: maintenance_heartbeat(worker_id)
SELECT coalesce({schema}.leader_elect(%(worker_id)s, %(scheduler)s, %(ttl_seconds)s), false)
           AS leader,
       (SELECT count(*) FROM heartbeat) > 0 AS registered,
       {schema}.db_now() AS now,
       probe.queues, probe.work_due, probe.next_due
FROM probe;

-- name: leader_resign
-- The leader drains or stops: give the seat up and tell the other workers on the control
-- channel (payload `leader`), so one of them takes it at once instead of after the TTL.
WITH resigned AS (
    DELETE FROM {schema}.leader WHERE leader_id = %(worker_id)s RETURNING leader_id
)
SELECT count(pg_notify(%(control_channel)s, 'leader')) AS resigned FROM resigned;

-- name: maintenance_pass
-- One maintenance pass as ONE statement (idle workers must stay cheap), composed of its parts
-- below, one concern each: the election gates every sweep, the heartbeat and the schedules'
-- read are the leader's idle reads, then lease recovery, deadlines and retention, each sweep
-- bounded by a LIMIT (the runtime loops while a batch comes back full). The elected leader
-- sends it every maintenance interval, so an idle leader sends no other periodic statement.
-- With no leader_id (an operator's or a test's one-off pass) it sweeps without the election:
-- every sweep is SKIP LOCKED and re-checks its rows, so a pass racing the leader's is safe.
-- Each part is a list of CTEs without a trailing comma; the commas between them are here.
WITH
-- include: maintenance_election
,
-- include: maintenance_heartbeat(leader_id)
,
-- include: maintenance_schedules
,
-- include: maintenance_recovery
,
-- include: maintenance_deadlines
,
-- include: maintenance_retention
SELECT (SELECT ok FROM leader) AS leader,
       (SELECT coalesce(array_agg(array[id::text, state]), '{}') FROM recovered) AS recovered,
       (SELECT count(*) FROM stale_workers) AS pruned_workers,
       (SELECT n FROM notified) + (SELECT n FROM results_notified)
       + (SELECT count(*) FROM old_events) AS side_effects,
       (SELECT count(*) FROM heartbeat) > 0 AS registered,
       {schema}.db_now() AS now,
       probe.queues, probe.work_due, probe.next_due,
       EXISTS (SELECT 1 FROM first_schedule) AS any_schedule,
       (SELECT next_fire_at FROM first_schedule) AS next_fire_at,
       (SELECT n FROM deadlines) AS deadlines_passed,
       -- The ready ring's slots that have pages (migration 0039): while any has, the leader
       -- sweeps every 2 s (ready_sweep); an idle ring costs no statement of its own.
       CASE WHEN (SELECT ok FROM leader) THEN {schema}.ready_pending() ELSE 0 END
           AS ready_pending
FROM probe;

-- fragment: maintenance_election
-- Leadership, `leader`: extends the leader's seat (leader_elect()). Every sweep
-- of the pass is gated on it, so a leader whose seat was taken meanwhile (it stalled past the
-- TTL) sweeps nothing and learns it is a follower. No leader_id: a one-off pass, no election.
leader AS MATERIALIZED (
    SELECT CASE WHEN %(leader_id)s::uuid IS NULL THEN true
                ELSE coalesce({schema}.leader_elect(%(leader_id)s::uuid, %(scheduler)s,
                                                   %(ttl_seconds)s), false) END AS ok
)

-- fragment: maintenance_heartbeat(worker)
-- The worker's periodic liveness, shared by leader_elect (a follower's) and maintenance_pass
-- (the leader's): `heartbeat` stamps the worker row (no row: it was pruned after a long pause,
-- and the runtime registers again), `probe` probes the worker's queues (queue_probe(), three
-- LIMIT 1 index probes per queue) so the statement stands in for the claim loops' next idle
-- poll.
heartbeat AS (
    UPDATE {schema}.workers SET heartbeat_at = {schema}.db_now()
    WHERE id = %(@worker@)s::uuid
    RETURNING id
),
probe AS (
    SELECT coalesce(array_agg(queue ORDER BY queue), '{}') AS queues,
           coalesce(array_agg(work_due ORDER BY queue), '{}') AS work_due,
           coalesce(array_agg(next_due ORDER BY queue), '{}') AS next_due
    FROM {schema}.queue_probe(%(queues)s::text[])
)

-- fragment: maintenance_schedules
-- The scheduler's idle read, `first_schedule`: the schedule due first (one probe of
-- schedules_next_fire_idx), so the leader's scheduler needs no statement of its own to learn
-- when to wake.
first_schedule AS (
    SELECT name, next_fire_at FROM {schema}.schedules
    ORDER BY next_fire_at NULLS FIRST LIMIT 1
)

-- fragment: maintenance_recovery
-- Lease recovery: `expired` running jobs (at most recover_limit, oldest expiry first, SKIP
-- LOCKED) are `recovered`; their keys are released (`unlocked`), their lost attempts recorded
-- (`history`), their parents told (`parents_woken`), their queues and result channels
-- notified. The UPDATE re-checks the expiry (River #1302): a lease renewed or a job finished
-- between the scan and the UPDATE is left alone. Jobs with attempts left go back to ready
-- (keeping run_at, so they keep their place in their partition key) and wake their queue; the
-- others fail with "worker lost". A job whose cancel was requested is not run again: it ends
-- cancelled (its lost attempt is still recorded), whatever attempts it had left.
-- A row without max_attempts takes its task's declaration (task_defaults, migration 0015; 5
-- when no worker declared it), as the worker's own retry decision does.
-- The runs (migration 0047) read whole (no index of their expiry since migration 0051: a
-- table of the running jobs, read once a pass), each locked with its job's row (both SKIP
-- LOCKED: a settle holding the run, or a cancel holding the row, is left for the next pass).
-- The run is deleted with the expiry re-checked on its newest version, then the row written.
expired AS MATERIALIZED (
    SELECT u.job_id AS id, u.attempt, u.worker_id, u.started_at, u.executions, u.traced,
           coalesce(j.max_attempts, d.max_attempts, 5) AS max_attempts,
           -- A traced execution's span took its trace id from the lease token (_tracing.py).
           CASE WHEN u.traced THEN replace(u.lease_token::text, '-', '') END AS trace_id
    FROM {schema}.job_runs u
    JOIN {schema}.job_rows j ON j.id = u.job_id
    LEFT JOIN {schema}.task_defaults d ON d.task = j.task AND d.version = j.version
    WHERE (SELECT ok FROM leader)
      AND u.lease_expires_at < {schema}.db_now()
    ORDER BY u.lease_expires_at
    LIMIT %(recover_limit)s
    FOR UPDATE OF u, j SKIP LOCKED
),
lost AS MATERIALIZED (
    DELETE FROM {schema}.job_runs u USING expired e
    WHERE u.job_id = e.id AND u.attempt = e.attempt
      AND u.lease_expires_at < {schema}.db_now()
    RETURNING u.job_id
),
recovered AS (
    UPDATE {schema}.job_rows j
    -- A job that ends here is `done`, its outcome appended by `recovered_final` (migration
    -- 0049); one that goes back to ready is filed again.
    SET phase = CASE WHEN j.cancel_requested OR e.attempt >= e.max_attempts THEN 'done'
                     ELSE 'ready' END,
        filed = j.filed + CASE WHEN j.cancel_requested OR e.attempt >= e.max_attempts
                               THEN 0 ELSE 1 END,
        attempt = e.attempt, executions = e.executions, worker_id = e.worker_id,
        started_at = e.started_at, traced = e.traced,
        error = jsonb_build_object('type', 'LeaseExpired',
                                   'message', 'worker lost: lease expired')
    FROM expired e
    WHERE j.id = e.id AND j.id IN (SELECT job_id FROM lost)
      AND j.phase IN ('ready', 'claimed')
    RETURNING j.id, e.attempt,
              CASE WHEN j.phase = 'ready' THEN 'ready'
                   WHEN j.cancel_requested THEN 'cancelled' ELSE 'failed' END AS state,
              j.queue, j.partition_key, e.worker_id, e.started_at, j.parent_id, e.trace_id,
              j.result_watched, e.executions, j.error
),
recovered_final AS (
    INSERT INTO {schema}.job_outcomes (job_id, state, error, attempt, executions, worker_id,
                                       started_at, finished_at, queue)
    SELECT r.id, r.state, r.error, r.attempt, r.executions, r.worker_id, r.started_at,
           {schema}.db_now(), r.queue
    FROM recovered r WHERE r.state <> 'ready'
    RETURNING job_id, (SELECT r.parent_id FROM recovered r WHERE r.id = job_id) AS parent_id
),
-- A child failed (or cancelled) for good here wakes its parent here (parents_notify, migration
-- 0030); rows this pass recovers are left to it. Read by `notified`, so it always runs.
-- Read from `recovered_final`, so that the outcomes are written before parents_notify reads them.
parents_woken AS MATERIALIZED (
    SELECT CASE WHEN EXISTS (SELECT 1 FROM recovered_final WHERE parent_id IS NOT NULL)
                THEN {schema}.parents_notify(
                         ARRAY(SELECT job_id FROM recovered_final WHERE parent_id IS NOT NULL),
                         ARRAY(SELECT id FROM expired))
                ELSE 0 END AS n
),
unlocked AS (
    DELETE FROM {schema}.partition_locks l USING recovered r
    WHERE l.queue = r.queue AND l.partition_key = r.partition_key AND l.job_id = r.id
),
history AS (
    INSERT INTO {schema}.attempts (job_id, attempt, outcome, error_type, error_message,
                                   worker_id, started_at, finished_at, trace_id)
    SELECT id, attempt, 'lost', 'LeaseExpired', 'worker lost: lease expired', worker_id,
           started_at, {schema}.db_now(), trace_id
    FROM recovered
),
notified AS (
    SELECT count(pg_notify({schema}.ready_channel(q.queue), q.queue))
           + (SELECT n FROM parents_woken) AS n
    FROM (SELECT DISTINCT queue FROM recovered WHERE state = 'ready') AS q
),
results_notified AS (
    SELECT count(pg_notify(channel, ids)) AS n
    FROM (SELECT {schema}.result_channel(id) AS channel, string_agg(id::text, ',') AS ids
          FROM recovered WHERE state <> 'ready' AND result_watched GROUP BY 1) AS per_channel
)

-- fragment: maintenance_deadlines
-- Deadlines (migration 0021), `deadlines`: one bounded pass of job_deadline_pass over
-- jobs_deadline_idx, the leader's only; a function so that its tree cancel (job_cancel_tree)
-- runs as it does for `client.cancel`. Read by the final SELECT, so it always runs.
deadlines AS MATERIALIZED (
    SELECT CASE WHEN (SELECT ok FROM leader)
                THEN {schema}.job_deadline_pass(%(deadline_limit)s, %(control_channel)s)
                ELSE 0 END AS n
)

-- fragment: maintenance_retention
-- Retention, each bounded by prune_limit: `stale_workers` (no heartbeat for
-- worker_stale_seconds) are deleted, and so are `old_events`. Finished jobs are not deleted
-- here: their days are dropped whole by job_history_rotate(), which the leader calls after
-- this pass when it is due (PgDriver.maintenance_pass).
stale_workers AS (
    DELETE FROM {schema}.workers
    WHERE (SELECT ok FROM leader)
      AND heartbeat_at < {schema}.db_now() - %(worker_stale_seconds)s * interval '1 second'
      -- The leader's own row is heartbeaten by this statement: never prune it here.
      AND id IS DISTINCT FROM %(leader_id)s::uuid
    RETURNING id
),
-- Events are kept for the retention period after their emit (or their first wait, for keys
-- never emitted), then pruned unless a job still waits for them (events_age_idx). A waiter
-- registering meanwhile either holds the row (SKIP LOCKED leaves it) or, finding it deleted,
-- inserts it afresh (ON CONFLICT retries the insert).
old_events AS (
    DELETE FROM {schema}.events e
    WHERE e.key IN (
            SELECT o.key FROM {schema}.events o
            WHERE (SELECT ok FROM leader)
              AND coalesce(o.emitted_at, o.created_at)
                  < {schema}.db_now() - %(retention_seconds)s * interval '1 second'
            ORDER BY coalesce(o.emitted_at, o.created_at)
            LIMIT %(prune_limit)s
            FOR UPDATE SKIP LOCKED)
      AND NOT EXISTS (SELECT 1 FROM {schema}.job_rows j
                      WHERE j.wait_event_key = e.key AND j.phase = 'waiting')
    RETURNING e.key
)

-- name: job_cancel
-- Cancel a job and, recursively, every unfinished job it spawned (job_cancel_tree, migration
-- 0003): the tree is locked in id order; a job that is not running (scheduled, ready, sleeping,
-- waiting) is cancelled at once and releases its partition key; a running one is flagged and
-- its worker told on the control channel (its handler is cancelled and the outcome recorded as
-- cancelled by that worker); a parent with a running descendant waits, flagged, until its
-- children are final (a parent is never final before its children), then its worker records
-- it cancelled. A cancelled child tells its parent in the same statement (parents_notify,
-- migration 0030: the rule the settle and recovery statements call too).
SELECT previous_state, state
FROM {schema}.job_cancel_tree(ARRAY[%(id)s::bigint], %(control_channel)s);

-- name: job_get
-- The whole row as `JobRecord` reads it: job_records (migration 0036) holds the one column list.
SELECT * FROM {schema}.job_records WHERE id = %(id)s;

-- name: job_result_watch
-- A waiter (`wait_result`, `wait_final`, `get_value(wait=)`) registers before its first read of
-- the job's state, after it LISTENs: the statements that make a job final notify its result
-- channel only when result_watched is set. Race: this UPDATE and the fenced UPDATE that
-- finishes the job both lock the row. If the finish holds it, this waits for its commit, re-reads
-- the newest version, finds it final and writes nothing: the waiter's read that follows sees the
-- final state. If this holds it, the finish waits for this commit and re-reads the row with the
-- flag set: it notifies. A set flag is not written again (a second waiter costs no write).
-- A claim skips a row this holds (SKIP LOCKED): a ready or due row registered here wakes its
-- queue again, after this commit, so a claim that skipped it runs once more at once (a job
-- enqueued and waited for at once would otherwise wait for the next poll).
-- Two statements, each its own transaction (migration 0049: a completion no longer writes the
-- record, so the finish and this no longer meet on the record's lock): this one, on the
-- record, then job_result_watch_run, on the run. In one transaction the record's lock then
-- the run's would be the reverse of the settle's order (run, then record: a deadlock). After
-- this commits, every later claim copies the flag into its run; a claim holding the record
-- makes this wait until its run is committed, so the second statement finds it. A job with an
-- outcome is final: nothing to write, and the waiter's read that follows sees it.
WITH watched AS (
    UPDATE {schema}.job_rows j SET result_watched = true
    WHERE j.id = %(id)s AND NOT j.result_watched
      AND NOT EXISTS (SELECT 1 FROM {schema}.job_outcomes o WHERE o.job_id = j.id)
    RETURNING j.id, j.queue, j.phase, j.run_at
)
SELECT count(pg_notify({schema}.ready_channel(w.queue), w.queue))
FROM watched w
WHERE NOT EXISTS (SELECT 1 FROM {schema}.job_runs u WHERE u.job_id = w.id)
  AND (w.phase = 'ready' OR w.run_at <= {schema}.db_now());

-- name: job_result_watch_run
-- The second write of job_result_watch, after its commit: the job's run, if it has one, so
-- that its completion (which reads the run's flag, not the record's) notifies. A completion
-- that holds the run makes this wait and then finds it gone: the job is final, which the
-- waiter's read that follows sees. If this holds it, the completion waits for this commit and
-- returns the run with the flag set.
WITH watched AS (
    UPDATE {schema}.job_runs u SET result_watched = true
    WHERE u.job_id = %(id)s AND NOT u.result_watched
    RETURNING u.job_id
)
SELECT count(*) FROM watched;

-- name: job_states
-- Every job's state, for the transition checker of trioq.testing (a test-only whole-table read:
-- it diffs the table around each driver call, so it runs only on small test schemas).
SELECT j.id,
       -- include: job_state
       AS state
FROM {schema}.job_rows j LEFT JOIN {schema}.job_runs u ON u.job_id = j.id
LEFT JOIN {schema}.job_outcomes o ON o.job_id = j.id;

-- name: job_descendants
-- `trioq cancel --tree`'s report: the job's descendants with their states, read before and
-- after the cancel (outside its transaction: an operator's report, not a guarantee). Each
-- level is an index scan of jobs_parent_idx (parent_id, parent_position).
WITH RECURSIVE tree AS (
    SELECT j.id FROM {schema}.job_rows j WHERE j.parent_id = %(id)s::bigint
    UNION ALL
    SELECT c.id FROM {schema}.job_rows c JOIN tree t ON c.parent_id = t.id
)
SELECT j.id,
       -- include: job_state
       AS state
FROM tree t JOIN {schema}.job_rows j ON j.id = t.id
LEFT JOIN {schema}.job_runs u ON u.job_id = j.id
LEFT JOIN {schema}.job_outcomes o ON o.job_id = j.id
ORDER BY j.id;

-- name: job_explain
-- `trioq explain`: the job row and the facts each claim gate depends on, in one read. Rows are
-- read as to_jsonb(...) so that columns later migrations add (wait keys, versions) reach the
-- explanation without this statement changing. Index use: the primary key for the job; the
-- key holder through partition_locks' primary key (a job running, sleeping or waiting holds its
-- key's lock; the jobs table has no index of those rows by key, and a scan of it took 750 ms at
-- 1,000,000 jobs); the key's earlier ready job through ready_keyed (migration 0048); the
-- last attempt through attempts_job_idx; workers is a small table (each row carries its
-- admission snapshot, migration 0008); the queue's pause through queue_pauses' primary key.
-- Nothing is locked.
WITH job AS (SELECT * FROM {schema}.jobs WHERE id = %(id)s)
SELECT {schema}.db_now() AS now,
       to_jsonb(job.*) || jsonb_build_object('max_attempts', coalesce(job.max_attempts, (
           SELECT d.max_attempts FROM {schema}.task_defaults d
           WHERE d.task = job.task AND d.version = job.version), 5)) AS job,
       (SELECT to_jsonb(h.*) FROM (
            -- The holder's row with its run (migration 0047): running while it has one.
            SELECT j.id,
                   -- include: job_state
                   AS state, u.lease_expires_at, j.run_at,
                   coalesce(u.worker_id, j.worker_id) AS worker_id
            FROM {schema}.partition_locks AS l JOIN {schema}.job_rows AS j ON j.id = l.job_id
            LEFT JOIN {schema}.job_runs AS u ON u.job_id = j.id
            LEFT JOIN {schema}.job_outcomes AS o ON o.job_id = j.id
            WHERE l.queue = job.queue AND l.partition_key = job.partition_key
              AND j.id <> job.id
              AND (u.job_id IS NOT NULL OR j.phase IN ('sleeping', 'waiting'))
            LIMIT 1) AS h) AS key_holder,
       -- A keyed job a claim took reads `claimed` (migration 0047): `ready` is not running.
       (SELECT to_jsonb(a.*) FROM (
            SELECT k.id, k.priority, k.run_at
            FROM {schema}.ready_keyed AS k
            WHERE k.queue = job.queue AND k.kind = 'p' AND k.key = job.partition_key
              AND k.id <> job.id AND k.run_at <= {schema}.db_now()
              AND (k.priority, k.run_at, k.id) < (job.priority, job.run_at, job.id)
            ORDER BY k.priority, k.run_at, k.id LIMIT 1) AS a) AS key_ahead,
       (SELECT coalesce(jsonb_agg(to_jsonb(w.*) ORDER BY w.started_at), '[]'::jsonb)
        FROM {schema}.workers AS w WHERE job.queue = ANY (w.queues)) AS workers,
       (SELECT to_jsonb(t.*) FROM (
            SELECT attempt, outcome, error_type, error_message, finished_at
            FROM {schema}.attempts WHERE job_id = job.id
            ORDER BY attempt DESC, id DESC LIMIT 1) AS t) AS last_attempt,
       (SELECT to_jsonb(p.*) FROM {schema}.queue_pauses AS p WHERE p.queue = job.queue) AS pause,
       -- A concurrency key's running count (its holds, by primary key prefix) and the limit
       -- the claim applies (trioq/_core/concurrency.py `claim_limit`): a matching pattern's,
       -- else that of the key's head, its first ready job of the queue in claim order
       -- (ready_keyed; the claim's concurrency_room reads the same entry), else
       -- 1; with no ready job of the key, the job's own stands in for the head's.
       (SELECT jsonb_build_object(
                   'running', (SELECT count(*) FROM {schema}.concurrency_holds AS h
                               WHERE h.concurrency_key = job.concurrency_key),
                   'limit', {schema}.concurrency_limit_of(
                                job.concurrency_key,
                                CASE WHEN head.id IS NULL THEN job.concurrency_limit
                                     ELSE head.concurrency_limit END),
                   'head_id', head.id)
               -- The key's rate (migration 0028) and its starts in the window now.
               || coalesce((SELECT jsonb_build_object(
                                'rate_allowed', r.rate_allowed, 'rate_period', r.rate_period,
                                'recent_starts', w.n, 'rate_limited_until',
                                CASE WHEN w.n >= r.rate_allowed
                                     THEN w.starts[w.n - r.rate_allowed + 1]
                                          + r.rate_period * interval '1 second' END)
                            FROM {schema}.concurrency_rate_of(job.concurrency_key) AS r
                            CROSS JOIN LATERAL (
                                SELECT count(*) AS n,
                                       array_agg(s.started_at ORDER BY s.started_at) AS starts
                                FROM {schema}.concurrency_rate_starts s
                                WHERE s.concurrency_key = job.concurrency_key
                                  AND s.started_at > {schema}.db_now()
                                                     - r.rate_period * interval '1 second'
                            ) AS w), '{}'::jsonb)
        FROM (SELECT 1) AS one
        LEFT JOIN LATERAL (
            SELECT f.id, f.concurrency_limit FROM {schema}.ready_keyed AS f
            WHERE f.queue = job.queue AND f.kind = 'c' AND f.key = job.concurrency_key
            ORDER BY f.priority, f.run_at, f.id LIMIT 1) AS head ON true
        WHERE job.concurrency_key IS NOT NULL) AS concurrency,
       -- The workers of other queues: whether any live one registers the job's task (a job
       -- enqueued on the wrong queue) or none does (a misspelt task name), as `trioq status`
       -- names the task rather than the queue.
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'queues', w.queues, 'task_versions', w.task_versions,
                   'heartbeat_at', w.heartbeat_at, 'heartbeat_seconds', w.heartbeat_seconds)
                   ORDER BY w.started_at), '[]'::jsonb)
        FROM {schema}.workers AS w WHERE NOT job.queue = ANY (w.queues)) AS other_workers
FROM job;

-- name: job_list
-- Inspection (`trioq jobs`, trioq.testing.enqueued_jobs): newest first, keyset-paged by id
-- (`before_id`), every filter optional (NULL: any). A backward scan of the primary key with the
-- filters applied on the fly: an operator's read, not a hot path, so it needs no index of its
-- own; the LIMIT bounds it when the filters match often.
SELECT * FROM {schema}.job_records
WHERE (%(states)s::text[] IS NULL OR state = ANY(%(states)s::text[]))
  AND (%(tasks)s::text[] IS NULL OR task = ANY(%(tasks)s::text[]))
  AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
  AND (%(partition_key)s::text IS NULL OR partition_key = %(partition_key)s::text)
  AND (%(older_than)s::float8 IS NULL
       OR created_at < {schema}.db_now() - %(older_than)s::float8 * interval '1 second')
  AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: job_retry
-- Redrive: a failed or cancelled job goes back to ready at once, keeping its attempts history
-- (and any workflow checkpoints); it gets at least one more attempt (max_attempts is raised to
-- attempt + 1 if used up, as Oban's retry does; a row without one keeps none while its task's
-- declaration leaves an attempt). Any other state is left alone and returned.
-- A job whose dedup key was handed to a newer job runs without a key (it has none left): its
-- dedup_key is cleared unless job_keys still names it. Lock order as the enqueue's and the
-- deleters' (the job row, then its key row). The key row is read FOR SHARE: an enqueue that
-- took the key while this statement waited for the job row has committed a new version,
-- which FOR SHARE re-checks (`k.job_id = t.id` no longer matches), where this statement's
-- snapshot would still show the old one; and while we hold it no enqueue can take the key.
-- An enqueue that waited for us finds the job unfinished (its FOR SHARE of the job re-checks
-- too) and returns it.
-- The state is read with the row's run (migration 0047): a running job is left alone.
-- Its outcome is deleted (migration 0049: unfinished again), after the record is locked and
-- before the key row (the enqueue's `released` share-locks the outcome, then the key row).
-- The record takes the outcome's attempt and executions (a job finished by a completion never
-- wrote them back).
WITH target AS (
    SELECT j.id,
           -- include: job_state
           AS state, j.dedup_key, o.attempt AS final_attempt, o.executions AS final_executions
    FROM {schema}.job_rows j LEFT JOIN {schema}.job_runs u ON u.job_id = j.id
    LEFT JOIN {schema}.job_outcomes o ON o.job_id = j.id
    WHERE j.id = %(id)s FOR UPDATE OF j
),
reopened AS MATERIALIZED (
    DELETE FROM {schema}.job_outcomes o USING target t
    WHERE o.job_id = t.id AND t.state IN ('failed', 'cancelled')
    RETURNING o.job_id
),
key_held AS (
    SELECT k.job_id FROM {schema}.job_keys k JOIN target t ON k.key = t.dedup_key
    WHERE k.job_id = t.id AND t.state IN ('failed', 'cancelled')
      AND (SELECT count(*) FROM reopened) >= 0  -- the outcome's delete first
    FOR SHARE OF k
),
changed AS (
    UPDATE {schema}.job_rows j
    SET phase = 'ready', filed = j.filed + 1, run_at = {schema}.db_now(),
        cancel_requested = false,
        max_attempts = CASE WHEN coalesce(j.max_attempts, (
                                SELECT d.max_attempts FROM {schema}.task_defaults d
                                WHERE d.task = j.task AND d.version = j.version), 5)
                                 > t.final_attempt
                            THEN j.max_attempts ELSE t.final_attempt + 1 END,
        attempt = t.final_attempt, executions = t.final_executions,
        error = NULL, worker_id = NULL, started_at = NULL,
        dedup_key = CASE WHEN EXISTS (SELECT 1 FROM key_held) THEN j.dedup_key END
    FROM target t
    WHERE j.id = t.id AND t.state IN ('failed', 'cancelled')
    RETURNING j.id, j.queue, j.phase AS state
),
notified AS (
    SELECT count(pg_notify({schema}.ready_channel(queue), queue)) AS n FROM changed
)
SELECT t.state AS previous_state, coalesce(c.state, t.state) AS state
FROM target t LEFT JOIN changed c ON c.id = t.id CROSS JOIN notified;

-- name: job_epochs_rotate
-- Retention by epoch (functions/satellite_epochs_rotate.sql, migration 0049): the next epoch's
-- partitions made ahead, a new epoch started on a new UTC day, and every ended epoch's jobs
-- whose finish day ended more than `retention_seconds` ago removed (whole partitions, their
-- survivors copied aside; row by row when too many survive). Sent by the leader after its
-- maintenance pass when the last call's `next_due` has come, and by `trioq purge` before it
-- deletes what is left row by row; NULL: epochs and partitions only, which both send first, as
-- a statement of its own (attaching a partition locks its parent until the commit, SHARE UPDATE
-- EXCLUSIVE, and analyzing one locks it: the prune must not run under those locks).
SELECT pruned, next_due
FROM {schema}.satellite_epochs_rotate(%(retention_seconds)s::float8 * interval '1 second');

-- name: ready_sweep
-- The ready ring's drained slots truncated (functions/ready_sweep.sql). Sent by the leader
-- every 2 s from a maintenance pass that found a slot with pages until no slot has any.
SELECT truncated, pending FROM {schema}.ready_sweep();

-- name: job_purge
-- `trioq purge`: delete finished jobs (final states only, whatever is asked) that finished more
-- than older_than ago, oldest first through each day partition's finished_at index (merged),
-- at most `limit` per statement (the client loops while a batch comes back full). A purge of
-- every final state that names no task or queue first drops the whole days older than the
-- cutoff (job_history_rotate, PgDriver.job_purge): this deletes only what is left. SKIP
-- LOCKED: rows another session holds (a concurrent purge) are left for the next batch.
-- Attempts, checkpoints, messages and values go with their job (the jobs_deleted trigger).
-- The finished jobs are their outcomes (migration 0049), read by job_outcomes_finished_idx;
-- each outcome and its record are locked with SKIP LOCKED (a redrive holding the record is
-- left alone: no wait, so no deadlock with its record-then-outcome order) and deleted
-- together (an outcome gone first would bring its job back as `ready`).
WITH doomed AS MATERIALIZED (
    SELECT o.job_id AS id
    FROM {schema}.job_outcomes o JOIN {schema}.job_rows j ON j.id = o.job_id
    WHERE o.state = ANY(%(states)s::text[])
      AND o.finished_at < {schema}.db_now() - %(older_than)s::float8 * interval '1 second'
      AND (%(tasks)s::text[] IS NULL OR j.task = ANY(%(tasks)s::text[]))
      AND (%(queues)s::text[] IS NULL OR o.queue = ANY(%(queues)s::text[]))
    ORDER BY o.finished_at
    LIMIT %(limit)s
    FOR UPDATE OF o, j SKIP LOCKED
),
outcomes_gone AS (
    DELETE FROM {schema}.job_outcomes o USING doomed d WHERE o.job_id = d.id
)
DELETE FROM {schema}.job_rows j USING doomed WHERE j.id = doomed.id RETURNING j.id;

-- name: checkpoint_list
-- A job's history in order (`trioq job ID`); the primary key (job_id, position) serves it.
SELECT position, kind, name, value FROM {schema}.checkpoints
WHERE job_id = %(id)s ORDER BY position;

-- name: job_attempts
SELECT attempt, outcome, error_type, error_message, traceback, worker_id, started_at, finished_at,
       trace_id
FROM {schema}.attempts WHERE job_id = %(id)s ORDER BY id;

-- name: worker_register
-- Registration also writes the max_attempts and the deadline each served (task, version)
-- declares (task_defaults, migrations 0015 and 0029; a deadline removed from the declaration
-- is removed here too), in the caller's sorted order so that workers starting together lock
-- the rows in one order; a row already equal is left alone.
WITH declared AS (
    INSERT INTO {schema}.task_defaults AS d (task, version, max_attempts, deadline_seconds,
                                             declared_at)
    SELECT t.task, t.version, t.max_attempts, t.deadline_seconds, {schema}.db_now()
    FROM unnest(%(default_tasks)s::text[], %(default_versions)s::int[],
                %(default_max_attempts)s::int[], %(default_deadlines)s::float8[])
         AS t(task, version, max_attempts, deadline_seconds)
    ON CONFLICT (task, version) DO UPDATE
    SET max_attempts = excluded.max_attempts, deadline_seconds = excluded.deadline_seconds,
        declared_at = excluded.declared_at
    WHERE (d.max_attempts, d.deadline_seconds)
          IS DISTINCT FROM (excluded.max_attempts, excluded.deadline_seconds)
    RETURNING d.task
)
INSERT INTO {schema}.workers (id, hostname, pid, queues, concurrency, started_at, heartbeat_at,
                             task_versions, queue_concurrency, heartbeat_seconds)
VALUES (%(worker_id)s, %(hostname)s, %(pid)s, %(queues)s, %(concurrency)s,
        {schema}.db_now(), {schema}.db_now(), %(task_versions)s, %(queue_concurrency)s,
        %(heartbeat_seconds)s)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at
RETURNING id;

-- name: worker_unregister
DELETE FROM {schema}.workers WHERE id = %(worker_id)s RETURNING id;

-- name: queue_status
-- One row per queue: backlog, oldest due age, running, expired leases, scheduled. One pass over
-- every row with its run (migration 0047), as over the table before.
SELECT queue,
       count(*) FILTER (WHERE state = 'ready') AS ready,
       count(*) FILTER (WHERE state = 'scheduled') AS scheduled,
       count(*) FILTER (WHERE state = 'running') AS running,
       count(*) FILTER (WHERE state = 'running'
                          AND lease_expires_at < {schema}.db_now()) AS expired_leases,
       count(*) FILTER (WHERE state = 'completed') AS completed,
       count(*) FILTER (WHERE state = 'failed') AS failed,
       count(*) FILTER (WHERE state = 'cancelled') AS cancelled,
       extract(epoch FROM {schema}.db_now() - min(run_at) FILTER (
           WHERE state = 'ready'))::float8 AS oldest_ready_seconds,
       count(*) FILTER (WHERE state = 'sleeping') AS sleeping,
       count(*) FILTER (WHERE state = 'waiting') AS waiting
FROM (SELECT j.queue, j.run_at, u.lease_expires_at,
             -- include: job_state
             AS state
      FROM {schema}.job_rows j LEFT JOIN {schema}.job_runs u ON u.job_id = j.id
      LEFT JOIN {schema}.job_outcomes o ON o.job_id = j.id) AS j
GROUP BY queue ORDER BY queue;

-- name: queue_demand
-- Per queue demand (the migration's `queue_demand()` function; see its comment for the plan).
SELECT queue, ready, oldest_ready_seconds, running, scheduled, sleeping, waiting, due_now
FROM {schema}.queue_demand() ORDER BY queue;

-- name: job_trace_context
-- The enqueuer's trace context of one job, read when a handler starts (only with the otel extra
-- configured, so the claim statement stays as it is for everyone else). Primary key lookup.
SELECT trace_context FROM {schema}.job_rows WHERE id = %(id)s;

-- name: notify_send
-- One notification, sent outside any transaction (the worker's listener self-probe).
SELECT pg_notify(%(channel)s, %(payload)s);

-- name: status_health
-- `trioq status`: the incident health list (counts) and the database pressure figures, one row.
-- Each count is a separate scalar subquery (the planner uses the state's partial index where
-- one exists; otherwise one pass over the unfinished rows). A worker is live until it has been
-- silent for two of the heartbeat intervals it registered (migration 0019), or 120 s for a
-- worker that registered none (an idle worker beats with its election or maintenance pass,
-- at most 1.4 maintenance intervals of <= 60 s apart). pg_stat_* views are the server's
-- cumulative statistics (deadlocks since the last stats reset). Nothing is locked.
-- Running is a run (migration 0047): the leases are job_runs' (by its lease index). The ready
-- backlog is read from the narrow tables (migration 0049: a record completed on the fast path
-- still reads ready): the ring's entries still valid (their record ready and filed as the
-- entry says: the claim deletes what it takes) and ready_keyed's, each due.
SELECT
    ((SELECT count(DISTINCT r.id) FROM {schema}.ready_ring r
      JOIN {schema}.job_rows j ON j.id = r.id AND j.phase = 'ready' AND j.filed = r.filed
      WHERE r.run_at <= {schema}.db_now()
        AND r.slot >=
            -- include: ring_low
     )
     + (SELECT count(*) FROM {schema}.ready_keyed e WHERE e.run_at <= {schema}.db_now()))
        AS ready_backlog,
    (SELECT count(*) FROM {schema}.job_runs
     WHERE lease_expires_at < {schema}.db_now()) AS expired_ownership,
    -- The due states' counts read job_due (migration 0044), their rows only.
    (SELECT count(*) FROM {schema}.job_due
     WHERE state = 'sleeping' AND run_at <= {schema}.db_now()) AS sleeping_due,
    (SELECT count(*) FROM {schema}.job_runs AS u
     WHERE NOT EXISTS (
         SELECT 1 FROM {schema}.workers AS w
         WHERE w.id = u.worker_id AND w.heartbeat_at > {schema}.db_now()
               - coalesce(2 * w.heartbeat_seconds, 120) * interval '1 second')) AS stale_running,
    (SELECT count(*) FROM {schema}.job_due WHERE state = 'waiting') AS active_waits,
    (SELECT count(*) FROM {schema}.job_due
     WHERE state = 'waiting' AND run_at <= {schema}.db_now()) AS due_wait_timeouts,
    (SELECT count(*) FROM pg_locks WHERE NOT granted) AS waiting_locks,
    (SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()) AS deadlocks,
    (SELECT coalesce(jsonb_object_agg(s.state, s.n), '{}'::jsonb) FROM (
         SELECT coalesce(state, 'background') AS state, count(*) AS n FROM pg_stat_activity
         WHERE datname = current_database() GROUP BY 1) AS s) AS backends,
    (SELECT count(*) FROM pg_stat_activity
     WHERE datname = current_database() AND wait_event_type = 'Lock') AS lock_waits,
    (SELECT blks_hit::float8 / nullif(blks_hit + blks_read, 0) FROM pg_stat_database
     WHERE datname = current_database()) AS cache_hit_ratio,
    -- Every epoch partition of the records (migration 0049).
    (SELECT sum(pg_table_size(p.relid))::bigint
     FROM pg_partition_tree('{schema}.job_rows') AS p) AS jobs_table_bytes,
    (SELECT sum(pg_indexes_size(p.relid))::bigint
     FROM pg_partition_tree('{schema}.job_rows') AS p) AS jobs_index_bytes,
    (SELECT sum(s.n_dead_tup)::bigint FROM pg_stat_user_tables AS s
     WHERE s.relid IN (SELECT p.relid FROM pg_partition_tree('{schema}.job_rows') AS p))
        AS dead_tuples,
    (SELECT sum(s.n_live_tup)::bigint FROM pg_stat_user_tables AS s
     WHERE s.relid IN (SELECT p.relid FROM pg_partition_tree('{schema}.job_rows') AS p))
        AS live_tuples,
    -- The table a job churns since migration 0049 (a run inserted and deleted per job; the
    -- records are written once): its last autovacuum.
    t.last_autovacuum
FROM (SELECT 1) AS one
LEFT JOIN pg_stat_user_tables AS t ON t.relid = '{schema}.job_runs'::regclass;

-- name: worker_list
SELECT w.id, w.hostname, w.pid, w.queues, w.concurrency, w.state, w.started_at, w.heartbeat_at,
       (SELECT count(*) FROM {schema}.job_runs u WHERE u.worker_id = w.id) AS running,
       w.task_versions,
       -- The admission snapshot (migration 0008) as [queue, limit, concurrency, reason, cause,
       -- seconds reduced] entries; jsonb_each of a NULL snapshot yields no rows.
       (SELECT coalesce(jsonb_agg(jsonb_build_array(
                    a.key, a.value -> 'limit', a.value -> 'concurrency', a.value ->> 'reason',
                    a.value ->> 'cause',
                    extract(epoch FROM {schema}.db_now() - (a.value ->> 'since')::timestamptz))
                ORDER BY a.key), '[]'::jsonb)
        FROM jsonb_each(w.admission) AS a) AS admission,
       w.queue_concurrency,
       w.heartbeat_seconds,
       extract(epoch FROM {schema}.db_now() - w.heartbeat_at)::float8 AS heartbeat_age
FROM {schema}.workers w ORDER BY w.started_at;

-- name: queue_pause
-- `trioq queue pause NAME`: one row per paused queue; claims of the queue check for it.
-- Returns a row only when the queue was not paused already.
INSERT INTO {schema}.queue_pauses (queue, paused_at) VALUES (%(queue)s, {schema}.db_now())
ON CONFLICT (queue) DO NOTHING
RETURNING queue;

-- name: queue_resume
-- Resuming wakes the queue's workers at once (they would otherwise wait for their poll).
WITH resumed AS (
    DELETE FROM {schema}.queue_pauses WHERE queue = %(queue)s RETURNING queue
)
SELECT queue, pg_notify({schema}.ready_channel(queue), queue) FROM resumed;

-- name: queue_pause_list
SELECT queue, paused_at FROM {schema}.queue_pauses ORDER BY queue;

-- name: concurrency_limit_set
-- `trioq key limit PATTERN N`: workers read the table in every claim that visits a matching
-- key, so the limit holds from their next claim round (within one poll interval).
INSERT INTO {schema}.concurrency_limits AS l (pattern, max_running, updated_at)
VALUES (%(pattern)s, %(max_running)s, {schema}.db_now())
ON CONFLICT (pattern) DO UPDATE SET max_running = excluded.max_running,
                                    updated_at = excluded.updated_at
RETURNING l.pattern;

-- name: concurrency_limit_delete
-- `trioq key limit PATTERN none`: the keys it matched fall back to a shorter pattern, their
-- jobs' own concurrency_limit, or 1.
DELETE FROM {schema}.concurrency_limits WHERE pattern = %(pattern)s RETURNING pattern;

-- name: concurrency_limit_list
SELECT pattern, max_running, updated_at FROM {schema}.concurrency_limits ORDER BY pattern;

-- name: key_rated
-- Whether any key has a rate (a row of concurrency_rates): PgDriver asks once a second and
-- runs job_claim_rated for its keyed claims only while one is set.
SELECT EXISTS (SELECT 1 FROM {schema}.concurrency_rates);

-- name: concurrency_rate_set
-- `trioq key rate PATTERN N/PERIOD`: read by every claim that visits a matching key, from the
-- workers' next rated round (within a second: key_rated). Ready keyed rows are woken at once
-- by the caller's next round; a lowered rate counts the starts already in the window.
INSERT INTO {schema}.concurrency_rates AS r (pattern, rate_allowed, rate_period, updated_at)
VALUES (%(pattern)s, %(rate_allowed)s, %(rate_period)s, {schema}.db_now())
ON CONFLICT (pattern) DO UPDATE SET rate_allowed = excluded.rate_allowed,
                                    rate_period = excluded.rate_period,
                                    updated_at = excluded.updated_at
RETURNING r.pattern;

-- name: concurrency_rate_delete
-- `trioq key rate PATTERN none`: the keys it matched fall back to a shorter pattern's rate, or
-- none. Their start slots stay (a rate set again counts the starts still in its window).
DELETE FROM {schema}.concurrency_rates WHERE pattern = %(pattern)s RETURNING pattern;

-- name: concurrency_rate_list
SELECT pattern, rate_allowed, rate_period, updated_at
FROM {schema}.concurrency_rates ORDER BY pattern;

-- name: concurrency_rate_status
-- Rated keys with starts in their window now (`trioq key list`, status): how many, and when
-- the next start is allowed when the window is full. Reads the start slots of keys whose
-- slots were written within the longest period (a whole-table read of a table of N rows per
-- rated key: an operator's command, not a claim's).
SELECT s.concurrency_key, r.rate_allowed, r.rate_period, count(*)::int AS recent,
       CASE WHEN count(*) >= r.rate_allowed
            THEN (array_agg(s.started_at ORDER BY s.started_at))[count(*) - r.rate_allowed + 1]
                 + r.rate_period * interval '1 second' END AS until
FROM {schema}.concurrency_rate_starts s
CROSS JOIN LATERAL {schema}.concurrency_rate_of(s.concurrency_key) AS r
WHERE s.started_at > {schema}.db_now() - r.rate_period * interval '1 second'
GROUP BY s.concurrency_key, r.rate_allowed, r.rate_period
ORDER BY s.concurrency_key;

-- name: concurrency_key_status
-- Keys with running jobs (concurrency_holds: one row per running job that holds a key, so
-- the table is as small as the cluster's running keyed jobs), with the limit that applies:
-- the matching pattern, else the largest concurrency_limit among the key's holders (the
-- claim reads its next job's, which those usually share). `keys` NULL: every key.
SELECT h.concurrency_key AS key, count(*)::int AS running,
       {schema}.concurrency_limit_of(h.concurrency_key, max(j.concurrency_limit)) AS limit
FROM {schema}.concurrency_holds h
LEFT JOIN {schema}.job_rows j ON j.id = h.job_id
WHERE %(keys)s::text[] IS NULL OR h.concurrency_key = ANY(%(keys)s::text[])
GROUP BY h.concurrency_key
ORDER BY h.concurrency_key;

-- name: ready_channels
SELECT {schema}.ready_channel(q) AS channel FROM unnest(%(queues)s::text[]) AS q;

-- name: schema_drop
-- Test fixtures drop their throwaway schema; a lock held by a leaked session fails the drop
-- after 10 s instead of hanging the test run. SET LOCAL: behind a transaction pooler a
-- session SET would stay on the server connection for its next client.
BEGIN;
SET LOCAL lock_timeout = '10s';
DROP SCHEMA IF EXISTS {schema} CASCADE;
COMMIT;

-- name: task_status
-- Jobs by (queue, task, version, state), with how many needed more than one attempt: the
-- demo's per-workflow progress. A sequential scan, like queue_status: for status screens only.
SELECT queue, task, version, state, count(*) AS jobs,
       count(*) FILTER (WHERE attempt > 1) AS retried
FROM (SELECT j.queue, j.task, j.version, coalesce(u.attempt, j.attempt) AS attempt,
             -- include: job_state
             AS state
      FROM {schema}.job_rows j LEFT JOIN {schema}.job_runs u ON u.job_id = j.id
      LEFT JOIN {schema}.job_outcomes o ON o.job_id = j.id) AS j
GROUP BY queue, task, version, state ORDER BY queue, task, version, state;

-- name: task_history_kinds
-- How many jobs of each task recorded each checkpoint kind (slept, waited, spawned children):
-- the demo's summary. Scans the checkpoints table; for status screens only.
SELECT j.task, c.kind, count(DISTINCT c.job_id) AS jobs
FROM {schema}.checkpoints c JOIN {schema}.job_rows j ON j.id = c.job_id
GROUP BY j.task, c.kind ORDER BY j.task, c.kind;

-- name: job_unroutable
-- `trioq status`: jobs waiting to run that no live worker can run, by (queue, task, version):
-- a deploy that dropped a version while its jobs sleep or wait shows here until a worker
-- serving it returns. Live = heartbeat within two of the worker's registered heartbeat
-- intervals, else %(stale_seconds)s (workers before migration 0019). Scans the unfinished jobs
-- (not running, not final); a status read, not a hot path.
-- The records without a run (migration 0047: a running one reads ready or claimed) and without
-- an outcome (migration 0049: a finished one reads done, or ready or claimed as its last run
-- left it).
-- Read from the narrow tables (migration 0049: the records hold the history too): job_due's
-- scheduled, sleeping and waiting jobs, the ring's still valid entries and ready_keyed's,
-- each job's record by primary key.
SELECT j.queue, j.task, j.version, count(*) AS jobs, array_agg(DISTINCT j.phase) AS states
FROM (SELECT d.job_id AS id FROM {schema}.job_due d
      UNION
      SELECT r.id FROM {schema}.ready_ring r
      WHERE r.slot >=
            -- include: ring_low
      UNION
      SELECT e.id FROM {schema}.ready_keyed e) AS w
JOIN {schema}.job_rows j ON j.id = w.id
WHERE j.phase IN ('scheduled', 'ready', 'sleeping', 'waiting')
  AND NOT EXISTS (SELECT 1 FROM {schema}.job_runs u WHERE u.job_id = j.id)
  AND NOT EXISTS (SELECT 1 FROM {schema}.job_outcomes o WHERE o.job_id = j.id)
  AND NOT EXISTS (
      SELECT 1 FROM {schema}.workers w
      WHERE w.heartbeat_at > {schema}.db_now()
            - coalesce(2 * w.heartbeat_seconds, %(stale_seconds)s) * interval '1 second'
        AND w.state <> 'stopped'
        AND j.queue = ANY(w.queues)
        AND j.task || '@' || j.version = ANY(w.task_versions))
GROUP BY j.queue, j.task, j.version
ORDER BY j.queue, j.task, j.version;

-- name: task_served
-- A producer's first enqueue of a task name that no declaration it was given knows: does a
-- live worker serve that task (any version)? A misspelt name would otherwise sit ready forever
-- in silence. Live as job_unroutable counts it. Read once
-- per name per producer; the workers table has one row per worker process.
SELECT EXISTS (
    SELECT 1 FROM {schema}.workers w, unnest(w.task_versions) AS served(pair)
    WHERE w.heartbeat_at > {schema}.db_now()
          - coalesce(2 * w.heartbeat_seconds, %(stale_seconds)s) * interval '1 second'
      AND w.state <> 'stopped'
      AND split_part(served.pair, '@', 1) = %(task)s) AS served;

-- name: schedule_upsert_many
-- Schedules declared in code (each starting worker upserts its app's `@app.periodic`) or at
-- runtime (`client.schedule`), by name. A changed cron or time zone re-times the schedule
-- (next_fire_at NULL, anchored at now): the scheduler computes the next fire time from the
-- new expression. An unchanged one keeps its next fire time, so restarting or adding workers
-- never skips or repeats an occurrence. The scheduler channel wakes the schedulers at commit.
WITH input AS (
    SELECT * FROM unnest(%(names)s::text[], %(tasks)s::text[], %(queues)s::text[],
                         %(payloads)s::text[], %(crons)s::text[], %(timezones)s::text[],
                         %(misfires)s::text[], %(catchup_limits)s::int[],
                         %(max_attempts)s::int[], %(versions)s::int[], %(origins)s::text[])
             AS t(name, task, queue, payload, cron, timezone, misfire, catchup_limit,
                  max_attempts, version, origin)
),
upserted AS (
    INSERT INTO {schema}.schedules AS s (name, task, queue, payload, cron, timezone, misfire,
                                        catchup_limit, max_attempts, version, origin,
                                        anchor_at, created_at, updated_at)
    SELECT name, task, queue, payload::jsonb, cron, timezone, misfire, catchup_limit,
           max_attempts, version, origin, {schema}.db_now(), {schema}.db_now(),
           {schema}.db_now()
    FROM input
    ON CONFLICT (name) DO UPDATE
    SET task = excluded.task, queue = excluded.queue, payload = excluded.payload,
        cron = excluded.cron, timezone = excluded.timezone, misfire = excluded.misfire,
        catchup_limit = excluded.catchup_limit, max_attempts = excluded.max_attempts,
        version = excluded.version, origin = excluded.origin, updated_at = excluded.updated_at,
        next_fire_at = CASE WHEN s.cron = excluded.cron AND s.timezone = excluded.timezone
                            THEN s.next_fire_at END,
        anchor_at = CASE WHEN s.cron = excluded.cron AND s.timezone = excluded.timezone
                         THEN s.anchor_at ELSE excluded.anchor_at END
    RETURNING s.name, (s.xmax = 0) AS created
),
notified AS (
    SELECT count(pg_notify(%(channel)s, 'schedules')) AS n
    FROM (SELECT 1 FROM upserted LIMIT 1) AS changed
)
SELECT upserted.name, upserted.created FROM upserted CROSS JOIN notified;

-- name: schedule_delete
WITH deleted AS (
    DELETE FROM {schema}.schedules WHERE name = %(name)s RETURNING name
),
notified AS (
    SELECT count(pg_notify(%(channel)s, 'schedules')) AS n FROM deleted
)
SELECT deleted.name FROM deleted CROSS JOIN notified;

-- name: schedule_list
SELECT name, task, queue, payload, cron, timezone, misfire, catchup_limit, max_attempts,
       version, origin, anchor_at, next_fire_at, last_fire_at, fired, missed, created_at,
       updated_at
FROM {schema}.schedules ORDER BY name;

-- name: schedule_next_due
-- The scheduler's idle read, one index probe and no lock: database time and the schedule
-- due first (a NULL next_fire_at, a new or re-timed schedule, sorts first: due now).
SELECT {schema}.db_now() AS now, first.name IS NOT NULL AS any_schedule, first.next_fire_at
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
    SELECT name, next_fire_at FROM {schema}.schedules
    ORDER BY next_fire_at NULLS FIRST LIMIT 1
) AS first ON true;

-- name: scheduler_lead
-- Scheduler leadership, the maintenance pattern on a key of its own: a transaction-scoped
-- advisory lock, tried (never waited for) at the start of the scheduler's transaction and
-- released at its COMMIT; no connection is pinned and leadership moves as soon as the holder's
-- transaction (or process) ends. `now` is read once and used for the whole tick.
SELECT pg_try_advisory_xact_lock(hashtext('trioq-scheduler:' || %(schema_name)s)) AS leader,
       {schema}.db_now() AS now;

-- name: schedule_due_lock
-- Inside the leader's transaction: the due schedules, locked so a concurrent
-- `client.schedule` of the same name waits for this tick to commit.
SELECT name, task, queue, payload, cron, timezone, misfire, catchup_limit, max_attempts,
       version, origin, anchor_at, next_fire_at, last_fire_at, fired, missed, created_at,
       updated_at
FROM {schema}.schedules
WHERE next_fire_at IS NULL OR next_fire_at <= %(now)s
ORDER BY next_fire_at NULLS FIRST
LIMIT %(limit)s
FOR UPDATE;

-- name: schedule_fire_many
-- Enqueue the planned occurrences and advance their schedules, in one statement. The advance
-- is fenced on the next_fire_at the plan was made from: a schedule advanced (or re-timed) by
-- anyone since is left alone, and so are its occurrences (`fires` joins the advanced rows
-- only). Each occurrence's dedup key names the schedule and fire time, a second guard against
-- enqueueing it twice; it is held in every final state too (until retention prunes the job).
-- The keys are taken as job_insert_many takes them (its comment says why each step: the
-- released holders share-locked before any key row, an upsert that always returns the
-- holder, a holder this snapshot cannot see counted as holding), and an occurrence whose key
-- is held is dropped. run_at is the fire time, so a job's lateness is created_at - run_at.
WITH advance AS (
    SELECT * FROM unnest(%(names)s::text[], %(expected)s::timestamptz[],
                         %(next_fire_ats)s::timestamptz[], %(last_fire_ats)s::timestamptz[],
                         %(fired)s::int[], %(missed)s::int[])
             AS t(name, expected, next_fire_at, last_fire_at, fired, missed)
),
advanced AS (
    UPDATE {schema}.schedules s
    SET next_fire_at = a.next_fire_at,
        last_fire_at = coalesce(a.last_fire_at, s.last_fire_at),
        fired = s.fired + a.fired, missed = s.missed + a.missed
    FROM advance a
    WHERE s.name = a.name AND s.next_fire_at IS NOT DISTINCT FROM a.expected
    RETURNING s.name, s.task, s.queue, s.payload, s.max_attempts, s.version
),
fires AS MATERIALIZED (
    SELECT DISTINCT ON (f.dedup_key) nextval('{schema}.jobs_id_seq') AS new_id,
           f.name, f.fire_at, f.dedup_key, a.queue, a.task, a.payload, a.max_attempts,
           a.version
    FROM unnest(%(fire_names)s::text[], %(fire_ats)s::timestamptz[], %(fire_keys)s::text[])
         AS f(name, fire_at, dedup_key)
    JOIN advanced a ON a.name = f.name
    ORDER BY f.dedup_key
),
released AS (
    SELECT h.id
    FROM fires f
    JOIN {schema}.job_keys k ON k.key = f.dedup_key
    -- The holder's outcome (migration 0049: a finished job is one with an outcome), locked:
    -- a redrive deletes it, so FOR SHARE waits for it and then finds the holder unfinished.
    JOIN {schema}.job_outcomes o ON o.job_id = k.job_id
    JOIN {schema}.job_rows h ON h.id = k.job_id
    WHERE {schema}.job_key_released(o.state, h.unique_states, h.unique_until)
    FOR SHARE OF o
),
keys AS (
    INSERT INTO {schema}.job_keys AS k (key, job_id, task)
    SELECT dedup_key, new_id, task FROM fires WHERE (SELECT count(*) FROM released) >= 0
    ORDER BY dedup_key
    ON CONFLICT (key) DO UPDATE
    SET job_id = CASE WHEN k.job_id IN (SELECT id FROM released) THEN excluded.job_id
                      ELSE k.job_id END,
        task = CASE WHEN k.job_id IN (SELECT id FROM released) THEN excluded.task
                    ELSE k.task END
    RETURNING k.job_id
),
new_jobs AS (
    -- The occurrences whose key names their own new job; the task's registered deadline
    -- (migration 0029), from the enqueue.
    SELECT f.new_id AS id, f.queue, f.task, f.payload, 0::smallint AS priority, n.now,
           f.fire_at AS due_at, NULL::text AS partition_key, f.dedup_key, f.max_attempts,
           ARRAY['completed', 'failed', 'cancelled'] AS unique_states,
           NULL::timestamptz AS unique_until, f.version, NULL::text AS trace_context,
           NULL::text AS concurrency_key, NULL::int AS concurrency_limit,
           NULL::timestamptz AS deadline_at, NULL::float8 AS deadline,
           NULL::text AS deadline_source, t.deadline_seconds AS task_seconds,
           NULL::bigint AS parent_id, NULL::int AS parent_position,
           NULL::text AS on_parent_cancel
    FROM fires f
    CROSS JOIN (SELECT {schema}.db_now() AS now) AS n
    LEFT JOIN {schema}.task_defaults t
           ON t.task = f.task AND t.version = f.version AND t.deadline_seconds IS NOT NULL
    WHERE f.new_id IN (SELECT job_id FROM keys)
),
inserted AS (
    -- include: job_insert(job_rows)
    RETURNING j.id, j.queue
),
notified AS (
    SELECT count(pg_notify({schema}.ready_channel(q.queue), q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM inserted) AS q
)
SELECT f.name, f.fire_at, i.id
FROM inserted i JOIN fires f ON f.new_id = i.id CROSS JOIN notified
ORDER BY f.fire_at, f.name;

-- name: test_clock_install
-- Test-only time travel (trioq.testing.SqlClock): db_now() becomes the real time (or the time
-- the clock was frozen at) plus an offset kept in a table, so every pooled connection sees the
-- same shifted clock. Never in production.
CREATE TABLE {schema}.test_clock (offset_seconds float8 NOT NULL, frozen_at timestamptz);
INSERT INTO {schema}.test_clock VALUES (0, NULL);
CREATE OR REPLACE FUNCTION {schema}.db_now() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('trioq.fake_now', true), '')::timestamptz,
                    (SELECT frozen_at FROM {schema}.test_clock), now())
           + (SELECT offset_seconds FROM {schema}.test_clock) * interval '1 second'
$$;

-- name: test_clock_advance
UPDATE {schema}.test_clock SET offset_seconds = offset_seconds + %(seconds)s;

-- name: test_clock_freeze
-- Stop db_now() at its current value: from here only test_clock_advance moves it.
UPDATE {schema}.test_clock
SET frozen_at = coalesce(frozen_at, now()) + offset_seconds * interval '1 second',
    offset_seconds = 0;

-- name: event_emit
-- Store an event (the first emit of a key wins; later emits change nothing) and wake its
-- waiters, in one round trip: event_emit() takes the event row lock in one
-- statement and wakes the waiting jobs in a later one, with a fresh snapshot. The lock order
-- (event row, then job rows) and why no wake-up is lost are in docs/workflows.md.
SELECT emitted_first, woken_count FROM {schema}.event_emit(%(key)s, %(payload)s::jsonb);

-- name: job_wait_event
-- A running job waits for an event, fenced by its lease. The event row is the lock the waiter
-- and the emitter both take: INSERT ... ON CONFLICT DO UPDATE waits for a concurrent emitter's
-- commit and RETURNS THE NEWEST row version even when our snapshot predates it, so "emitted"
-- never comes from a stale snapshot. Then, in the same statement:
--  * emitted: the payload is recorded as the job's checkpoint (`event`) and returned;
--  * not emitted, deadline passed: the timeout is recorded (`event`, {"timeout": true});
--  * otherwise the job suspends: waiting until the deadline (run_at), attempt restored, lease
--    dropped, partition key kept, wait_event_key set, and a pending checkpoint
--    ({"deadline": ...}) keeps the deadline, so a replay after a crash or a wake-up waits until the SAME deadline.
-- An emitter that locks the row after us wakes us in its next statement (fresh snapshot, our
-- commit visible); one that locked it before us is seen as emitted. Exactly one of "event" and
-- "timeout" is ever recorded (the checkpoint is written once and replays read it).
WITH registered AS (
    INSERT INTO {schema}.events AS e (key, created_at)
    VALUES (%(key)s, {schema}.db_now())
    ON CONFLICT (key) DO UPDATE SET key = excluded.key
    RETURNING e.payload, e.emitted_at
),
outcome AS MATERIALIZED (
    SELECT r.payload, d.deadline,
           CASE WHEN r.emitted_at IS NOT NULL THEN 'received'
                WHEN d.deadline <= {schema}.db_now() THEN 'timeout'
                ELSE 'waiting' END AS state
    FROM registered r
    CROSS JOIN (SELECT coalesce(%(deadline)s::timestamptz,
                                {schema}.db_now() + %(timeout_seconds)s * interval '1 second')
                           AS deadline) AS d
),
-- The fence is the run (migration 0047), locked first; a suspension deletes it. The row's
-- attempt is the one before the run (the attempt given back), its executions the run's.
fenced AS MATERIALIZED (
    SELECT u.job_id, u.executions, u.worker_id, u.started_at FROM {schema}.job_runs u
    WHERE u.job_id = %(id)s AND u.attempt = %(attempt)s AND u.lease_token = %(lease_token)s
    FOR UPDATE OF u
),
suspended AS (
    DELETE FROM {schema}.job_runs u USING fenced f, outcome o
    WHERE u.job_id = f.job_id AND o.state = 'waiting'
),
owner AS (
    UPDATE {schema}.job_rows j
    SET checkpoint_count = greatest(j.checkpoint_count, %(position)s + 1),
        phase = CASE WHEN o.state = 'waiting' THEN 'waiting' ELSE j.phase END,
        run_at = CASE WHEN o.state = 'waiting' THEN o.deadline ELSE j.run_at END,
        executions = CASE WHEN o.state = 'waiting' THEN f.executions ELSE j.executions END,
        worker_id = CASE WHEN o.state = 'waiting' THEN f.worker_id ELSE j.worker_id END,
        started_at = CASE WHEN o.state = 'waiting' THEN f.started_at ELSE j.started_at END,
        wait_event_key = CASE WHEN o.state = 'waiting' THEN %(key)s END,
        wait_children = NULL, wait_topic = NULL, wait_position = NULL
    FROM outcome o, fenced f
    WHERE j.id = f.job_id AND j.phase IN ('ready', 'claimed')
    RETURNING j.id, j.queue, j.phase, j.run_at
),
-- A suspension is filed in job_due here (migration 0050): the running record had no copy.
due_filed AS (
    INSERT INTO {schema}.job_due (job_id, queue, state, run_at)
    SELECT w.id, w.queue, w.phase, w.run_at FROM owner w WHERE w.phase = 'waiting'
),
written AS (
    INSERT INTO {schema}.checkpoints AS c (job_id, position, kind, name, value, created_at)
    SELECT w.id, %(position)s, 'event', %(key)s,
           CASE o.state WHEN 'received' THEN jsonb_build_object('payload', o.payload)
                        WHEN 'timeout' THEN jsonb_build_object('timeout', true)
                        ELSE jsonb_build_object('deadline', o.deadline) END,
           {schema}.db_now()
    FROM owner w CROSS JOIN outcome o
    ON CONFLICT (job_id, position) DO UPDATE SET value = excluded.value
    WHERE c.value ? 'deadline'
    RETURNING c.job_id
)
SELECT o.state, o.payload, o.deadline, (SELECT count(*) FROM owner) > 0 AS owned
FROM outcome o CROSS JOIN (SELECT count(*) FROM written) AS side_effects;

-- name: job_spawn_many
-- Running jobs enqueue children, exactly once per (parent, position): each child insert and its
-- parent's `spawn` checkpoint are written in one statement, fenced by the parent's lease (the
-- parents are locked in id order and their lease re-checked on the newest row version; a
-- parent whose cancel was requested spawns nothing). The spawns of every handler that spawned
-- at once share this statement (group commit, trioq/_runtime/workflow/spawner.py): fan-out of 500
-- parents x 10 children went from 18 to NNN parents/s. The arbiter of "once per position" is
-- the parent's `spawn` checkpoint (its primary key (job_id, position); migration 0049: a
-- unique index on the children's (parent_id, parent_position) cannot span the records' epoch
-- partitions): each child's id is drawn first, the checkpoints naming them are inserted ON
-- CONFLICT DO NOTHING, and only the children whose checkpoint was written are inserted. A
-- replay that reaches the same position finds the child its checkpoint names and inserts no
-- second one. A child is scheduled or ready like any enqueue and wakes its queue.
WITH input AS MATERIALIZED (
    SELECT s.parent_id, s.attempt, s.lease_token, s.position, s.on_parent_cancel, t.*
    FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(lease_tokens)s::uuid[],
                %(positions)s::int[], %(on_parent_cancels)s::text[])
         WITH ORDINALITY AS s(parent_id, attempt, lease_token, position, on_parent_cancel, n)
    JOIN (SELECT t.*
          -- include: new_job_arrays
         ) AS t ON t.ord = s.n
),
-- The parents' runs are the fence (migration 0047), locked first in id order, then their rows.
locked AS MATERIALIZED (
    SELECT u.job_id AS id, u.attempt, u.lease_token, n.next_position
    FROM (SELECT parent_id, attempt, lease_token, max(position) + 1 AS next_position
          FROM input GROUP BY parent_id, attempt, lease_token) AS n
    JOIN {schema}.job_runs u
      ON u.job_id = n.parent_id AND u.attempt = n.attempt AND u.lease_token = n.lease_token
    ORDER BY u.job_id
    FOR SHARE OF u
),
owner AS MATERIALIZED (
    UPDATE {schema}.job_rows j
    SET checkpoint_count = greatest(j.checkpoint_count, l.next_position)
    FROM locked l
    WHERE j.id = l.id AND NOT j.cancel_requested
    RETURNING j.id, l.attempt, l.lease_token
),
-- The children of the parents whose lease held, each with its id drawn here, and the
-- checkpoints naming them: those already written (a replay's) name the child that exists.
drawn AS MATERIALIZED (
    SELECT i.*, nextval('{schema}.jobs_id_seq') AS child_id
    FROM input i
    WHERE (i.parent_id, i.attempt, i.lease_token) IN
          (SELECT id, attempt, lease_token FROM owner)
),
existing AS MATERIALIZED (
    SELECT c.job_id AS parent_id, c.position, (c.value ->> 'child_id')::bigint AS id
    FROM drawn d
    JOIN {schema}.checkpoints c ON c.job_id = d.parent_id AND c.position = d.position
    WHERE c.kind = 'spawn'
),
written AS (
    INSERT INTO {schema}.checkpoints (job_id, position, kind, name, value, created_at)
    SELECT d.parent_id, d.position, 'spawn', d.task,
           jsonb_build_object('child_id', d.child_id), {schema}.db_now()
    FROM drawn d
    ON CONFLICT (job_id, position) DO NOTHING
    RETURNING job_id, position
),
new_jobs AS (
    -- A child's deadline is the earlier of its own (the spawn's, else its task's) and its
    -- workflow's, which it inherits on a tie (migrations 0021 and 0029; the rule:
    -- trioq/_core/deadlines.py `child_deadline`), so job_insert is given the outcome and no
    -- seconds of its own.
    SELECT i.child_id AS id, i.queue, i.task, i.payload::jsonb AS payload, i.priority, n.now,
           coalesce(i.run_at, n.now + coalesce(i.delay, 0) * interval '1 second') AS due_at,
           i.partition_key, NULL::text AS dedup_key, i.max_attempts,
           NULL::text[] AS unique_states, NULL::timestamptz AS unique_until, i.version,
           NULL::text AS trace_context, i.concurrency_key, i.concurrency_limit,
           CASE WHEN rule.inherits THEN p.deadline_at ELSE own.deadline_at END AS deadline_at,
           NULL::float8 AS deadline,
           CASE WHEN rule.inherits THEN 'inherited from job ' || p.id
                ELSE own.deadline_source END AS deadline_source,
           NULL::float8 AS task_seconds, i.parent_id, i.position AS parent_position,
           i.on_parent_cancel
    FROM drawn i
    CROSS JOIN (SELECT {schema}.db_now() AS now) AS n
    JOIN {schema}.job_rows p ON p.id = i.parent_id  -- a spawning parent runs
    LEFT JOIN {schema}.task_defaults t
           ON i.task_deadline AND i.deadline_at IS NULL AND i.deadline IS NULL
          AND t.task = i.task AND t.version = i.version AND t.deadline_seconds IS NOT NULL
    CROSS JOIN LATERAL (
        SELECT coalesce(i.deadline_at,
                        n.now + coalesce(i.deadline, t.deadline_seconds) * interval '1 second')
                   AS deadline_at,
               coalesce(i.deadline_source, 'set by task ' || t.task) AS deadline_source
    ) AS own
    CROSS JOIN LATERAL (
        SELECT p.deadline_at IS NOT NULL
               AND (own.deadline_at IS NULL OR p.deadline_at <= own.deadline_at) AS inherits
    ) AS rule
    WHERE (i.parent_id, i.position) IN (SELECT job_id, position FROM written)
    ORDER BY i.ord
),
child AS (
    -- include: job_insert(job_rows)
    RETURNING j.id, j.parent_id, j.parent_position, j.queue, j.phase AS state
),
notified AS (
    SELECT count(pg_notify({schema}.ready_channel(q.queue), q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM child WHERE state = 'ready') AS q
)
SELECT i.ord, coalesce(c.id, e.id) AS child_id, c.id IS NOT NULL AS created,
       EXISTS (SELECT 1 FROM {schema}.job_runs u JOIN {schema}.job_rows j ON j.id = u.job_id
               WHERE u.job_id = i.parent_id AND u.attempt = i.attempt
                 AND u.lease_token = i.lease_token AND j.cancel_requested) AS cancelling
FROM input i
LEFT JOIN child c ON c.parent_id = i.parent_id AND c.parent_position = i.position
LEFT JOIN existing e ON e.parent_id = i.parent_id AND e.position = i.position
CROSS JOIN notified
ORDER BY i.ord;

-- name: job_wait_children
-- A running job waits for some of its children (ids in the order the caller gave them),
-- fenced by its lease. From one snapshot it reads the children and its own children_settled
-- count. When every child is final, or (stop_on_failure) one ended failed or cancelled, the
-- children are returned, and with `record` their outcomes become the job's checkpoint at
-- %(position)s (replays then read the checkpoint, not the children). Otherwise the job
-- suspends: waiting with no deadline, attempt restored, lease dropped, partition key kept,
-- wait_children = the unfinished ones. The suspension is decided under the job's own row lock
-- on its NEWEST version: if children_settled moved since our snapshot, a child finished in
-- between (its statement locked our row to count it), so nothing changes and the caller
-- re-runs this statement with a fresh snapshot ('changed'). A child finishing after our
-- commit finds us waiting and wakes us. No child row is locked, so nothing here can deadlock
-- with the settle statement.
-- The fence is the run (migration 0047), locked first; a suspension deletes it. The row's
-- attempt is the one before the run (the attempt given back), its executions the run's.
WITH owner AS MATERIALIZED (
    SELECT u.job_id AS id, j.children_settled, u.executions, u.worker_id, u.started_at
    FROM {schema}.job_runs u JOIN {schema}.job_rows j ON j.id = u.job_id
    WHERE u.job_id = %(id)s AND u.attempt = %(attempt)s AND u.lease_token = %(lease_token)s
    FOR UPDATE OF u
),
children AS MATERIALIZED (
    SELECT w.ord, w.id, c.state, c.result, c.error, (c.parent_id = o.id) AS mine
    FROM owner o
    CROSS JOIN unnest(%(child_ids)s::bigint[]) WITH ORDINALITY AS w(id, ord)
    LEFT JOIN {schema}.jobs c ON c.id = w.id
),
decision AS MATERIALIZED (
    SELECT CASE
             WHEN NOT EXISTS (SELECT 1 FROM owner) THEN 'lost'
             WHEN EXISTS (SELECT 1 FROM children WHERE mine IS NOT TRUE) THEN 'unknown'
             WHEN NOT EXISTS (SELECT 1 FROM children
                              WHERE state NOT IN ('completed', 'failed', 'cancelled')) THEN 'done'
             WHEN %(stop_on_failure)s AND EXISTS (SELECT 1 FROM children
                                                  WHERE state IN ('failed', 'cancelled'))
               THEN 'failed'
             ELSE 'suspend' END AS state,
           ARRAY(SELECT id FROM children WHERE state NOT IN ('completed', 'failed', 'cancelled')
                 ORDER BY ord) AS pending,
           (SELECT children_settled FROM owner) AS seen
),
updated AS (
    UPDATE {schema}.job_rows j
    SET checkpoint_count = CASE WHEN d.state = 'done' AND %(record)s
                                THEN greatest(j.checkpoint_count, %(position)s + 1)
                                ELSE j.checkpoint_count END,
        phase = CASE WHEN d.state = 'suspend' AND j.children_settled = d.seen THEN 'waiting'
                     ELSE j.phase END,
        run_at = CASE WHEN d.state = 'suspend' AND j.children_settled = d.seen THEN NULL
                      ELSE j.run_at END,
        executions = CASE WHEN d.state = 'suspend' AND j.children_settled = d.seen
                          THEN o.executions ELSE j.executions END,
        worker_id = CASE WHEN d.state = 'suspend' AND j.children_settled = d.seen
                         THEN o.worker_id ELSE j.worker_id END,
        started_at = CASE WHEN d.state = 'suspend' AND j.children_settled = d.seen
                          THEN o.started_at ELSE j.started_at END,
        wait_children = CASE WHEN d.state = 'suspend' AND j.children_settled = d.seen
                             THEN d.pending ELSE NULL END,
        wait_event_key = NULL, wait_topic = NULL, wait_position = NULL
    FROM decision d, owner o
    WHERE d.state IN ('done', 'suspend')
      AND j.id = o.id AND j.phase IN ('ready', 'claimed')
    RETURNING j.id, CASE WHEN j.phase = 'waiting' THEN 'waiting' ELSE 'running' END AS state,
              j.queue, j.run_at
),
-- A suspension is filed in job_due here (migration 0050): the running record had no copy.
due_filed AS (
    INSERT INTO {schema}.job_due (job_id, queue, state, run_at)
    SELECT x.id, x.queue, x.state, x.run_at FROM updated x WHERE x.state = 'waiting'
),
suspended AS (
    DELETE FROM {schema}.job_runs u USING updated x
    WHERE u.job_id = x.id AND x.state = 'waiting'
),
written AS (
    INSERT INTO {schema}.checkpoints (job_id, position, kind, name, value, created_at)
    SELECT u.id, %(position)s, %(kind)s, %(name)s,
           jsonb_build_object('children', (SELECT jsonb_agg(jsonb_build_array(
                                                      c.id, c.state, c.result, c.error)
                                                  ORDER BY c.ord) FROM children c)),
           {schema}.db_now()
    FROM updated u CROSS JOIN decision d
    WHERE d.state = 'done' AND %(record)s
    ON CONFLICT (job_id, position) DO NOTHING
    RETURNING job_id
),
result AS (
    SELECT CASE WHEN d.state = 'suspend' THEN
                    CASE (SELECT u.state FROM updated u) WHEN 'waiting' THEN 'waiting'
                                                         WHEN 'running' THEN 'changed'
                                                         ELSE 'lost' END
                WHEN d.state = 'done' AND NOT EXISTS (SELECT 1 FROM updated) THEN 'lost'
                ELSE d.state END AS state
    FROM decision d CROSS JOIN (SELECT count(*) FROM written) AS side_effects
)
SELECT r.state AS outcome, c.id, c.state, c.result, c.error
FROM result r LEFT JOIN children c ON r.state IN ('done', 'failed', 'unknown')
ORDER BY c.ord;

-- name: job_cancel_children
-- gather's fail-fast, fenced by the parent's lease: record which child failed first as the
-- parent's checkpoint, then cancel the unfinished siblings and their own children
-- (job_cancel_tree: running ones are flagged and their workers told).
SELECT {schema}.job_cancel_children(%(id)s, %(attempt)s, %(lease_token)s, %(position)s,
                                   %(kind)s, %(name)s, %(value)s::jsonb, %(child_ids)s::bigint[],
                                   %(control_channel)s) AS owned;

-- name: message_send
-- `client.send` and the producers: {schema}.send() locks the job row, queues
-- the message and wakes the job if it waits for the topic, in one round trip. The job's state
-- is read first without a lock only to name the error (unknown or final job) without raising in
-- the server; the function re-checks it under the lock.
SELECT
       -- include: job_state
       AS state,
       CASE WHEN j.id IS NOT NULL AND o.job_id IS NULL
            THEN {schema}.send(j.id, %(topic)s::text, %(payload)s::jsonb) END AS message_id
FROM (SELECT %(id)s::bigint AS id) AS k
LEFT JOIN {schema}.job_rows j ON j.id = k.id
LEFT JOIN {schema}.job_runs u ON u.job_id = j.id
LEFT JOIN {schema}.job_outcomes o ON o.job_id = j.id;

-- name: job_receive
-- ctx.receive: job_receive(): fenced, lock then read, so a receive and a send
-- never miss each other; the messages become the checkpoint in the same transaction.
SELECT state, messages, deadline
FROM {schema}.job_receive(%(id)s::bigint, %(attempt)s::int, %(lease_token)s::uuid,
                          %(position)s::int, %(topic)s::text, %(timeout_seconds)s::float8,
                          %(deadline)s::timestamptz, %(limit)s::int,
                          %(value_keys)s::text[], %(value_values)s::jsonb[]);

-- name: job_value_set_many
-- The values a handler set since its last checkpoint, when no checkpoint follows (the handler
-- returns, or its next primitive writes with a statement of its own). Fenced by the lease like
-- a checkpoint; wakes `client.get_value` waiters on the job's result channel.
-- The fence is the run (migration 0047), held until commit: no end of the run (which deletes
-- it first) passes these writes.
WITH owner AS (
    SELECT u.job_id AS id FROM {schema}.job_runs u
    WHERE u.job_id = %(id)s AND u.attempt = %(attempt)s AND u.lease_token = %(lease_token)s
    FOR SHARE
),
written AS (
    INSERT INTO {schema}.workflow_values AS w (job_id, key, value, updated_at)
    SELECT o.id, v.key, v.value::jsonb, {schema}.db_now()
    FROM owner o CROSS JOIN unnest(%(keys)s::text[], %(values)s::text[]) AS v(key, value)
    ON CONFLICT (job_id, key) DO UPDATE SET value = excluded.value,
                                            updated_at = excluded.updated_at
    RETURNING w.job_id
)
SELECT (SELECT count(*) FROM owner) > 0 AS owned,
       (SELECT count(pg_notify({schema}.result_channel(o.id), o.id::text)) FROM owner o)
           AS notified
FROM (SELECT count(*) FROM written) AS side_effects;

-- name: job_value_get
-- `client.get_value`: the job's state (NULL: no such job) and the value of `key`, if set, in
-- one read of two primary keys.
SELECT
       -- include: job_state
       AS state,
       v.value IS NOT NULL AS found, v.value
FROM (SELECT %(id)s::bigint AS id) AS k
LEFT JOIN {schema}.job_rows j ON j.id = k.id
LEFT JOIN {schema}.job_runs u ON u.job_id = j.id
LEFT JOIN {schema}.job_outcomes o ON o.job_id = j.id
LEFT JOIN {schema}.workflow_values v ON v.job_id = j.id AND v.key = %(key)s;

-- name: job_values
-- Every value a job published (`trioq job ID`), by key.
SELECT key, value, updated_at FROM {schema}.workflow_values
WHERE job_id = %(id)s ORDER BY key;

-- name: workflow_list
-- `trioq workflows` / `client.workflows`: unfinished workflows (a job with history, or one
-- suspended), newest first, with what each waits on. Keyset-paged by id like job_list, an
-- operator's read: a backward scan of the primary key, bounded by the LIMIT. The children
-- counts use jobs_parent_idx, per returned row only.
SELECT j.id, j.task, j.queue, j.state, j.run_at, j.checkpoint_count AS checkpoints,
       j.wait_event_key,
       CASE WHEN j.state = 'waiting' THEN j.wait_topic END AS wait_topic,
       j.wait_children IS NOT NULL AND j.state = 'waiting' AS waits_for_children,
       j.children_settled,
       CASE WHEN j.wait_children IS NOT NULL AND j.state = 'waiting'
            THEN (SELECT count(*) FROM {schema}.job_rows c WHERE c.parent_id = j.id) END
           AS children_total,
       j.created_at
-- The records of the running jobs (job_runs) and of the sleeping and waiting ones (job_due),
-- each by primary key: the records hold the history too (migration 0049), which a scan of
-- them would walk; these two hold only the unfinished work.
FROM (SELECT j.*,
             -- include: job_state
             AS state
      FROM (SELECT r.job_id AS id FROM {schema}.job_runs r
            UNION
            SELECT d.job_id FROM {schema}.job_due d
            WHERE d.state IN ('sleeping', 'waiting')) AS w
      JOIN {schema}.job_rows j ON j.id = w.id
      LEFT JOIN {schema}.job_runs u ON u.job_id = j.id
      LEFT JOIN {schema}.job_outcomes o ON o.job_id = j.id) AS j
WHERE j.state IN ('running', 'sleeping', 'waiting')
  AND (j.state <> 'running' OR j.checkpoint_count > 0)
  AND (%(states)s::text[] IS NULL OR j.state = ANY(%(states)s::text[]))
  AND (%(tasks)s::text[] IS NULL OR j.task = ANY(%(tasks)s::text[]))
  AND (%(before_id)s::bigint IS NULL OR j.id < %(before_id)s::bigint)
ORDER BY j.id DESC
LIMIT %(limit)s;

-- =============================================================================================
-- The web dashboard (trioq/dashboard/). Read-only statements, except the audit table's two.
-- None counts over the whole jobs table: every count walks one partial index and stops at
-- %(cap)s rows (the page shows "cap+" and the planner's estimate for the table beyond it);
-- lists are keyset-paged by id. Timings at 1,000,000 jobs: bench/dashboard.py.
-- =============================================================================================

-- name: dashboard_read_only
-- Every page's reads: a read-only transaction (a write is refused whatever the role may do)
-- under a statement timeout, so a slow page cannot pile up queries on a loaded database. No
-- JIT: the capped counts' subplans add up to costs past jit_above_cost, and compiling them took
-- 2.6 s of a 2.7 s overview at 1,000,000 jobs (bench/dashboard.py) for a 10 ms execution.
SET TRANSACTION READ ONLY;
SET LOCAL statement_timeout = '5s';
SET LOCAL jit = off;

-- name: dashboard_queue_counts
-- One row per known queue: capped counts by state, the oldest due ready job's age (over the
-- capped rows), and whether it is paused (about 25 ms for four queues at 1,000,000 jobs on a
-- loaded machine: bench/dashboard.py). Queues are found without a table scan: a loose index
-- scan (one index probe per distinct queue) over each index led by `queue` (the ready ring's,
-- of unkeyed ready jobs; ready_keyed's, of ready jobs with a key of either kind, migration
-- 0048; job_due's, of scheduled/sleeping/waiting rows), plus the runs (job_runs, migration 0047: bounded by
-- the workers' slots), the workers' queues and the pauses. A queue with only finished jobs shows up
-- through the throughput read (jobs_finished_idx); one with only the ring's entries of jobs no
-- longer ready (until their slot is truncated, 20 s at most) shows up with nothing ready.
WITH RECURSIVE
ready_unkeyed AS (
    (SELECT queue FROM {schema}.ready_ring
     WHERE slot >=
         -- include: ring_low
     ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT x.queue FROM {schema}.ready_ring x WHERE x.queue > r.queue
              AND x.slot >=
                  -- include: ring_low
            ORDER BY x.queue LIMIT 1)
    FROM ready_unkeyed r WHERE r.queue IS NOT NULL
),
ready_keyed AS (
    (SELECT queue FROM {schema}.ready_keyed ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT e.queue FROM {schema}.ready_keyed e WHERE e.queue > r.queue
            ORDER BY e.queue LIMIT 1)
    FROM ready_keyed r WHERE r.queue IS NOT NULL
),
due AS (
    (SELECT queue FROM {schema}.job_due ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT d.queue FROM {schema}.job_due d WHERE d.queue > r.queue
            ORDER BY d.queue LIMIT 1)
    FROM due r WHERE r.queue IS NOT NULL
),
running AS (
    SELECT queue, count(*) AS n FROM {schema}.job_runs GROUP BY queue
),
queues AS (
    SELECT queue FROM ready_unkeyed WHERE queue IS NOT NULL
    UNION SELECT queue FROM ready_keyed WHERE queue IS NOT NULL
    UNION SELECT queue FROM due WHERE queue IS NOT NULL
    UNION SELECT queue FROM running
    UNION SELECT unnest(queues) FROM {schema}.workers
    UNION SELECT queue FROM {schema}.queue_pauses
    UNION SELECT unnest(%(also)s::text[])
),
now AS (SELECT {schema}.db_now() AS t)
SELECT q.queue, unkeyed.n + keyed.n + concurrency_keyed.n AS ready,
       coalesce((SELECT n FROM running r WHERE r.queue = q.queue), 0) AS running,
       due.scheduled, due.sleeping, due.waiting, due.walked >= 3 * %(cap)s AS due_capped,
       overdue.sleeping AS sleeping_due, overdue.waiting AS waiting_due,
       overdue.walked >= %(cap)s AS overdue_capped,
       extract(epoch FROM now.t - least(unkeyed.oldest, keyed.oldest,
                                        concurrency_keyed.oldest))::float8
           AS oldest_due_seconds,
       (SELECT p.paused_at FROM {schema}.queue_pauses p WHERE p.queue = q.queue) AS paused_at
FROM queues q CROSS JOIN now
-- Each walk reads at most %(cap)s index entries (the ready ones index only, run_at included).
-- The unkeyed ones: the ring's entries whose job is still ready (a primary-key probe each; the
-- entries of jobs no longer ready are stepped over), a job counted once (a job cancelled and
-- redriven within 20 s has two entries).
CROSS JOIN LATERAL (
    SELECT count(DISTINCT s.id) AS n, min(s.run_at) FILTER (WHERE s.run_at <= now.t) AS oldest
    FROM (SELECT r.id, r.run_at FROM {schema}.ready_ring r
          CROSS JOIN LATERAL (SELECT 1 FROM {schema}.job_rows j
                              WHERE j.id = r.id AND j.phase = 'ready' AND j.filed = r.filed
                              LIMIT 1) AS job
          WHERE r.queue = q.queue
            AND r.slot >=
                -- include: ring_low
          LIMIT %(cap)s) s
) unkeyed
-- The keyed ones: ready_keyed's entries of the queue, per kind (each walk capped as before;
-- an entry is its job's while ready: the triggers of migration 0048 delete it as it leaves).
CROSS JOIN LATERAL (
    SELECT count(*) AS n, min(s.run_at) FILTER (WHERE s.run_at <= now.t) AS oldest
    FROM (SELECT e.run_at FROM {schema}.ready_keyed e
          WHERE e.queue = q.queue AND e.kind = 'c'
          LIMIT %(cap)s) s
) concurrency_keyed
CROSS JOIN LATERAL (
    SELECT count(*) AS n, min(s.run_at) FILTER (WHERE s.run_at <= now.t) AS oldest
    FROM (SELECT e.run_at FROM {schema}.ready_keyed e
          WHERE e.queue = q.queue AND e.kind = 'p'
          LIMIT %(cap)s) s
) keyed
-- One walk of job_due's (queue, run_at) (migration 0044) for the three future-dated states, at
-- most three caps of rows: when it stops there, `due_capped` says the three counts are lower
-- bounds.
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE s.state = 'scheduled') AS scheduled,
           count(*) FILTER (WHERE s.state = 'sleeping') AS sleeping,
           count(*) FILTER (WHERE s.state = 'waiting') AS waiting,
           count(*) AS walked
    FROM (SELECT d.state FROM {schema}.job_due d WHERE d.queue = q.queue
          LIMIT 3 * %(cap)s) s
) due
-- The same index's range up to now: sleeping and waiting work already due (promotion behind),
-- for the health list; an index range, so a queue with none costs one probe.
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE s.state = 'sleeping') AS sleeping,
           count(*) FILTER (WHERE s.state = 'waiting') AS waiting,
           count(*) AS walked
    FROM (SELECT d.state FROM {schema}.job_due d
          WHERE d.queue = q.queue AND d.run_at <= now.t
          LIMIT %(cap)s) s
) overdue
ORDER BY q.queue;

-- name: dashboard_now
-- The database's time: ages on the pages (a worker's heartbeat) are measured against it, not
-- against the dashboard host's clock.
SELECT {schema}.db_now();

-- name: dashboard_state_estimates
-- The planner's estimate of the jobs by queue and state, from the joint statistics migration
-- 0014 creates (pg_stats_ext: the most common (queue, state) pairs, in column order, with their
-- frequencies, times pg_class.reltuples): shown where a capped count stopped. A catalog read;
-- no rows until the table was first analyzed, none for pairs too rare to be common ones. Of
-- the future-dated jobs only (job_due: scheduled, sleeping, waiting; migration 0049 moved the
-- statistics there from jobs_live, whose records now hold the history too): ready, running
-- and finished ones are counted.
SELECT s.most_common_vals[i][1] AS queue, s.most_common_vals[i][2] AS state,
       round(greatest(c.reltuples, 0) * s.most_common_freqs[i])::bigint AS estimate
FROM pg_stats_ext AS s
CROSS JOIN LATERAL generate_subscripts(s.most_common_freqs, 1) AS i
CROSS JOIN pg_class AS c
WHERE s.statistics_schemaname = %(schema_name)s AND s.statistics_name = 'jobs_queue_state'
  AND c.oid = '{schema}.job_due'::regclass
ORDER BY 1, 2;

-- name: dashboard_throughput
-- Completed and failed jobs per queue and minute over the last hour: a backward walk of
-- job_outcomes_finished_idx from now, at most %(cap)s rows (each needs its heap row for queue and
-- state: 10,000 rows took 20-45 ms on a loaded machine); when the cap is reached,
-- `covered_seconds` says how far back the counts are complete (the page says so).
-- The outcomes (migration 0049) by job_outcomes_finished_idx, merged over the epochs.
WITH recent AS (
    SELECT queue, state, finished_at FROM {schema}.job_outcomes
    WHERE finished_at >= {schema}.db_now() - interval '1 hour'
    ORDER BY finished_at DESC
    LIMIT %(cap)s
),
span AS (
    SELECT count(*) AS n, extract(epoch FROM {schema}.db_now() - min(finished_at))::float8 AS back
    FROM recent
)
SELECT r.queue,
       least(59, floor(extract(epoch FROM {schema}.db_now() - r.finished_at) / 60))::int
           AS minutes_ago,
       count(*) FILTER (WHERE r.state = 'completed') AS completed,
       count(*) FILTER (WHERE r.state = 'failed') AS failed,
       CASE WHEN span.n >= %(cap)s THEN span.back END AS covered_seconds
FROM recent r CROSS JOIN span
GROUP BY r.queue, 2, span.n, span.back
ORDER BY r.queue, 2;

-- fragment: dashboard_job_row
-- max_attempts as job_get reads it: the row's, else its task's declaration (migration 0015).
-- The record `j` with its run `u` and its outcome `o` (migrations 0047, 0049: LEFT JOIN
-- {schema}.job_runs u, LEFT JOIN {schema}.job_outcomes o).
SELECT j.id, j.queue, j.task,
       -- include: job_state
       AS state,
       j.priority, j.run_at, j.partition_key,
       coalesce(o.attempt, u.attempt, j.attempt) AS attempt,
       coalesce(j.max_attempts, (SELECT d.max_attempts FROM {schema}.task_defaults d
                                 WHERE d.task = j.task AND d.version = j.version), 5)
           AS max_attempts, j.created_at, o.finished_at,
       left(j.payload::text, 200) AS payload_head,
       CASE WHEN o.job_id IS NOT NULL THEN o.error WHEN u.job_id IS NULL THEN j.error END
           ->> 'message' AS error_message

-- fragment: dashboard_job_filters
  AND (%(task)s::text IS NULL OR j.task = %(task)s::text)
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
  AND (%(partition_key)s::text IS NULL OR j.partition_key = %(partition_key)s::text)
  AND (%(created_after)s::timestamptz IS NULL OR j.created_at >= %(created_after)s)
  AND (%(created_before)s::timestamptz IS NULL OR j.created_at < %(created_before)s)
  AND (%(text)s::text IS NULL OR strpos(j.payload::text, %(text)s::text) > 0)

-- name: dashboard_job_search
-- The jobs page, newest first, keyset-paged by id, any filter (NULL: any): walks exactly the
-- %(walk)s newest ids below `before_id` (the primary key, index only) and filters those rows,
-- so a page costs at most %(walk)s row reads whatever the filters match (a rare state or text
-- does not walk the whole table). `walked_to` is the lowest id walked: the next page starts
-- there whether or not this one matched anything.
WITH walked AS (
    SELECT id FROM {schema}.job_rows
    WHERE %(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint
    ORDER BY id DESC LIMIT %(walk)s
),
matched AS (
    -- include: dashboard_job_row
    -- `= ANY(ARRAY(...))`: one primary-key probe per walked id. A join to `walked` let the
    -- planner merge it with its own filtered backward walk of the whole table (910 ms).
    FROM {schema}.job_rows j LEFT JOIN {schema}.job_runs u ON u.job_id = j.id
    LEFT JOIN {schema}.job_outcomes o ON o.job_id = j.id
    WHERE j.id = ANY(ARRAY(SELECT id FROM walked))
      AND (%(state)s::text IS NULL OR %(state)s::text =
           -- include: job_state
          )
    -- include: dashboard_job_filters
    ORDER BY j.id DESC LIMIT %(limit)s
),
edge AS (SELECT min(id) AS walked_to, count(*) AS walked FROM walked)
SELECT m.*, edge.walked_to, edge.walked, NULL::timestamptz
FROM edge LEFT JOIN matched m ON true
ORDER BY m.id DESC;

-- name: dashboard_job_search_suspended
-- The jobs page filtered by sleeping or waiting, newest first: a backward walk of job_due's
-- (state, job_id) (migration 0044), which holds the due states' rows only, each job's row
-- read by primary key from jobs_live (a due row lives nowhere else).
WITH matched AS (
    -- include: dashboard_job_row
    FROM {schema}.job_due d
    JOIN {schema}.job_rows j ON j.id = d.job_id
    -- A sleeping or waiting job has no run (migration 0047); the join is the fragment's.
    LEFT JOIN {schema}.job_runs u ON u.job_id = j.id
    LEFT JOIN {schema}.job_outcomes o ON o.job_id = j.id
    WHERE d.state = %(state)s::text AND d.state IN ('sleeping', 'waiting')
      AND (%(before_id)s::bigint IS NULL OR d.job_id < %(before_id)s::bigint)
    -- include: dashboard_job_filters
    ORDER BY d.job_id DESC LIMIT %(limit)s
)
SELECT m.*, (SELECT min(id) FROM matched), (SELECT count(*) FROM matched), NULL::timestamptz
FROM (SELECT 1) AS one LEFT JOIN matched m ON true
ORDER BY m.id DESC;

-- name: dashboard_job_search_unfinished
-- The jobs page filtered by scheduled or running, newest first. Scheduled: a backward walk of
-- job_due's (state, job_id) (migration 0044), each job's row read by primary key from
-- jobs_live (a scheduled job has no run: the join is the fragment's). Running: the runs
-- (migration 0047, bounded by the workers' slots) find the rows, then the newest are sorted
-- out; `id + 0` keeps the planner off the primary key's order: walking it backward until
-- %(limit)s rows of the state turn up can read every finished row above an older backlog.
-- The cost follows the state's population, not the table's. The branch of the other state is
-- cut by its one-time filter.
WITH matched AS (
    (
     -- include: dashboard_job_row
     FROM {schema}.job_due d
     JOIN {schema}.job_rows j ON j.id = d.job_id
     LEFT JOIN {schema}.job_runs u ON u.job_id = j.id
     LEFT JOIN {schema}.job_outcomes o ON o.job_id = j.id
     WHERE %(state)s::text = 'scheduled' AND d.state = 'scheduled'
       AND (%(before_id)s::bigint IS NULL OR d.job_id < %(before_id)s::bigint)
     -- include: dashboard_job_filters
     ORDER BY d.job_id DESC LIMIT %(limit)s)
    UNION ALL
    (
     -- include: dashboard_job_row
     FROM {schema}.job_runs u
     JOIN {schema}.job_rows j ON j.id = u.job_id
     LEFT JOIN {schema}.job_outcomes o ON o.job_id = j.id
     WHERE %(state)s::text = 'running'
       AND (%(before_id)s::bigint IS NULL OR j.id < %(before_id)s::bigint)
     -- include: dashboard_job_filters
     ORDER BY j.id + 0 DESC LIMIT %(limit)s)
)
SELECT m.*, (SELECT min(id) FROM matched), (SELECT count(*) FROM matched), NULL::timestamptz
FROM (SELECT 1) AS one LEFT JOIN matched m ON true
ORDER BY m.id DESC;

-- name: dashboard_job_search_ready
-- The jobs page filtered by ready, newest first: the unkeyed, partition-keyed and
-- concurrency-keyed ready rows each through their claim source (the ready ring's entries,
-- each job once, probed by primary key; ready_keyed's entries, migration 0048), the newest of
-- each, then of both.
-- `id + 0` as in dashboard_job_search_unfinished: the primary key's order walked 880,000
-- finished rows above a 40,000-row backlog (340 ms); the claim sources read the backlog
-- only (bench/dashboard.py).
WITH ids AS (
    -- A job claimed from the ring reads ready without an entry (migration 0047): the row's
    -- `filed` must be its entry's.
    (SELECT j.id FROM {schema}.job_rows j
     WHERE (j.id, j.filed) IN (SELECT r.id, r.filed FROM {schema}.ready_ring r
                               WHERE (%(before_id)s::bigint IS NULL
                                      OR r.id < %(before_id)s::bigint)
                                 AND r.slot >=
                                     -- include: ring_low
                              )
       AND j.phase = 'ready' AND j.partition_key IS NULL AND j.concurrency_key IS NULL
       AND (%(before_id)s::bigint IS NULL OR j.id < %(before_id)s::bigint)
     -- include: dashboard_job_filters
     ORDER BY j.id + 0 DESC LIMIT %(limit)s)
    UNION ALL
    -- The keyed ones through ready_keyed (migration 0048), each entry's row by primary key.
    (SELECT j.id FROM {schema}.job_rows j
     WHERE (j.id, j.filed) IN (SELECT e.id, e.filed FROM {schema}.ready_keyed e
                               WHERE %(before_id)s::bigint IS NULL
                                  OR e.id < %(before_id)s::bigint)
       AND j.phase = 'ready'
       AND (%(before_id)s::bigint IS NULL OR j.id < %(before_id)s::bigint)
     -- include: dashboard_job_filters
     ORDER BY j.id + 0 DESC LIMIT %(limit)s)
),
matched AS (
    -- include: dashboard_job_row
    FROM {schema}.job_rows j LEFT JOIN {schema}.job_runs u ON u.job_id = j.id
    LEFT JOIN {schema}.job_outcomes o ON o.job_id = j.id
    WHERE j.id = ANY(ARRAY(SELECT id FROM ids ORDER BY id DESC LIMIT %(limit)s))
      AND j.phase = 'ready' AND u.job_id IS NULL
    ORDER BY j.id DESC
)
SELECT m.*, (SELECT min(id) FROM matched), (SELECT count(*) FROM matched), NULL::timestamptz
FROM (SELECT 1) AS one LEFT JOIN matched m ON true
ORDER BY m.id DESC;

-- name: dashboard_job_search_finished
-- The jobs page filtered by one finished state: most recently finished first, keyset-paged by
-- (finished_at, id), walking at most %(walk)s entries of job_outcomes_finished_idx (every
-- row, of all three states) per page; `walked_to` / `walked_to_finished` is where the walk
-- stopped.
-- The outcomes (migration 0049) by job_outcomes_finished_idx (merged over the epochs).
WITH walked AS (
    SELECT job_id AS id, finished_at, state FROM {schema}.job_outcomes
    WHERE %(before_finished)s::timestamptz IS NULL
       OR (finished_at, job_id) < (%(before_finished)s::timestamptz, %(before_id)s::bigint)
    ORDER BY finished_at DESC, job_id DESC LIMIT %(walk)s
),
matched AS (
    -- include: dashboard_job_row
    , w.finished_at AS walked_finished
    FROM walked w JOIN {schema}.job_rows j ON j.id = w.id
    LEFT JOIN {schema}.job_runs u ON u.job_id = j.id
    LEFT JOIN {schema}.job_outcomes o ON o.job_id = j.id
    WHERE w.state = %(state)s::text
    -- include: dashboard_job_filters
    ORDER BY w.finished_at DESC, j.id DESC LIMIT %(limit)s
),
edge AS (
    SELECT id AS walked_to, finished_at AS walked_to_finished, (SELECT count(*) FROM walked) AS n
    FROM walked ORDER BY finished_at, id LIMIT 1
)
SELECT m.id, m.queue, m.task, m.state, m.priority, m.run_at, m.partition_key, m.attempt,
       m.max_attempts, m.created_at, m.finished_at, m.payload_head, m.error_message,
       edge.walked_to, edge.n, edge.walked_to_finished
FROM (SELECT 1) AS one LEFT JOIN edge ON true LEFT JOIN matched m ON true
ORDER BY m.walked_finished DESC, m.id DESC;

-- name: dashboard_job_get
-- One job for its page (primary key): the columns job_get reads plus the workflow's (parent,
-- wait key, children, version); payload and result as text, cut at %(text_limit)s characters,
-- with their full lengths, so a huge or deeply nested value is never parsed to be shown.
SELECT id, queue, task, state, priority, run_at, partition_key,
       -- The key the job holds (job_keys names it), not one a newer job took over.
       (SELECT k.key FROM {schema}.job_keys k
        WHERE k.key = jobs.dedup_key AND k.job_id = jobs.id) AS dedup_key, attempt,
       coalesce(max_attempts, (SELECT d.max_attempts FROM {schema}.task_defaults d
                             WHERE d.task = jobs.task AND d.version = jobs.version), 5)
           AS max_attempts,
       worker_id, created_at, started_at, finished_at, version, parent_id,
       wait_event_key, wait_children, checkpoint_count, cancel_requested,
       left(payload::text, %(text_limit)s) AS payload, length(payload::text) AS payload_length,
       left(result::text, %(text_limit)s) AS result, length(result::text) AS result_length,
       left(error::text, %(text_limit)s) AS error, deadline_at, deadline_source
FROM {schema}.jobs WHERE id = %(id)s;

-- name: dashboard_job_history
-- A workflow's checkpoints with their commit times (the primary key (job_id, position)), values
-- cut at %(text_limit)s characters, for the timeline; an event wait also gets its event's emit
-- time (events' primary key), since its checkpoint keeps the time the wait began.
SELECT c.position, c.kind, c.name, left(c.value::text, %(text_limit)s), c.created_at,
       CASE WHEN c.kind = 'event' THEN
           (SELECT e.emitted_at FROM {schema}.events e WHERE e.key = c.name) END
FROM {schema}.checkpoints c WHERE c.job_id = %(id)s ORDER BY c.position LIMIT 2000;

-- name: dashboard_job_children
-- A workflow's children (jobs_parent_idx), in spawn order.
SELECT id, task, state, parent_position, created_at, finished_at
FROM {schema}.jobs WHERE parent_id = %(id)s ORDER BY parent_position LIMIT 1000;

-- name: dashboard_workflows
-- Running, sleeping and waiting workflows (jobs with history, or suspended), newest first,
-- keyset-paged by id, each with what it waits on and its last checkpoint. The sleeping and the
-- waiting rows come from job_due's (state, job_id) (migration 0044) in id order, a walk per
-- state, and the running ones from the runs (migration 0047: bounded by the workers' slots),
-- so finished history is never walked.
WITH found AS (
    (SELECT j.id FROM {schema}.job_runs u JOIN {schema}.job_rows j ON j.id = u.job_id
     WHERE j.checkpoint_count > 0
       AND (%(before_id)s::bigint IS NULL OR j.id < %(before_id)s::bigint)
     ORDER BY j.id DESC LIMIT %(limit)s)
    UNION ALL
    (SELECT job_id FROM {schema}.job_due
     WHERE state = 'sleeping'
       AND (%(before_id)s::bigint IS NULL OR job_id < %(before_id)s::bigint)
     ORDER BY job_id DESC LIMIT %(limit)s)
    UNION ALL
    (SELECT job_id FROM {schema}.job_due
     WHERE state = 'waiting'
       AND (%(before_id)s::bigint IS NULL OR job_id < %(before_id)s::bigint)
     ORDER BY job_id DESC LIMIT %(limit)s)
)
SELECT j.id, j.queue, j.task,
       -- include: job_state
       AS state,
       j.run_at, j.wait_event_key, j.wait_children,
       j.checkpoint_count, j.created_at, c.kind AS last_kind, c.name AS last_name,
       c.created_at AS last_at
FROM (SELECT id FROM found ORDER BY id DESC LIMIT %(limit)s) f
JOIN {schema}.job_rows j ON j.id = f.id
LEFT JOIN {schema}.job_runs u ON u.job_id = j.id
LEFT JOIN {schema}.job_outcomes o ON o.job_id = j.id
LEFT JOIN {schema}.checkpoints c
       ON c.job_id = j.id AND c.position = j.checkpoint_count - 1
ORDER BY j.id DESC;

-- name: dashboard_health
-- The overview's health list, the counts not already in dashboard_queue_counts (whose sums give
-- the ready backlog, due sleeping work, active waits and due wait timeouts, each capped, where
-- status_health counts the ready backlog with a scan of the whole table: no one index holds
-- every ready row). Running jobs are the runs (migration 0047: bounded by the slots); the same
-- liveness rule for workers as status_health (a heartbeat under 120 s old). Nothing locked.
WITH now AS (SELECT {schema}.db_now() AS t)
SELECT
    (SELECT count(*) FROM {schema}.job_runs, now WHERE lease_expires_at < now.t),
    (SELECT count(*) FROM {schema}.job_runs AS u, now
     WHERE NOT EXISTS (
         SELECT 1 FROM {schema}.workers AS w
         WHERE w.id = u.worker_id AND w.heartbeat_at > now.t - interval '120 s')),
    (SELECT count(*) FROM pg_locks WHERE NOT granted),
    (SELECT deadlocks FROM pg_stat_database WHERE datname = current_database());

-- name: dashboard_audit_insert
-- An admin action, recorded before it runs (so no action goes unrecorded).
INSERT INTO {schema}.dashboard_audit (at, actor, address, action, target, detail)
VALUES ({schema}.db_now(), %(actor)s, %(address)s, %(action)s, %(target)s, %(detail)s::jsonb)
RETURNING id;

-- name: dashboard_audit_finish
UPDATE {schema}.dashboard_audit SET outcome = %(outcome)s WHERE id = %(id)s AND outcome IS NULL;

-- name: dashboard_audit_list
SELECT id, at, actor, address, action, target, detail::text, outcome
FROM {schema}.dashboard_audit
WHERE %(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint
ORDER BY id DESC LIMIT %(limit)s;
-- name: job_continue_as_new
-- `ctx.continue_as_new(payload)`: the workflow's history ends and it starts again as the SAME
-- job (clients waiting on its id keep waiting for its final result), fenced by its lease.
-- Its checkpoints are deleted, its payload replaced, its attempts budget restored (attempt 0:
-- the next claim makes it 1) and it becomes ready at once with a ready notification; it keeps
-- its partition-key lock (a ready holder is its key's head). The runtime joined its children
-- first (the nursery rule), so they are all final: they are detached from their positions,
-- which the new history will use again (jobs_parent_idx is unique on parent and position). A
-- job whose cancel was requested continues nothing.
-- The fence is the run (migration 0047), locked first, then the row; the run ends here.
WITH owner AS MATERIALIZED (
    SELECT u.job_id AS id, u.executions, j.cancel_requested
    FROM {schema}.job_runs u JOIN {schema}.job_rows j ON j.id = u.job_id
    WHERE u.job_id = %(id)s AND u.attempt = %(attempt)s AND u.lease_token = %(lease_token)s
    FOR UPDATE OF u
),
restarted AS (
    UPDATE {schema}.job_rows j
    SET payload = %(payload)s::jsonb, checkpoint_count = 0, children_settled = 0,
        phase = 'ready', filed = j.filed + 1, run_at = {schema}.db_now(), attempt = 0,
        executions = o.executions, worker_id = NULL, started_at = NULL,
        wait_children = NULL, wait_event_key = NULL
    FROM owner o
    WHERE j.id = o.id AND NOT j.cancel_requested AND j.phase IN ('ready', 'claimed')
    RETURNING j.id, j.queue
),
ended AS (
    DELETE FROM {schema}.job_runs u USING restarted r WHERE u.job_id = r.id
),
cleared AS (
    DELETE FROM {schema}.checkpoints c USING restarted r WHERE c.job_id = r.id RETURNING 1
),
detached AS (
    UPDATE {schema}.job_rows c SET parent_position = NULL
    FROM restarted r WHERE c.parent_id = r.id AND c.parent_position IS NOT NULL
    RETURNING 1
),
notified AS (
    SELECT count(pg_notify({schema}.ready_channel(queue), queue)) AS n FROM restarted
)
SELECT CASE WHEN EXISTS (SELECT 1 FROM restarted) THEN 'continued'
            WHEN EXISTS (SELECT 1 FROM owner) THEN 'cancelling'
            ELSE 'lost' END AS outcome
FROM notified CROSS JOIN (SELECT count(*) FROM cleared) AS c
CROSS JOIN (SELECT count(*) FROM detached) AS d;

-- name: job_cancel_with
-- `client.cancel(id, tree=...)`: job_cancel_tree (functions/job_cancel_tree.sql), which follows each child's
-- `on_parent_cancel` policy (cancel, abandon, wait) unless `tree` asks for the whole tree.
SELECT previous_state, state
FROM {schema}.job_cancel_tree(ARRAY[%(id)s::bigint], %(control_channel)s, %(tree)s);

-- name: queue_limited
-- Whether the queue has cluster-wide limits (a row of queue_limits), so an unlimited queue's
-- claim statement stays as it is. PgDriver asks at its first claim of a queue, again after a
-- 'limits:QUEUE' control notification or a listener reconnect, and once per poll interval
-- only while it has no working listener (trioq/_pg/limits.py).
SELECT EXISTS (SELECT 1 FROM {schema}.queue_limits q WHERE q.queue = %(queue)s::text) AS limited;

-- name: queue_limit_gate
-- A limited queue's claim, first statement of its transaction (the function's comment in
-- migration 0023 explains the lock and the fresh snapshot of the running count).
SELECT allowed, running, global_limit, rate_allowed, rate_period, next_start_at, started_at
FROM {schema}.queue_limit_gate(%(queue)s::text, %(requested)s::int);

-- name: queue_limit_spend
-- A limited queue's claim, after the claim statement and before COMMIT (run only when it took
-- jobs): their start time, and with a rate their entry in its log.
SELECT {schema}.queue_limit_spend(%(queue)s::text, %(claimed)s::bigint[],
                                  %(started_at)s::timestamptz) AS next_start_at;

-- name: queue_limit_set
-- `trioq queue limit` / `trioq queue rate`: merge the change into the queue's row; a queue left
-- with no limit loses its row. The queue's workers are woken (a raised limit may free slots)
-- and told on the control channel ('limits:QUEUE') to read the queue's limits again; a lowered
-- limit applies from their next claim, and running jobs are never stopped.
WITH wanted AS (
    SELECT %(queue)s::text AS queue,
           %(set_limit)s::bool AS set_limit, %(global_limit)s::int AS global_limit,
           %(set_rate)s::bool AS set_rate, %(rate_allowed)s::int AS rate_allowed,
           %(rate_period)s::float8 AS rate_period
),
current AS MATERIALIZED (
    SELECT q.* FROM {schema}.queue_limits q JOIN wanted w ON q.queue = w.queue FOR UPDATE OF q
),
merged AS MATERIALIZED (
    SELECT w.queue,
           CASE WHEN w.set_limit THEN w.global_limit ELSE c.global_limit END AS global_limit,
           CASE WHEN w.set_rate THEN w.rate_allowed ELSE c.rate_allowed END AS rate_allowed,
           CASE WHEN w.set_rate THEN w.rate_period ELSE c.rate_period END AS rate_period
    FROM wanted w LEFT JOIN current c ON true
),
removed AS (
    DELETE FROM {schema}.queue_limits q USING merged m
    WHERE q.queue = m.queue AND m.global_limit IS NULL AND m.rate_allowed IS NULL
    RETURNING q.queue
),
upserted AS (
    INSERT INTO {schema}.queue_limits AS q (queue, global_limit, rate_allowed, rate_period,
                                            updated_at)
    SELECT m.queue, m.global_limit, m.rate_allowed, m.rate_period, {schema}.db_now()
    FROM merged m WHERE m.global_limit IS NOT NULL OR m.rate_allowed IS NOT NULL
    ON CONFLICT (queue) DO UPDATE
        SET global_limit = excluded.global_limit, rate_allowed = excluded.rate_allowed,
            rate_period = excluded.rate_period, updated_at = excluded.updated_at
    RETURNING q.queue
)
SELECT pg_notify({schema}.ready_channel(w.queue), w.queue),
       pg_notify(%(control_channel)s, 'limits:' || w.queue),
       (SELECT count(*) FROM removed) + (SELECT count(*) FROM upserted) AS changed
FROM wanted w;

-- name: queue_limit_list
-- Each limited queue against its limits now (status, explain, /metrics): its running jobs
-- across workers, the starts in the rate's window, and when the next start is allowed when
-- the window is full (the oldest start it counts, plus the period).
SELECT q.queue, q.global_limit, q.rate_allowed, q.rate_period,
       -- The runs carry their queue (migration 0047).
       (SELECT count(*) FROM {schema}.job_runs u WHERE u.queue = q.queue)::int AS running,
       coalesce(w.counted, 0)::int AS recent_starts,
       CASE WHEN w.counted >= q.rate_allowed
            THEN w.starts[w.counted - q.rate_allowed + 1]
                 + q.rate_period * interval '1 second' END AS rate_limited_until
FROM {schema}.queue_limits q
LEFT JOIN LATERAL (
    SELECT count(*) AS counted, array_agg(s.at ORDER BY s.at) AS starts
    FROM unnest(q.recent_starts) AS s(at)
    WHERE s.at > {schema}.db_now() - q.rate_period * interval '1 second'
) AS w ON q.rate_allowed IS NOT NULL
ORDER BY q.queue;

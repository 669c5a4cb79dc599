-- The database as `trioq migrate` leaves it (schema `trioq`), from `pg_dump --schema-only`.
-- Generated: `python -m tests.schema_snapshot`; tests/test_schema_snapshot.py checks it.

CREATE SCHEMA trioq;

CREATE DOMAIN trioq.job_attempt AS integer
	CONSTRAINT jobs_attempt_check CHECK ((VALUE >= 0));

CREATE DOMAIN trioq.job_checkpoint_count AS integer
	CONSTRAINT jobs_checkpoint_count_check CHECK ((VALUE >= 0));

CREATE DOMAIN trioq.job_concurrency_key AS text
	CONSTRAINT jobs_concurrency_key_check CHECK (((length(VALUE) >= 1) AND (length(VALUE) <= 512)));

CREATE DOMAIN trioq.job_concurrency_limit AS integer
	CONSTRAINT jobs_concurrency_limit_check CHECK (((VALUE >= 1) AND (VALUE <= 10000)));

CREATE DOMAIN trioq.job_dedup_key AS text
	CONSTRAINT jobs_dedup_key_check CHECK (((length(VALUE) >= 1) AND (length(VALUE) <= 512)));

CREATE DOMAIN trioq.job_max_attempts AS integer
	CONSTRAINT jobs_max_attempts_check CHECK ((VALUE >= 1));

CREATE DOMAIN trioq.job_on_parent_cancel AS text
	CONSTRAINT jobs_on_parent_cancel_check CHECK ((VALUE = ANY ('{cancel,abandon,wait}'::text[])));

CREATE DOMAIN trioq.job_partition_key AS text
	CONSTRAINT jobs_partition_key_check CHECK (((length(VALUE) >= 1) AND (length(VALUE) <= 512)));

CREATE DOMAIN trioq.job_payload AS jsonb
	CONSTRAINT jobs_payload_check CHECK ((pg_column_size(VALUE) <= 6000064));

CREATE DOMAIN trioq.job_queue AS text
	CONSTRAINT jobs_queue_check CHECK (((length(VALUE) <= 128) AND (VALUE ~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]*$'::text)));

CREATE DOMAIN trioq.job_task AS text
	CONSTRAINT jobs_task_check CHECK (((length(VALUE) <= 128) AND (VALUE ~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]*$'::text)));

CREATE DOMAIN trioq.job_trace_context AS text
	CONSTRAINT jobs_trace_context_check CHECK ((length(VALUE) <= 512));

CREATE DOMAIN trioq.job_unique_states AS text[]
	CONSTRAINT jobs_unique_states_check CHECK ((VALUE <@ '{completed,failed,cancelled}'::text[]));

CREATE DOMAIN trioq.job_version AS integer
	CONSTRAINT jobs_version_check CHECK ((VALUE >= 1));

CREATE FUNCTION trioq.checkpoints_delete_of_jobs() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM deleted_jobs d WHERE d.checkpoint_count > 0) THEN
        DELETE FROM "trioq".checkpoints c USING deleted_jobs d
        WHERE d.checkpoint_count > 0 AND c.job_id = d.id;
    END IF;
    DELETE FROM "trioq".attempts a USING deleted_jobs d WHERE a.job_id = d.id;
    DELETE FROM "trioq".messages m USING deleted_jobs d WHERE m.job_id = d.id;
    DELETE FROM "trioq".workflow_values v USING deleted_jobs d WHERE v.job_id = d.id;
    IF EXISTS (SELECT 1 FROM deleted_jobs d WHERE d.partition_key IS NOT NULL) THEN
        DELETE FROM "trioq".partition_locks l USING deleted_jobs d
        WHERE d.partition_key IS NOT NULL AND l.job_id = d.id;
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION trioq.concurrency_limit_of(key text, job_limit integer) RETURNS integer
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(
        (SELECT l.max_running FROM "trioq".concurrency_limits l
         WHERE l.pattern OPERATOR(pg_catalog.=) key
            OR (pg_catalog.right(l.pattern, 1) OPERATOR(pg_catalog.=) '*'
                AND pg_catalog.starts_with(key, pg_catalog.left(l.pattern, -1)))
         ORDER BY pg_catalog.length(l.pattern) DESC,
                  pg_catalog.right(l.pattern, 1) OPERATOR(pg_catalog.=) '*'
         LIMIT 1),
        job_limit, 1)
$$;

CREATE FUNCTION trioq.concurrency_rate_of(key text) RETURNS TABLE(rate_allowed integer, rate_period double precision)
    LANGUAGE sql STABLE
    AS $$
    SELECT r.rate_allowed, r.rate_period FROM "trioq".concurrency_rates r
    WHERE r.pattern OPERATOR(pg_catalog.=) key
       OR (pg_catalog.right(r.pattern, 1) OPERATOR(pg_catalog.=) '*'
           AND pg_catalog.starts_with(key, pg_catalog.left(r.pattern, -1)))
    ORDER BY pg_catalog.length(r.pattern) DESC,
             pg_catalog.right(r.pattern, 1) OPERATOR(pg_catalog.=) '*'
    LIMIT 1
$$;

CREATE FUNCTION trioq.concurrency_release() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    DELETE FROM "trioq".concurrency_holds h
    WHERE h.concurrency_key OPERATOR(pg_catalog.=) OLD.concurrency_key
      AND h.job_id OPERATOR(pg_catalog.=) OLD.job_id;
    RETURN NULL;
END
$$;

CREATE FUNCTION trioq.db_now() RETURNS timestamp with time zone
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN pg_catalog.current_setting('trioq.fake_now', true) OPERATOR(pg_catalog.<>) ''
                THEN pg_catalog.current_setting('trioq.fake_now', true)::pg_catalog.timestamptz
                ELSE pg_catalog.now() END
$$;

CREATE FUNCTION trioq.deadline_error(deadline_at timestamp with time zone, deadline_source text) RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT pg_catalog.jsonb_build_object(
        'type', 'DeadlineExceeded',
        'message', 'deadline passed at '
                   OPERATOR(pg_catalog.||)
                   pg_catalog.to_char(deadline_at AT TIME ZONE 'UTC',
                                      'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
                   OPERATOR(pg_catalog.||) ' ('
                   OPERATOR(pg_catalog.||) coalesce(deadline_source, 'set at enqueue')
                   OPERATOR(pg_catalog.||) ')');
$$;

CREATE FUNCTION trioq.dedup_key_refuse(key text, task text, holder_id bigint, holder_task text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RAISE EXCEPTION '%', format('dedup_key %L is held by job %s of task %L, not %L: dedup keys '
                                'are global across tasks and queues (put the task in the key)',
                                key, holder_id, holder_task, task)
        USING ERRCODE = '23505', CONSTRAINT = 'dedup_key_held_by_another_task';
END
$$;

CREATE FUNCTION trioq.enqueue(task text, payload jsonb DEFAULT 'null'::jsonb, queue text DEFAULT 'default'::text, run_at timestamp with time zone DEFAULT NULL::timestamp with time zone, priority smallint DEFAULT 0, partition_key text DEFAULT NULL::text, dedup_key text DEFAULT NULL::text, max_attempts integer DEFAULT NULL::integer, unique_for interval DEFAULT NULL::interval, unique_states text[] DEFAULT NULL::text[], traceparent text DEFAULT NULL::text, deadline timestamp with time zone DEFAULT NULL::timestamp with time zone, concurrency_key text DEFAULT NULL::text, concurrency_limit integer DEFAULT NULL::integer) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
#variable_conflict use_column
DECLARE
    job_id bigint;
    due    timestamptz := coalesce(enqueue.run_at, "trioq".db_now());
    held   text[] := CASE WHEN enqueue.dedup_key IS NULL THEN '{}'
                          WHEN enqueue.unique_states IS NOT NULL
                              THEN ARRAY(SELECT s FROM unnest(enqueue.unique_states) AS s
                                         WHERE s IN ('completed', 'failed', 'cancelled'))
                          WHEN enqueue.unique_for IS NOT NULL THEN ARRAY['completed']
                          ELSE '{}' END;
    job_deadline        timestamptz := enqueue.deadline;
    job_deadline_source text := CASE WHEN enqueue.deadline IS NOT NULL THEN 'set at enqueue' END;
    holder_task text;
    new_id      bigint := nextval('"trioq".jobs_id_seq');
    released    bigint;
BEGIN
    PERFORM "trioq".payload_check(enqueue.payload, '$');
    -- The W3C form (version-traceid-parentid-flags, lower-case hex): anything else would only
    -- be dropped, unlinked, by the worker's propagator much later.
    IF enqueue.traceparent IS NOT NULL
       AND enqueue.traceparent !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN
        RAISE EXCEPTION 'traceparent: % is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)',
            enqueue.traceparent USING ERRCODE = '22023';
    END IF;
    IF enqueue.deadline IS NOT NULL AND enqueue.deadline <= "trioq".db_now() THEN
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
        SELECT "trioq".db_now() + d.deadline_seconds * interval '1 second',
               'set by task ' || d.task
        INTO job_deadline, job_deadline_source
        FROM "trioq".task_defaults d
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
        FROM "trioq".job_keys k
        JOIN "trioq".job_outcomes o ON o.job_id = k.job_id
        JOIN "trioq".job_rows h ON h.id = k.job_id
        WHERE k.key = enqueue.dedup_key
          AND "trioq".job_key_released(o.state, h.unique_states, h.unique_until)
        FOR SHARE OF o;
        INSERT INTO "trioq".job_keys AS k (key, job_id, task)
        VALUES (enqueue.dedup_key, new_id, enqueue.task)
        ON CONFLICT (key) DO UPDATE
        SET job_id = CASE WHEN k.job_id = released THEN excluded.job_id ELSE k.job_id END,
            task = CASE WHEN k.job_id = released THEN excluded.task ELSE k.task END
        RETURNING k.job_id, k.task INTO job_id, holder_task;
        -- A key held by a job of another task: refused, not that job (docs/uniqueness.md).
        IF holder_task <> enqueue.task THEN
            PERFORM "trioq".dedup_key_refuse(enqueue.dedup_key, enqueue.task, job_id,
                                              holder_task);
        END IF;
    END IF;
    -- A job due later is `scheduled` (migration 0002's state model), promoted when due.
    IF job_id IS NULL OR job_id = new_id THEN
        -- Its row (queries.sql keeps every writer's rows beside the one insert).
        WITH new_jobs AS (

-- The row of the SQL function enqueue() (functions/enqueue.sql includes it), from its arguments
-- and variables: here beside job_insert and the other writers' rows, so that a column added to
-- jobs is given by every writer in this one file. Only a function body can run it.
    SELECT new_id AS id, enqueue.queue AS queue, enqueue.task AS task,
           enqueue.payload AS payload, enqueue.priority AS priority, "trioq".db_now() AS now,
           due AS due_at, enqueue.partition_key AS partition_key,
           enqueue.dedup_key AS dedup_key, enqueue.max_attempts AS max_attempts,
           held AS unique_states,
           CASE WHEN enqueue.dedup_key IS NOT NULL
                THEN "trioq".db_now() + enqueue.unique_for END AS unique_until,
           1 AS version, enqueue.traceparent AS trace_context,
           enqueue.concurrency_key AS concurrency_key,
           enqueue.concurrency_limit AS concurrency_limit, job_deadline AS deadline_at,
           NULL::float8 AS deadline, job_deadline_source AS deadline_source,
           NULL::float8 AS task_seconds, NULL::bigint AS parent_id,
           NULL::int AS parent_position, NULL::text AS on_parent_cancel

        )

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
INSERT INTO "trioq".job_rows AS j (id, queue, task, payload, phase, priority, run_at,
                                   partition_key, dedup_key, max_attempts, created_at,
                                   unique_states, unique_until, version, trace_context,
                                   concurrency_key, concurrency_limit, deadline_at,
                                   deadline_source, parent_id, parent_position,
                                   on_parent_cancel)
SELECT coalesce(n.id, nextval('"trioq".jobs_id_seq')), n.queue, n.task, n.payload,
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

        ;
        job_id := new_id;
    END IF;
    -- Also for a job due later: the queue's idle workers wake, read its due time and set
    -- their timers to it, as they do for the Python statements' delayed jobs.
    PERFORM pg_notify("trioq".ready_channel(enqueue.queue), enqueue.queue);
    RETURN job_id;
END
$_$;

CREATE FUNCTION trioq.event_emit(event_key text, event_payload jsonb) RETURNS TABLE(emitted_first boolean, woken_count bigint)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    won boolean;
    wake_count bigint;
    woken_ids bigint[];
    stored jsonb;
BEGIN
    PERFORM "trioq".payload_check(event_payload, 'payload');
    INSERT INTO "trioq".events AS e (key, payload, emitted_at, created_at)
    VALUES (event_key, event_payload, "trioq".db_now(), "trioq".db_now())
    ON CONFLICT (key) DO UPDATE
        SET payload = excluded.payload, emitted_at = excluded.emitted_at
        WHERE e.emitted_at IS NULL
    RETURNING true INTO won;
    -- ON CONFLICT DO UPDATE locks the conflicting row even when its WHERE is false; this
    -- statement sees the newest version (ours, or the first emitter's).
    SELECT e.payload INTO stored FROM "trioq".events e WHERE e.key = event_key;
    -- Wake the waiters and resolve their pending wait in the same statement: the payload
    -- becomes their checkpoint, so the woken handler resumes without another statement.
    WITH woken AS (
        UPDATE "trioq".job_rows j
        SET phase = 'ready', filed = j.filed + 1, run_at = "trioq".db_now(),
            wait_event_key = NULL
        WHERE j.wait_event_key = event_key AND j.phase = 'waiting'
        RETURNING j.id, j.queue
    ),
    resolved AS (
        UPDATE "trioq".checkpoints c
        SET value = jsonb_build_object('payload', stored)
        FROM woken w
        WHERE c.job_id = w.id AND c.kind = 'event' AND c.name = event_key
          AND c.value ? 'deadline'
        RETURNING c.job_id
    ),
    notified AS (
        SELECT count(pg_notify("trioq".ready_channel(q.queue), q.queue)) AS n
        FROM (SELECT DISTINCT queue FROM woken) AS q
    )
    SELECT (SELECT count(*) FROM woken), ARRAY(SELECT id FROM woken) INTO wake_count, woken_ids
    FROM notified CROSS JOIN (SELECT count(*) FROM resolved) AS side_effects;
    -- The woken leave job_due (migration 0050), in a statement of its own: its fresh snapshot
    -- sees every copy filed before the wake statement locked the records.
    DELETE FROM "trioq".job_due d WHERE d.job_id = ANY(woken_ids);
    RETURN QUERY SELECT coalesce(won, false), wake_count;
END
$$;

CREATE FUNCTION trioq.job_cancel_children(p_job_id bigint, p_job_attempt integer, p_job_lease_token uuid, p_checkpoint_position integer, p_checkpoint_kind text, p_checkpoint_name text, p_checkpoint_value jsonb, p_child_ids bigint[], p_control_channel text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    -- The fence is the run (migration 0047), locked first, then the row written.
    PERFORM 1 FROM "trioq".job_runs u
    WHERE u.job_id = p_job_id AND u.attempt = p_job_attempt
      AND u.lease_token = p_job_lease_token
    FOR SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE "trioq".job_rows j
    SET checkpoint_count = greatest(j.checkpoint_count, p_checkpoint_position + 1)
    WHERE j.id = p_job_id;
    INSERT INTO "trioq".checkpoints (job_id, position, kind, name, value, created_at)
    VALUES (p_job_id, p_checkpoint_position, p_checkpoint_kind, p_checkpoint_name, p_checkpoint_value,
            "trioq".db_now())
    ON CONFLICT ON CONSTRAINT checkpoints_pkey DO NOTHING;
    PERFORM 1 FROM "trioq".job_cancel_tree(
        ARRAY(SELECT c.id FROM "trioq".job_rows c
              WHERE c.id = ANY(p_child_ids) AND c.parent_id = p_job_id),
        p_control_channel);
    RETURN true;
END
$$;

CREATE FUNCTION trioq.job_cancel_tree(root_ids bigint[], control_channel text) RETURNS TABLE(id bigint, previous_state text, state text)
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT * FROM "trioq".job_cancel_tree(root_ids, control_channel, false);
$$;

CREATE FUNCTION trioq.job_cancel_tree(root_ids bigint[], control_channel text, whole_tree boolean) RETURNS TABLE(id bigint, previous_state text, state text)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    tree_ids bigint[];
    plan_ids bigint[];
    plan_parents bigint[];
    plan_old text[];
    plan_new text[];
    plan_kept boolean[];
    changed_ids bigint[];
    sent bigint;
BEGIN
    WITH RECURSIVE tree AS (
        SELECT j.id, false AS kept FROM "trioq".job_rows j WHERE j.id = ANY(root_ids)
        UNION
        SELECT c.id, (NOT whole_tree AND c.on_parent_cancel = 'wait')
        FROM "trioq".job_rows c JOIN tree t ON c.parent_id = t.id
        WHERE NOT t.kept AND (whole_tree OR c.on_parent_cancel <> 'abandon')
    )
    SELECT array_agg(tree.id) INTO tree_ids FROM tree;
    PERFORM 1 FROM "trioq".job_rows j WHERE j.id = ANY(tree_ids) ORDER BY j.id
    FOR NO KEY UPDATE;
    -- A new statement: its snapshot sees the newest version of every row locked above, and the
    -- runs as they are now (migration 0047): while a row is held no claim can start its job,
    -- so a job seen not running stays so, and one seen running can only end (its settle then
    -- reads the flag set here).
    WITH RECURSIVE nodes AS (
        SELECT j.id, j.parent_id,

-- A job's state (docs/state-machine.md) from its record `j`, its run `u` (LEFT JOIN
-- "trioq".job_runs u ON u.job_id = j.id) and its outcome `o` (LEFT JOIN "trioq".job_outcomes
-- o ON o.job_id = j.id): the outcome's once it has one, running while it has a run, else the
-- record's phase (migrations 0047, 0049; the `jobs` view spells out the same rule). `claimed`
-- never shows: a claimed record always has its run or its outcome, and `done` always has its
-- outcome.
CASE WHEN o.job_id IS NOT NULL THEN o.state WHEN u.job_id IS NOT NULL THEN 'running'
     ELSE j.phase END

               AS state, ARRAY[j.id] AS path, false AS kept
        FROM "trioq".job_rows j LEFT JOIN "trioq".job_runs u ON u.job_id = j.id
        LEFT JOIN "trioq".job_outcomes o ON o.job_id = j.id
        WHERE j.id = ANY(root_ids)
        UNION ALL
        SELECT j.id, j.parent_id,

-- A job's state (docs/state-machine.md) from its record `j`, its run `u` (LEFT JOIN
-- "trioq".job_runs u ON u.job_id = j.id) and its outcome `o` (LEFT JOIN "trioq".job_outcomes
-- o ON o.job_id = j.id): the outcome's once it has one, running while it has a run, else the
-- record's phase (migrations 0047, 0049; the `jobs` view spells out the same rule). `claimed`
-- never shows: a claimed record always has its run or its outcome, and `done` always has its
-- outcome.
CASE WHEN o.job_id IS NOT NULL THEN o.state WHEN u.job_id IS NOT NULL THEN 'running'
     ELSE j.phase END

               AS state, n.path || j.id, (NOT whole_tree AND j.on_parent_cancel = 'wait')
        FROM "trioq".job_rows j JOIN nodes n ON j.parent_id = n.id
        LEFT JOIN "trioq".job_runs u ON u.job_id = j.id
        LEFT JOIN "trioq".job_outcomes o ON o.job_id = j.id
        WHERE NOT n.kept AND (whole_tree OR j.on_parent_cancel <> 'abandon')
    ),
    blocked AS (
        SELECT DISTINCT unnest(n.path[1:cardinality(n.path) - 1]) AS id
        FROM nodes n
        WHERE n.state = 'running'
           OR (n.kept AND n.state NOT IN ('completed', 'failed', 'cancelled'))
    ),
    plan AS (
        SELECT DISTINCT ON (n.id) n.id, n.parent_id, n.state AS old_state,
               CASE WHEN n.kept OR n.state IN ('completed', 'failed', 'cancelled', 'running')
                      THEN n.state
                    WHEN n.id IN (SELECT b.id FROM blocked b) THEN 'waiting'
                    WHEN n.state IN ('sleeping', 'waiting') THEN 'ready'
                    ELSE 'cancelled' END AS new_state,
               n.kept
        FROM nodes n
    )
    SELECT array_agg(p.id), array_agg(p.parent_id), array_agg(p.old_state),
           array_agg(p.new_state), array_agg(p.kept)
    INTO plan_ids, plan_parents, plan_old, plan_new, plan_kept
    FROM plan p;
    WITH plan AS (
        SELECT * FROM unnest(plan_ids, plan_parents, plan_old, plan_new, plan_kept)
                 AS t(id, parent_id, old_state, new_state, kept)
    ),
    changed AS (
        UPDATE "trioq".job_rows j
        SET cancel_requested = true,
            -- A running job's row keeps its phase: its worker ends the run. A job cancelled
            -- here is `done`, its outcome appended below (migration 0049).
            phase = CASE WHEN p.new_state = 'running' THEN j.phase
                         WHEN p.new_state = 'cancelled' THEN 'done' ELSE p.new_state END,
            filed = j.filed + CASE WHEN p.new_state = 'ready' THEN 1 ELSE 0 END,
            run_at = CASE WHEN p.new_state = 'waiting' THEN NULL
                          WHEN p.new_state = 'ready' THEN "trioq".db_now()
                          ELSE j.run_at END,
            wait_event_key = NULL,
            wait_topic = NULL,
            wait_position = NULL,
            wait_children = CASE WHEN p.new_state = 'waiting' THEN
                                ARRAY(SELECT c.id FROM plan c
                                      WHERE c.parent_id = p.id
                                        AND c.new_state NOT IN ('completed', 'failed',
                                                                'cancelled'))
                                 WHEN p.new_state = 'ready' THEN NULL
                            ELSE j.wait_children END
        FROM plan p
        WHERE j.id = p.id AND NOT p.kept
          AND p.old_state NOT IN ('completed', 'failed', 'cancelled')
        RETURNING j.id, p.new_state AS state, j.queue, j.attempt, j.executions, j.worker_id,
                  j.started_at, j.error
    ),
    ended AS (
        INSERT INTO "trioq".job_outcomes (job_id, state, error, attempt, executions,
                                           worker_id, started_at, finished_at, queue)
        SELECT c.id, 'cancelled', c.error, c.attempt, c.executions, c.worker_id, c.started_at,
               "trioq".db_now(), c.queue
        FROM changed c WHERE c.state = 'cancelled'
        RETURNING job_id
    ),
    woken AS (
        SELECT count(pg_notify("trioq".ready_channel(q.queue), q.queue)) AS n
        FROM (SELECT DISTINCT c.queue FROM changed c WHERE c.state = 'ready') AS q
    ),
    unlocked AS (
        DELETE FROM "trioq".partition_locks l USING changed c
        WHERE c.state = 'cancelled' AND l.job_id = c.id
        RETURNING l.job_id
    ),
    notified AS (
        SELECT count(pg_notify(CASE WHEN c.state = 'running' THEN control_channel
                                    ELSE "trioq".result_channel(c.id) END,
                               c.id::text)) AS n
        FROM changed c WHERE c.state IN ('running', 'cancelled')
    )
    SELECT n.n + (SELECT count(*) FROM unlocked) + (SELECT w.n FROM woken w)
           + (SELECT count(*) FROM ended), ARRAY(SELECT c.id FROM changed c) INTO sent, changed_ids
    FROM notified n;
    -- job_due follows the records written above (migration 0050: no trigger writes it): a
    -- suspended job woken or cancelled leaves it, a parent left waiting for a running child
    -- (its wait's timeout gone) has its copy rewritten. Statements of their own, so their
    -- snapshots see every copy filed before the tree's locks were taken.
    DELETE FROM "trioq".job_due d USING "trioq".job_rows j
    WHERE d.job_id = ANY(changed_ids) AND j.id = d.job_id
      AND j.phase <> ALL ('{scheduled,sleeping,waiting}'::text[]);
    INSERT INTO "trioq".job_due AS d (job_id, queue, state, run_at)
    SELECT j.id, j.queue, j.phase, j.run_at FROM "trioq".job_rows j
    WHERE j.id = ANY(changed_ids) AND j.phase = ANY ('{scheduled,sleeping,waiting}'::text[])
    ON CONFLICT (job_id) DO UPDATE SET state = excluded.state, run_at = excluded.run_at
    WHERE (d.state, d.run_at) IS DISTINCT FROM (excluded.state, excluded.run_at);
    PERFORM "trioq".parents_notify(root_ids);
    RETURN QUERY
        SELECT t.id, t.old_state, t.new_state
        FROM unnest(plan_ids, plan_old, plan_new) AS t(id, old_state, new_state)
        WHERE t.id = ANY(root_ids);
END
$$;

CREATE FUNCTION trioq.job_deadline_pass(max_jobs integer, control_channel text) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    passed bigint[];
BEGIN
    -- A job finished on the fast path keeps its record's phase (`ready` or `claimed`) under its
    -- outcome (migration 0049), so it stays in jobs_deadline_idx until its deadline passes:
    -- then it is written `done` here, lazily, off the completion's path, and leaves the index.
    UPDATE "trioq".job_rows j SET phase = 'done'
    WHERE j.id = ANY(ARRAY(
        SELECT f.id FROM "trioq".job_rows f
        WHERE f.deadline_at IS NOT NULL AND NOT f.cancel_requested
          AND f.phase IN ('ready', 'claimed')
          AND f.deadline_at <= "trioq".db_now()
          AND EXISTS (SELECT 1 FROM "trioq".job_outcomes o WHERE o.job_id = f.id)
        ORDER BY f.deadline_at
        LIMIT max_jobs
        FOR NO KEY UPDATE OF f SKIP LOCKED));
    SELECT array_agg(p.id) INTO passed FROM (
        SELECT j.id FROM "trioq".job_rows j
        WHERE j.deadline_at IS NOT NULL AND NOT j.cancel_requested
          AND j.phase <> 'done'
          AND j.deadline_at <= "trioq".db_now()
          -- A lost lease is the recovery's (the same maintenance statement): next pass.
          AND NOT EXISTS (SELECT 1 FROM "trioq".job_runs u
                          WHERE u.job_id = j.id AND u.lease_expires_at < "trioq".db_now())
          AND NOT EXISTS (SELECT 1 FROM "trioq".job_outcomes o WHERE o.job_id = j.id)
        ORDER BY j.deadline_at
        LIMIT max_jobs
        FOR NO KEY UPDATE OF j SKIP LOCKED) AS p;
    IF passed IS NULL THEN
        RETURN 0;
    END IF;
    -- The reason first: a job cancelled at once by the tree cancel keeps this error.
    UPDATE "trioq".job_rows j SET error = "trioq".deadline_error(j.deadline_at, j.deadline_source)
    WHERE j.id = ANY(passed);
    PERFORM 1 FROM "trioq".job_cancel_tree(passed, control_channel, false);
    RETURN cardinality(passed);
END
$$;

CREATE FUNCTION trioq.job_due_leave(ids bigint[]) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    left_count bigint;
BEGIN
    DELETE FROM "trioq".job_due d WHERE d.job_id OPERATOR(pg_catalog.=) ANY(ids);
    GET DIAGNOSTICS left_count = ROW_COUNT;
    RETURN left_count;
END
$$;

CREATE FUNCTION trioq.job_key_released(state text, unique_states text[], unique_until timestamp with time zone) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT NOT (state OPERATOR(pg_catalog.=) ANY(unique_states)
                AND (unique_until IS NULL
                     OR unique_until OPERATOR(pg_catalog.>) "trioq".db_now()))
$$;

CREATE FUNCTION trioq.job_keys_delete_of_jobs() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    DELETE FROM "trioq".job_keys k USING deleted_jobs d
    WHERE d.dedup_key IS NOT NULL AND k.key = d.dedup_key AND k.job_id = d.id;
    RETURN NULL;
END
$$;

CREATE FUNCTION trioq.job_receive(p_job_id bigint, p_attempt integer, p_lease_token uuid, p_position integer, p_topic text, p_timeout_seconds double precision, p_deadline timestamp with time zone, p_limit integer, p_value_keys text[], p_value_values jsonb[]) RETURNS TABLE(state text, messages jsonb, deadline timestamp with time zone)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    due timestamptz := coalesce(p_deadline,
                                "trioq".db_now() + p_timeout_seconds * interval '1 second');
    stored jsonb;
    taken jsonb;
    taken_count bigint;
    run "trioq".job_runs;
BEGIN
    -- The fence is the run (migration 0047), locked first, then the row written; a suspension
    -- deletes it.
    SELECT * INTO run FROM "trioq".job_runs u
    WHERE u.job_id = p_job_id AND u.attempt = p_attempt AND u.lease_token = p_lease_token
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'lost'::text, NULL::jsonb, due;
        RETURN;
    END IF;
    UPDATE "trioq".job_rows j
    SET checkpoint_count = greatest(j.checkpoint_count, p_position + 1)
    WHERE j.id = p_job_id;
    IF cardinality(p_value_keys) > 0 THEN
        INSERT INTO "trioq".workflow_values AS v (job_id, key, value, updated_at)
        SELECT p_job_id, t.key, t.value, "trioq".db_now()
        FROM unnest(p_value_keys, p_value_values) AS t(key, value)
        ON CONFLICT (job_id, key) DO UPDATE SET value = excluded.value,
                                                updated_at = excluded.updated_at;
        PERFORM pg_notify("trioq".result_channel(p_job_id), p_job_id::text);
    END IF;
    SELECT c.value INTO stored FROM "trioq".checkpoints c
    WHERE c.job_id = p_job_id AND c.position = p_position;
    IF stored ? 'messages' THEN
        RETURN QUERY SELECT 'received'::text, stored -> 'messages', due;
        RETURN;
    END IF;
    WITH gone AS (
        DELETE FROM "trioq".messages m
        WHERE m.id IN (SELECT q.id FROM "trioq".messages q
                       WHERE q.job_id = p_job_id AND q.topic = p_topic
                       ORDER BY q.id LIMIT p_limit)
        RETURNING m.id, m.payload
    )
    SELECT coalesce(jsonb_agg(g.payload ORDER BY g.id), '[]'::jsonb), count(*)
    INTO taken, taken_count FROM gone g;
    IF taken_count > 0 OR due <= "trioq".db_now() THEN
        INSERT INTO "trioq".checkpoints AS c (job_id, position, kind, name, value, created_at)
        VALUES (p_job_id, p_position, 'receive', p_topic, jsonb_build_object('messages', taken),
                "trioq".db_now())
        ON CONFLICT (job_id, position) DO UPDATE SET value = excluded.value;
        UPDATE "trioq".job_rows j SET wait_topic = NULL, wait_position = NULL
        WHERE j.id = p_job_id AND (j.wait_topic IS NOT NULL OR j.wait_position IS NOT NULL);
        RETURN QUERY SELECT CASE WHEN taken_count > 0 THEN 'received' ELSE 'timeout' END,
                            taken, due;
        RETURN;
    END IF;
    INSERT INTO "trioq".checkpoints AS c (job_id, position, kind, name, value, created_at)
    VALUES (p_job_id, p_position, 'receive', p_topic, jsonb_build_object('deadline', due),
            "trioq".db_now())
    ON CONFLICT (job_id, position) DO NOTHING;
    DELETE FROM "trioq".job_runs u WHERE u.job_id = p_job_id;
    UPDATE "trioq".job_rows j
    SET phase = 'waiting', run_at = due, executions = run.executions,
        worker_id = run.worker_id, started_at = run.started_at, wait_topic = p_topic,
        wait_position = p_position, wait_event_key = NULL, wait_children = NULL
    WHERE j.id = p_job_id;
    -- Filed in job_due by this writer (migration 0050): the running record had no copy.
    INSERT INTO "trioq".job_due (job_id, queue, state, run_at)
    SELECT j.id, j.queue, j.phase, j.run_at FROM "trioq".job_rows j WHERE j.id = p_job_id;
    RETURN QUERY SELECT 'waiting'::text, '[]'::jsonb, due;
END
$$;

CREATE FUNCTION trioq.job_runs_finish(ids bigint[], attempts integer[], lease_tokens uuid[]) RETURNS TABLE(run_job_id bigint, run_attempt integer, run_executions integer, run_worker_id uuid, run_traced boolean, run_started_at timestamp with time zone, run_result_watched boolean, run_queue text)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    -- The fenced one's DELETE, without its token column (one body for both).
    RETURN QUERY
    SELECT f.run_job_id, f.run_attempt, f.run_executions, f.run_worker_id, f.run_traced,
           f.run_started_at, f.run_result_watched, f.run_queue
    FROM "trioq".job_runs_finish_fenced(ids, attempts, lease_tokens) AS f;
END
$$;

CREATE FUNCTION trioq.job_runs_finish_fenced(ids bigint[], attempts integer[], lease_tokens uuid[]) RETURNS TABLE(run_job_id bigint, run_attempt integer, run_executions integer, run_worker_id uuid, run_traced boolean, run_started_at timestamp with time zone, run_result_watched boolean, run_queue text, run_lease_token uuid)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
BEGIN
    RETURN QUERY
    DELETE FROM "trioq".job_runs u
    USING unnest(ids, attempts, lease_tokens) AS i(id, attempt, lease_token)
    WHERE u.job_id OPERATOR(pg_catalog.=) i.id
      AND u.attempt OPERATOR(pg_catalog.=) i.attempt
      AND u.lease_token OPERATOR(pg_catalog.=) i.lease_token
      AND u.job_id OPERATOR(pg_catalog.=) ANY(ids)
    RETURNING u.job_id, u.attempt, u.executions, u.worker_id, u.traced, u.started_at,
              u.result_watched, u.queue, u.lease_token;
END
$$;

CREATE FUNCTION trioq.job_runs_settle(ids bigint[], attempts integer[], lease_tokens uuid[], states text[]) RETURNS TABLE(run_job_id bigint, run_attempt integer, run_executions integer, run_worker_id uuid, run_traced boolean, run_started_at timestamp with time zone, run_result_watched boolean)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    -- The fenced one's DELETE, without its token column (one body for both).
    RETURN QUERY
    SELECT f.run_job_id, f.run_attempt, f.run_executions, f.run_worker_id, f.run_traced,
           f.run_started_at, f.run_result_watched
    FROM "trioq".job_runs_settle_fenced(ids, attempts, lease_tokens, states) AS f;
END
$$;

CREATE FUNCTION trioq.job_runs_settle_fenced(ids bigint[], attempts integer[], lease_tokens uuid[], states text[]) RETURNS TABLE(run_job_id bigint, run_attempt integer, run_executions integer, run_worker_id uuid, run_traced boolean, run_started_at timestamp with time zone, run_result_watched boolean, run_lease_token uuid)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
BEGIN
    RETURN QUERY
    DELETE FROM "trioq".job_runs u
    USING unnest(ids, attempts, lease_tokens, states) AS i(id, attempt, lease_token, state)
    WHERE u.job_id OPERATOR(pg_catalog.=) i.id
      AND u.attempt OPERATOR(pg_catalog.=) i.attempt
      AND u.lease_token OPERATOR(pg_catalog.=) i.lease_token
      AND u.job_id OPERATOR(pg_catalog.=) ANY(ids)
      AND (i.state OPERATOR(pg_catalog.<>) 'cancelled'
           OR EXISTS (SELECT 1 FROM "trioq".job_rows c
                      WHERE c.id OPERATOR(pg_catalog.=) u.job_id AND c.cancel_requested))
    RETURNING u.job_id, u.attempt, u.executions, u.worker_id, u.traced, u.started_at,
              u.result_watched, u.lease_token;
END
$$;

CREATE FUNCTION trioq.jobs_live_file() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.phase OPERATOR(pg_catalog.=) ANY ('{scheduled,sleeping,waiting}'::pg_catalog.text[])
    THEN
        IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' OR OLD.phase OPERATOR(pg_catalog.<>) ALL
           ('{scheduled,sleeping,waiting}'::pg_catalog.text[]) THEN
            -- A row entering the due states has no copy (it left with the row's last due
            -- state; migration 0045 copies a row only while it is due, under its lock), so a
            -- plain insert: with ON CONFLICT, 20,000 rows turning sleeping in one UPDATE
            -- cost 17.4 us a row against 15.2 (3.8 with no trigger; bench/RESULTS.md,
            -- "job_due").
            INSERT INTO "trioq".job_due (job_id, queue, state, run_at)
            VALUES (NEW.id, NEW.queue, NEW.phase, NEW.run_at);
        ELSE
            INSERT INTO "trioq".job_due (job_id, queue, state, run_at)
            VALUES (NEW.id, NEW.queue, NEW.phase, NEW.run_at)
            ON CONFLICT (job_id) DO UPDATE SET state = excluded.state, run_at = excluded.run_at;
        END IF;
        RETURN NULL;
    END IF;
    -- An UPDATE from here on: job_due_filed_insert calls this only for due rows.
    IF OLD.phase OPERATOR(pg_catalog.=) ANY ('{scheduled,sleeping,waiting}'::pg_catalog.text[])
    THEN
        DELETE FROM "trioq".job_due d WHERE d.job_id OPERATOR(pg_catalog.=) OLD.id;
    END IF;
    -- `filed` (migration 0047): a run of a job claimed from the ring (its row read ready
    -- throughout) that ends in ready again bumps it; the entry carries it for the claim's
    -- recheck.
    IF NEW.phase OPERATOR(pg_catalog.=) 'ready'
       AND (OLD.phase OPERATOR(pg_catalog.<>) 'ready'
            OR OLD.filed OPERATOR(pg_catalog.<>) NEW.filed)
       AND NEW.partition_key IS NULL AND NEW.concurrency_key IS NULL THEN
        INSERT INTO "trioq".ready_ring (slot, queue, task, version, priority, run_at, id,
                                         filed)
        VALUES (coalesce((SELECT s.base FROM "trioq".ready_ring_state s), 0::smallint)
                OPERATOR(pg_catalog.+) "trioq".ready_slot(pg_catalog.now()), NEW.queue,
                NEW.task, NEW.version, NEW.priority, NEW.run_at, NEW.id, NEW.filed);
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION trioq.jobs_live_left() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    DELETE FROM "trioq".job_due d WHERE d.job_id OPERATOR(pg_catalog.=) OLD.id;
    RETURN NULL;
END
$$;

CREATE FUNCTION trioq.leader_elect(candidate uuid, runs_scheduler boolean, ttl_seconds double precision) RETURNS boolean
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    INSERT INTO "trioq".leader AS l (seat, leader_id, scheduler, elected_at, expires_at)
    VALUES (1, candidate, runs_scheduler, "trioq".db_now(),
            "trioq".db_now() + ttl_seconds * interval '1 second')
    ON CONFLICT (seat) DO UPDATE
    SET leader_id = excluded.leader_id,
        scheduler = excluded.scheduler,
        elected_at = CASE WHEN l.leader_id = excluded.leader_id THEN l.elected_at
                          ELSE excluded.elected_at END,
        expires_at = excluded.expires_at
    WHERE l.leader_id = excluded.leader_id
       OR l.expires_at < "trioq".db_now()
       OR (excluded.scheduler AND NOT l.scheduler)
    RETURNING true
$$;

CREATE FUNCTION trioq.parents_notify(child_ids bigint[], skip_ids bigint[] DEFAULT '{}'::bigint[]) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    wake_count bigint;
    woken_ids bigint[];
BEGIN
    WITH finished AS (
        SELECT c.parent_id, array_agg(c.id) AS ids,
               coalesce(array_agg(c.id) FILTER (WHERE o.state <> 'completed'), '{}') AS failed
        -- A finished child is one with an outcome (migration 0049).
        FROM "trioq".job_rows c JOIN "trioq".job_outcomes o ON o.job_id = c.id
        WHERE c.id = ANY(child_ids) AND c.parent_id IS NOT NULL
        GROUP BY c.parent_id
    ),
    locked AS MATERIALIZED (
        SELECT p.id, p.filed FROM "trioq".job_rows p JOIN finished f ON f.parent_id = p.id
        WHERE p.id <> ALL(skip_ids)
        ORDER BY p.id
        FOR NO KEY UPDATE OF p
    ),
    woken AS (
        UPDATE "trioq".job_rows p
        SET children_settled = p.children_settled + cardinality(f.ids),
            wait_children = CASE WHEN p.phase = 'waiting' AND p.wait_children && f.ids
                                 THEN ARRAY(SELECT unnest(p.wait_children)
                                            EXCEPT SELECT unnest(f.ids))
                                 ELSE p.wait_children END,
            filed = p.filed + CASE WHEN p.phase = 'waiting' AND p.wait_children && f.ids
                                        AND (p.wait_children <@ f.ids
                                             OR p.wait_children && f.failed)
                                   THEN 1 ELSE 0 END,
            phase = CASE WHEN p.phase = 'waiting' AND p.wait_children && f.ids
                              AND (p.wait_children <@ f.ids OR p.wait_children && f.failed)
                         THEN 'ready' ELSE p.phase END,
            run_at = CASE WHEN p.phase = 'waiting' AND p.wait_children && f.ids
                               AND (p.wait_children <@ f.ids OR p.wait_children && f.failed)
                          THEN "trioq".db_now() ELSE p.run_at END
        FROM finished f JOIN locked l ON l.id = f.parent_id
        WHERE p.id = f.parent_id
        -- `woken`: moved into ready here (a parent that runs reads ready too).
        RETURNING p.id, p.queue, CASE WHEN p.filed > l.filed THEN 'ready' END AS state
    ),
    notified AS (
        SELECT count(pg_notify("trioq".ready_channel(q.queue), q.queue)) AS n
        FROM (SELECT DISTINCT queue FROM woken WHERE state = 'ready') AS q
    )
    SELECT (SELECT count(*) FROM woken WHERE state = 'ready'),
           ARRAY(SELECT id FROM woken WHERE state = 'ready')
    INTO wake_count, woken_ids FROM notified;
    -- The woken leave job_due (migration 0050), in a statement of its own: its fresh snapshot
    -- sees every copy filed before the parents' locks were taken.
    IF wake_count > 0 THEN
        DELETE FROM "trioq".job_due d WHERE d.job_id = ANY(woken_ids);
    END IF;
    RETURN wake_count;
END
$$;

CREATE FUNCTION trioq.payload_check(value jsonb, root text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    rendered text;
    outside_strings text;
    compact bigint;
BEGIN
    IF jsonb_path_exists(value, 'strict $.**{65}') THEN
        RAISE EXCEPTION 'payload %: nested deeper than 64 levels', root
            USING ERRCODE = '22023';
    END IF;
    rendered := value::text;
    IF octet_length(rendered) <= 1000000 THEN
        RETURN;
    END IF;
    outside_strings := regexp_replace(rendered, '"([^"\\]|\\.)*"', '', 'g');
    compact := octet_length(rendered)
               - (length(outside_strings) - length(replace(outside_strings, ' ', '')));
    IF compact > 1000000 THEN
        RAISE EXCEPTION 'payload %: encodes to % bytes, more than the limit of 1000000',
            root, compact USING ERRCODE = '22023';
    END IF;
END
$_$;

CREATE FUNCTION trioq.queue_demand() RETURNS TABLE(queue text, ready bigint, oldest_ready_seconds double precision, running bigint, scheduled bigint, sleeping bigint, waiting bigint, due_now bigint)
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT j.queue,
           count(*) FILTER (WHERE j.state = 'ready' AND j.run_at <= t.now),
           extract(epoch FROM t.now - min(j.run_at) FILTER (
               WHERE j.state = 'ready' AND j.run_at <= t.now))::float8,
           count(*) FILTER (WHERE j.state = 'running'),
           count(*) FILTER (WHERE j.state = 'scheduled'
                               OR (j.state = 'ready' AND j.run_at > t.now)),
           count(*) FILTER (WHERE j.state = 'sleeping'),
           count(*) FILTER (WHERE j.state = 'waiting'),
           count(*) FILTER (WHERE j.run_at <= t.now
                              AND j.state IN ('ready', 'scheduled', 'sleeping', 'waiting'))
    FROM (SELECT DISTINCT ON (r.id) r.queue, r.run_at, 'ready' AS state
          FROM "trioq".ready_ring r
          JOIN "trioq".job_rows j ON j.id = r.id AND j.phase = 'ready' AND j.filed = r.filed
          WHERE r.slot >=

-- The ready ring's lowest slot that readers read (migration 0041: a bank the ring has left,
-- while a `pg_dump` holds it, lies below); a state emptied by hand (a test suite truncating
-- every table) reads as 0, the first bank, as ready_ring_file() files there. Read once per
-- statement by this sub-select (an InitPlan), which prunes the slots below as the statement
-- runs: their scans are never executed. Written into each statement, not called: a call of
-- ready_ring_low() (PL/pgSQL; its body is this fragment, kept for the previous release's
-- claims) cost 28 us of every claim (EXPLAIN ANALYZE), the sub-select 2.
(SELECT coalesce((SELECT s.low FROM "trioq".ready_ring_state s), 0::smallint))

          UNION ALL
          SELECT e.queue, e.run_at, 'ready' FROM "trioq".ready_keyed e
          UNION ALL
          SELECT d.queue, d.run_at, d.state FROM "trioq".job_due d
          UNION ALL
          SELECT u.queue, NULL, 'running' FROM "trioq".job_runs u) AS j,
         (SELECT "trioq".db_now() AS now) AS t
    GROUP BY j.queue, t.now
$$;

CREATE FUNCTION trioq.queue_limit_gate(gate_queue text, requested integer, OUT allowed integer, OUT running integer, OUT global_limit integer, OUT rate_allowed integer, OUT rate_period double precision, OUT next_start_at timestamp with time zone, OUT started_at timestamp with time zone) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    l "trioq".queue_limits%ROWTYPE;
    recent integer;
BEGIN
    allowed := requested;
    SELECT * INTO l FROM "trioq".queue_limits q WHERE q.queue = gate_queue FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    global_limit := l.global_limit;
    rate_allowed := l.rate_allowed;
    rate_period := l.rate_period;
    IF l.global_limit IS NOT NULL THEN
        -- The runs carry their queue (migration 0047).
        SELECT count(*) INTO running FROM "trioq".job_runs u WHERE u.queue = gate_queue;
        allowed := least(allowed, greatest(l.global_limit - running, 0));
    END IF;
    started_at := "trioq".db_now() + (clock_timestamp() - now());
    IF l.rate_allowed IS NOT NULL THEN
        SELECT count(*) INTO recent FROM unnest(l.recent_starts) AS s(at)
        WHERE s.at > started_at - l.rate_period * interval '1 second';
        allowed := least(allowed, greatest(l.rate_allowed - recent, 0));
        -- The window is full once this claim's starts are in: the next start is allowed when
        -- the oldest start still counted leaves it.
        IF recent + allowed >= l.rate_allowed THEN
            next_start_at := (SELECT s.at FROM unnest(l.recent_starts) AS s(at)
                              WHERE s.at > started_at - l.rate_period * interval '1 second'
                              ORDER BY s.at OFFSET (recent + allowed - l.rate_allowed) LIMIT 1)
                             + l.rate_period * interval '1 second';
            next_start_at := coalesce(next_start_at,
                                      started_at + l.rate_period * interval '1 second');
        END IF;
    END IF;
END
$$;

CREATE FUNCTION trioq.queue_limit_spend(spend_queue text, claimed bigint[], claimed_at timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    l "trioq".queue_limits%ROWTYPE;
    kept timestamptz[];
BEGIN
    UPDATE "trioq".job_runs u SET started_at = greatest(u.started_at, claimed_at)
    WHERE claimed_at IS NOT NULL AND u.job_id = ANY(claimed);
    SELECT * INTO l FROM "trioq".queue_limits q WHERE q.queue = spend_queue FOR UPDATE;
    IF NOT FOUND OR l.rate_allowed IS NULL OR cardinality(claimed) = 0 THEN
        RETURN NULL;
    END IF;
    kept := ARRAY(SELECT newest.at FROM (
                      SELECT s.at FROM (
                          SELECT unnest(l.recent_starts) AS at
                          UNION ALL
                          SELECT coalesce(u.started_at, claimed_at) FROM unnest(claimed) AS c(id)
                          LEFT JOIN "trioq".job_runs u ON u.job_id = c.id) AS s
                      ORDER BY s.at DESC LIMIT l.rate_allowed) AS newest
                  ORDER BY newest.at);
    UPDATE "trioq".queue_limits q SET recent_starts = kept WHERE q.queue = spend_queue;
    IF cardinality(kept) < l.rate_allowed THEN
        RETURN NULL;
    END IF;
    RETURN kept[1] + l.rate_period * interval '1 second';
END
$$;

CREATE FUNCTION trioq.queue_probe(queues text[]) RETURNS TABLE(queue text, work_due boolean, next_due timestamp with time zone)
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT q.queue,
           EXISTS (SELECT 1 FROM "trioq".ready_ring r
                   CROSS JOIN LATERAL (SELECT 1 FROM "trioq".job_rows j
                                       WHERE j.id = r.id AND j.phase = 'ready'
                                         AND j.filed = r.filed
                                       LIMIT 1) AS job
                   WHERE r.queue = q.queue
                     AND r.slot >=

-- The ready ring's lowest slot that readers read (migration 0041: a bank the ring has left,
-- while a `pg_dump` holds it, lies below); a state emptied by hand (a test suite truncating
-- every table) reads as 0, the first bank, as ready_ring_file() files there. Read once per
-- statement by this sub-select (an InitPlan), which prunes the slots below as the statement
-- runs: their scans are never executed. Written into each statement, not called: a call of
-- ready_ring_low() (PL/pgSQL; its body is this fragment, kept for the previous release's
-- claims) cost 28 us of every claim (EXPLAIN ANALYZE), the sub-select 2.
(SELECT coalesce((SELECT s.low FROM "trioq".ready_ring_state s), 0::smallint))

                  )
           -- The first entry in key order (as job_claim_plain's probe: an EXISTS may be
           -- planned as a scan of the whole table).
           OR (SELECT e.queue FROM "trioq".ready_keyed e WHERE e.queue = q.queue
               ORDER BY e.queue, e.kind, e.key LIMIT 1) IS NOT NULL
           OR coalesce(d.run_at <= "trioq".db_now(), false),
           CASE WHEN d.run_at > "trioq".db_now() THEN d.run_at END
    FROM unnest(queues) WITH ORDINALITY AS q(queue, ord)
    LEFT JOIN LATERAL (
        SELECT d.run_at FROM "trioq".job_due d
        WHERE d.queue = q.queue AND d.run_at IS NOT NULL
        ORDER BY d.run_at LIMIT 1
    ) AS d ON true
    ORDER BY q.ord
$$;

CREATE FUNCTION trioq.ready_channel(queue text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT 'trioq_ready_'
           OPERATOR(pg_catalog.||)
           (pg_catalog.hashtext(queue) OPERATOR(pg_catalog.&) 63)::pg_catalog.text
$$;

CREATE FUNCTION trioq.ready_keyed_file() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP OPERATOR(pg_catalog.<>) 'INSERT'
       AND OLD.phase OPERATOR(pg_catalog.=) 'ready' THEN
        DELETE FROM "trioq".ready_keyed e
        WHERE e.queue OPERATOR(pg_catalog.=) OLD.queue
          AND e.kind OPERATOR(pg_catalog.=)
              (CASE WHEN OLD.partition_key IS NOT NULL THEN 'p' ELSE 'c' END)::"char"
          AND e.key OPERATOR(pg_catalog.=) coalesce(OLD.partition_key, OLD.concurrency_key)
          AND e.priority OPERATOR(pg_catalog.=) OLD.priority
          AND e.run_at OPERATOR(pg_catalog.=) OLD.run_at
          AND e.id OPERATOR(pg_catalog.=) OLD.id;
    END IF;
    IF TG_OP OPERATOR(pg_catalog.<>) 'DELETE'
       AND NEW.phase OPERATOR(pg_catalog.=) 'ready' THEN
        INSERT INTO "trioq".ready_keyed (queue, kind, key, priority, run_at, id, filed, task,
                                          version, concurrency_limit)
        VALUES (NEW.queue,
                (CASE WHEN NEW.partition_key IS NOT NULL THEN 'p' ELSE 'c' END)::"char",
                coalesce(NEW.partition_key, NEW.concurrency_key), NEW.priority, NEW.run_at,
                NEW.id, NEW.filed, NEW.task, NEW.version, NEW.concurrency_limit)
        ON CONFLICT (queue, kind, key, priority, run_at, id)
        DO UPDATE SET filed = excluded.filed, task = excluded.task,
                      version = excluded.version,
                      concurrency_limit = excluded.concurrency_limit;
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION trioq.ready_keyed_take(rows tid[], ids bigint[]) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    taken bigint;
BEGIN
    DELETE FROM "trioq".ready_keyed e WHERE e.ctid = ANY(rows) AND e.id = ANY(ids);
    GET DIAGNOSTICS taken = ROW_COUNT;
    RETURN taken;
END
$$;

CREATE FUNCTION trioq.ready_pending() RETURNS integer
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
    SELECT (SELECT count(*)::integer
            FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = '"trioq".ready_ring'::regclass
              AND (pg_relation_size(c.oid) > 0
                   OR (c.relname ~ '^ready_ring_[0-9]+$'
                       AND substr(c.relname, 12)::integer < coalesce(s.low, 0))))
           + coalesce((s.low < s.base)::integer, 0)
    FROM (SELECT 1) AS one LEFT JOIN "trioq".ready_ring_state s ON true
$_$;

CREATE FUNCTION trioq.ready_ring_file() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO "trioq".ready_ring (slot, queue, task, version, priority, run_at, id, filed)
    VALUES (coalesce((SELECT s.base FROM "trioq".ready_ring_state s), 0::smallint)
            OPERATOR(pg_catalog.+) "trioq".ready_slot(pg_catalog.now()), NEW.queue,
            NEW.task, NEW.version, NEW.priority, NEW.run_at, NEW.id, NEW.filed);
    RETURN NULL;
END
$$;

CREATE FUNCTION trioq.ready_ring_low() RETURNS smallint
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    AS $$
BEGIN
    RETURN

-- The ready ring's lowest slot that readers read (migration 0041: a bank the ring has left,
-- while a `pg_dump` holds it, lies below); a state emptied by hand (a test suite truncating
-- every table) reads as 0, the first bank, as ready_ring_file() files there. Read once per
-- statement by this sub-select (an InitPlan), which prunes the slots below as the statement
-- runs: their scans are never executed. Written into each statement, not called: a call of
-- ready_ring_low() (PL/pgSQL; its body is this fragment, kept for the previous release's
-- claims) cost 28 us of every claim (EXPLAIN ANALYZE), the sub-select 2.
(SELECT coalesce((SELECT s.low FROM "trioq".ready_ring_state s), 0::smallint))

    ;
END
$$;

CREATE FUNCTION trioq.ready_ring_take(rows tid[], ids bigint[]) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    taken bigint;
BEGIN
    DELETE FROM "trioq".ready_ring r WHERE r.ctid = ANY(rows) AND r.id = ANY(ids);
    GET DIAGNOSTICS taken = ROW_COUNT;
    RETURN taken;
END
$$;

CREATE FUNCTION trioq.ready_slot(at timestamp with time zone) RETURNS smallint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT (pg_catalog.floor(pg_catalog.date_part(
                'epoch', at OPERATOR(pg_catalog.-)
                         '1970-01-01 00:00:00+00'::pg_catalog.timestamptz)
            OPERATOR(pg_catalog./) 5)::bigint OPERATOR(pg_catalog.%) 4)::smallint
$$;

CREATE FUNCTION trioq.ready_sweep() RETURNS TABLE(truncated integer, pending integer)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET lock_timeout TO '10ms'
    AS $_$
DECLARE
    st        "trioq".ready_ring_state;
    writing   smallint;
    next_slot smallint;
    slot      smallint;
    filled    boolean;
    blocked   boolean := false;
    kept      boolean := false;
    part      record;
    -- A retired slot's entries of jobs still ready, to the slot being written (step 4).
    late      constant text := 'WITH moved AS (DELETE FROM "trioq".%I r'
                               ' USING "trioq".job_rows j WHERE j.id = r.id AND j.phase = ''ready'''
                               ' AND j.filed = r.filed'
                               ' RETURNING r.queue, r.task, r.version, r.priority, r.run_at, r.id,'
                               ' r.filed)'
                               ' INSERT INTO "trioq".ready_ring'
                               ' (slot, queue, task, version, priority, run_at, id, filed)'
                               ' SELECT DISTINCT ON (m.id) $1, m.queue, m.task, m.version,'
                               ' m.priority, m.run_at, m.id, m.filed FROM moved m ORDER BY m.id';
BEGIN
    truncated := 0;
    BEGIN
        -- One sweep at a time (a leader elected while the last one's sweep still runs).
        SELECT * INTO st FROM "trioq".ready_ring_state FOR UPDATE;
        IF NOT FOUND THEN
            -- Emptied by hand (a test suite truncating every table): bank 0 again, as the
            -- filing and the claims read a missing row.
            INSERT INTO "trioq".ready_ring_state DEFAULT VALUES ON CONFLICT DO NOTHING;
            SELECT * INTO st FROM "trioq".ready_ring_state FOR UPDATE;
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        pending := "trioq".ready_pending();
        RETURN NEXT;
        RETURN;
    END;
    writing := st.base + "trioq".ready_slot(now());
    next_slot := st.base + "trioq".ready_slot(now() + interval '5 seconds');
    -- 4. The banks left behind, once they can be locked.
    IF st.retired_tried_at IS NULL OR st.retired_tried_at <= now() - interval '20 seconds' THEN
        FOR part IN
            SELECT c.relname
            FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = '"trioq".ready_ring'::regclass
              AND c.relname ~ '^ready_ring_[0-9]+$'
              AND substr(c.relname, 12)::integer < st.low
            ORDER BY substr(c.relname, 12)::integer
        LOOP
            BEGIN
                EXECUTE format(late, part.relname) USING writing;
            EXCEPTION WHEN lock_not_available THEN
                NULL;  -- a lock it would wait on past lock_timeout: the next try
            END;
            BEGIN
                EXECUTE format('LOCK TABLE "trioq".%I IN ACCESS EXCLUSIVE MODE', part.relname);
                EXECUTE format(late, part.relname) USING writing;  -- filed since the move above
                EXECUTE format('DROP TABLE "trioq".%I', part.relname);
            EXCEPTION WHEN lock_not_available THEN
                kept := true;
            END;
        END LOOP;
        IF kept THEN
            UPDATE "trioq".ready_ring_state SET retired_tried_at = now();
        END IF;
    END IF;
    -- 1. The written bank's drained slots.
    FOR slot IN st.base .. st.base + 3 LOOP
        CONTINUE WHEN slot IN (writing, next_slot);
        CONTINUE WHEN pg_relation_size(format('"trioq".ready_ring_%s', slot)::regclass) = 0;
        BEGIN
            EXECUTE format('LOCK TABLE "trioq".ready_ring_%s IN ACCESS EXCLUSIVE MODE', slot);
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM "trioq".ready_ring_%s r'
                           ' JOIN "trioq".job_rows j ON j.id = r.id AND j.phase = ''ready'''
                           ' AND j.filed = r.filed)',
                           slot)
                INTO filled;
            IF NOT filled THEN
                EXECUTE format('TRUNCATE "trioq".ready_ring_%s', slot);
                truncated := truncated + 1;
            END IF;
        EXCEPTION WHEN lock_not_available THEN
            blocked := true;
        END;
    END LOOP;
    IF truncated > 0 OR NOT blocked THEN
        st.blocked_since := NULL;
    ELSIF st.blocked_since IS NULL THEN
        st.blocked_since := now();
    END IF;
    -- 2. A new bank, when the written one has been held for 10 s (one move at a time: the
    -- bank left behind by the last move has been left, step 3).
    IF st.blocked_since <= now() - interval '10 seconds' AND st.low = st.base
       AND st.base <= 32767 - 8 THEN
        BEGIN
            FOR slot IN st.base + 4 .. st.base + 7 LOOP
                EXECUTE format('CREATE TABLE "trioq".ready_ring_%s'
                               ' (LIKE "trioq".ready_ring INCLUDING DEFAULTS)'
                               ' WITH (vacuum_truncate = off)', slot);
                EXECUTE format('ALTER TABLE "trioq".ready_ring ATTACH PARTITION'
                               ' "trioq".ready_ring_%s FOR VALUES IN (%s)', slot, slot);
            END LOOP;
            st.base := st.base + 4;
            st.moved_at := now();
            st.blocked_since := NULL;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END IF;
    -- 3. The bank left behind, 5 s after the move.
    IF st.low < st.base AND st.moved_at <= now() - interval '5 seconds' THEN
        BEGIN
            FOR slot IN st.low .. st.base - 1 LOOP
                EXECUTE format('LOCK TABLE "trioq".ready_ring_%s IN SHARE MODE', slot);
            END LOOP;
            -- Moved, not copied: what is left there of a ready job afterwards was filed late
            -- (step 4 moves it). The deleted entries' dead versions are in a bank no claim
            -- reads, and go with its tables.
            WITH moved AS (
                DELETE FROM "trioq".ready_ring r
                USING "trioq".job_rows j
                WHERE r.slot >= st.low AND r.slot < st.base
                  AND j.id = r.id AND j.phase = 'ready' AND j.filed = r.filed
                RETURNING r.queue, r.task, r.version, r.priority, r.run_at, r.id, r.filed
            )
            INSERT INTO "trioq".ready_ring (slot, queue, task, version, priority, run_at, id,
                                             filed)
            SELECT DISTINCT ON (m.id) st.base + "trioq".ready_slot(now()), m.queue, m.task,
                   m.version, m.priority, m.run_at, m.id, m.filed
            FROM moved m
            ORDER BY m.id;
            st.low := st.base;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END IF;
    -- Written only when it changed: the claims and every filing read this row, and each
    -- version of it is one more they step over while a snapshot pins the horizon.
    UPDATE "trioq".ready_ring_state s
    SET base = st.base, low = st.low, blocked_since = st.blocked_since, moved_at = st.moved_at
    WHERE (s.base, s.low, s.blocked_since, s.moved_at)
          IS DISTINCT FROM (st.base, st.low, st.blocked_since, st.moved_at);
    pending := "trioq".ready_pending();
    RETURN NEXT;
END
$_$;

CREATE FUNCTION trioq.result_channel(job_id bigint) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT 'trioq_result_'
           OPERATOR(pg_catalog.||)
           (job_id OPERATOR(pg_catalog.&) 63::pg_catalog.int8)::pg_catalog.text
$$;

CREATE FUNCTION trioq.satellite_epochs_rotate(retention interval) RETURNS TABLE(pruned bigint, next_due timestamp with time zone)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET lock_timeout TO '50ms'
    SET max_parallel_workers_per_gather TO '0'
    AS $_$
DECLARE
    now_at     timestamptz := "trioq".db_now();
    day_start  timestamptz := to_timestamp(floor(extract(epoch FROM now_at) / 86400) * 86400);
    cutoff     timestamptz := now_at - retention;
    due        timestamptz := day_start + interval '1 day';
    width      constant bigint := 4294967296;
    -- In the order their partitions are truncated: the claims' two last (below: the window
    -- they queue behind).
    tables     constant text[] := ARRAY['job_outcomes', 'attempts', 'workflow_values',
                                        'checkpoints', 'job_rows'];
    removed    bigint := 0;
    this_epoch record;
    next_epoch record;
    epoch_row  record;
    tab        text;
    part       text;
    parts      text[];
    survivors  bigint[];
    found      bigint[];
    unfinished bigint;
    kept       bigint;
    total      bigint;
    gone       bigint;
    low_id     bigint;
    filled     boolean;
    stale      boolean;
    unexpired  boolean;
    grown      boolean;
    expired_before timestamptz;
    attempt    int;
    filled_parts text[];
BEGIN
    IF retention IS NOT NULL THEN
        -- Finish days expire at a UTC midnight plus `retention`: the next such moment.
        due := least(due, to_timestamp(floor(extract(epoch FROM cutoff) / 86400) * 86400)
                          + interval '1 day' + retention);
    END IF;
    SELECT e.* INTO this_epoch FROM "trioq".satellite_epochs e
    WHERE e.started_at IS NOT NULL ORDER BY e.epoch DESC LIMIT 1;
    SELECT e.* INTO next_epoch FROM "trioq".satellite_epochs e WHERE e.epoch = this_epoch.epoch + 1;
    -- A new epoch, into partitions an earlier call made: setval() is not undone by a rollback,
    -- so the ids never run ahead of partitions this transaction could still take back.
    IF next_epoch.epoch IS NOT NULL AND this_epoch.started_at < day_start THEN
        UPDATE "trioq".satellite_epochs SET ended_at = now_at WHERE epoch = this_epoch.epoch;
        UPDATE "trioq".satellite_epochs SET started_at = now_at WHERE epoch = next_epoch.epoch;
        IF coalesce(pg_sequence_last_value('"trioq".jobs_id_seq'), 0) < next_epoch.low THEN
            PERFORM setval('"trioq".jobs_id_seq', next_epoch.low, false);
        END IF;
        this_epoch := next_epoch;
        this_epoch.started_at := now_at;
    END IF;
    -- The next epoch's partitions, made a call ahead (attached: no lock a claim waits for).
    IF NOT EXISTS (SELECT 1 FROM "trioq".satellite_epochs e WHERE e.epoch = this_epoch.epoch + 1)
    THEN
        BEGIN
            INSERT INTO "trioq".satellite_epochs (epoch, low, high)
            VALUES (this_epoch.epoch + 1, this_epoch.high, this_epoch.high + width);
            FOREACH tab IN ARRAY tables LOOP
                PERFORM "trioq".satellite_partition_add(
                    tab, tab || '_e' || (this_epoch.epoch + 1), this_epoch.high,
                    this_epoch.high + width);
            END LOOP;
        EXCEPTION WHEN lock_not_available THEN
            due := least(due, now_at + interval '1 minute');
        END;
    END IF;
    -- The current epoch's partitions were made a day ahead and stayed empty until its jump: a
    -- VACUUM or ANALYZE of the whole database meanwhile (a nightly `vacuumdb --analyze`,
    -- pg_upgrade's advice) recorded them as empty (reltuples 0; never analyzed, it is -1 and
    -- the planner takes a partition of under ten pages for ten), and a generic plan made while
    -- one holds a few pages reads a record by a sequential scan of it as it grows (4.0 ms a
    -- claim of 25 against 0.7, bench/RESULTS.md, "The prune's phase measured its own burst")
    -- until autovacuum analyzes it, a minute or more into the day. Such a partition is
    -- analyzed here once it holds ten pages (SHARE UPDATE EXCLUSIVE on it alone, which no
    -- claim, enqueue or completion waits for; the plans on its parent are made again). Until
    -- the records' partition is, the next call is due in 10 s, through the epoch's first hour
    -- (the records only: every claimed candidate's is read; a partition written rarely, the
    -- values' or the attempts', would keep the leader's rotation, the prune included, due
    -- every 10 s for the hour). It was made again at the jump instead: its DROP took the
    -- parent's ACCESS EXCLUSIVE lock, which every claim queued behind (after a nightly
    -- ANALYZE, the midnight prune's pickup p95 6.02x clean against 2.98x analyzed here;
    -- bench/RESULTS.md, "The day's partitions analyzed while empty"). A lock not granted (a
    -- size read waits behind an ACCESS EXCLUSIVE request): a minute later, the jump kept.
    FOREACH tab IN ARRAY tables LOOP
        part := tab || '_e' || this_epoch.epoch;
        BEGIN
            SELECT c.reltuples = 0 AND c.relpages = 0,
                   pg_relation_size(c.oid) >= 10 * current_setting('block_size')::bigint
            INTO stale, grown
            FROM pg_class c WHERE c.oid = to_regclass(format('"trioq".%I', part));
            IF stale AND grown THEN
                EXECUTE format('ANALYZE "trioq".%I', part);
            ELSIF stale AND tab = 'job_rows'
                  AND this_epoch.started_at > now_at - interval '1 hour' THEN
                due := least(due, now_at + interval '10 seconds');
            END IF;
        EXCEPTION WHEN lock_not_available THEN
            due := least(due, now_at + interval '1 minute');
        END;
    END LOOP;
    IF retention IS NULL THEN
        RETURN QUERY SELECT removed, due;
        RETURN;
    END IF;
    -- The rule (finish day ended by the cutoff) as a bound on `finished_at`, which its index
    -- serves: a job finished before the cutoff's UTC day began is expired.
    expired_before := to_timestamp(floor(extract(epoch FROM cutoff) / 86400) * 86400);
    FOR epoch_row IN
        SELECT e.* FROM "trioq".satellite_epochs e WHERE e.ended_at IS NOT NULL ORDER BY e.epoch
    LOOP
        BEGIN
            gone := 0;
            low_id := coalesce(epoch_row.low, -9223372036854775808);
            -- The epoch's partitions still there (a DROP a day after it was emptied).
            SELECT coalesce(array_agg(t || '_e' || epoch_row.epoch ORDER BY o), '{}') INTO parts
            FROM unnest(tables) WITH ORDINALITY AS u(t, o)
            WHERE to_regclass(format('"trioq".%I', t || '_e' || epoch_row.epoch)) IS NOT NULL;
            IF cardinality(parts) = 0 THEN
                DELETE FROM "trioq".satellite_epochs WHERE epoch = epoch_row.epoch;
                CONTINUE;
            END IF;
            -- Nothing of it can be expired yet: every id of an epoch after the first was taken
            -- after the jump that started it (setval, in the call that set `started_at`), so
            -- each of its jobs finished after `started_at`. Left unread and unlocked: read, an
            -- epoch of 1,000,000 jobs none of which had expired took 232 ms of every call (1.9
            -- left alone), its outcomes held in SHARE mode to the commit, which every
            -- completion of its jobs waited for (at a midnight, the epoch just ended: its last
            -- running jobs, its backlog), and so for each epoch within a retention of days
            -- (bench/RESULTS.md, "The rotation's epochs that cannot expire yet"). A job kept
            -- too long is the worst this can do, by a day: ids run into the next epoch's range
            -- only past 2^32 a day, and a job finished in a transaction that began before the
            -- jump (`finished_at` is its start) and took its id after it. Once no partition of
            -- it holds a row and a day has passed since it ended, it goes on below and is
            -- dropped, as an empty epoch always was.
            unexpired := epoch_row.low IS NOT NULL AND epoch_row.started_at >= expired_before;
            CONTINUE WHEN unexpired AND epoch_row.ended_at >= now_at - interval '1 day';
            -- The partitions holding rows, the only ones truncated. The empty ones are dropped
            -- once all five are, a day after the epoch ended, at a later call (below). Read
            -- before the survivors: a partition empty here can gain only a survivor's rows
            -- (an id taken before the jump, a checkpoint of a job kept), which no truncation
            -- must take, and none once a day has passed since the epoch ended.
            filled_parts := '{}';
            FOREACH part IN ARRAY parts LOOP
                EXECUTE format('SELECT EXISTS (SELECT FROM "trioq".%I)', part) INTO filled;
                IF filled THEN
                    filled_parts := filled_parts || part;
                END IF;
            END LOOP;
            CONTINUE WHEN unexpired AND cardinality(filled_parts) > 0;
            survivors := NULL;
            total := 0;
            IF ('job_rows_e' || epoch_row.epoch) = ANY(parts) THEN
                -- Who survives is read before the truncations' ACCESS EXCLUSIVE locks, which
                -- every claim queues behind (its generic plan locks every partition of
                -- job_rows): read under them, the prune of 1,000,000 jobs held the workers'
                -- pickup for its 1.13 s (p95 1197 ms against 777 clean; bench/RESULTS.md,
                -- "Retention's read before its lock"). What the read must not miss:
                --   * a record inserted into the epoch by a transaction that took its id
                --     before the jump: waited out here, by a SHARE lock on the records
                --     taken and given back (a subtransaction rolled back); a new id is never
                --     in an ended epoch;
                --   * an expired job made a survivor again (a redrive deletes its outcome):
                --     the outcomes are locked in SHARE mode until the commit. Holding the
                --     records in SHARE mode instead deadlocked with the full claim and the
                --     settle (a row lock on a partition, then RowExclusive on it: 2 prunes
                --     of 4 under load failed with 40P01 at the lock's upgrade);
                --   * a survivor written meanwhile (a settle, a wake-up, a checkpoint): its
                --     rows are copied aside only under ACCESS EXCLUSIVE (by primary key,
                --     at most 10,000).
                -- A job that survives may finish or be deleted meanwhile; it is still kept,
                -- or not copied. An expired job stops being expired only by its outcome (a
                -- write to its record, a result watch's flag, goes with the truncation).
                -- (A settle in flight holds the records too: asked for up to five times.)
                FOR attempt IN 1 .. 5 LOOP
                    BEGIN
                        EXECUTE format('LOCK TABLE "trioq".%I IN SHARE MODE',
                                       'job_rows_e' || epoch_row.epoch);
                        RAISE SQLSTATE 'TQ001';
                    EXCEPTION
                        WHEN SQLSTATE 'TQ001' THEN
                            EXIT;  -- the lock given back: no writer of a late id is left
                        WHEN lock_not_available THEN
                            IF attempt = 5 THEN
                                RAISE;
                            END IF;
                    END;
                END LOOP;
                EXECUTE format('LOCK TABLE "trioq".%I IN SHARE MODE',
                               'job_outcomes_e' || epoch_row.epoch);
                -- The survivors, in two exact parts (a job has at most one outcome, its
                -- primary key): those whose outcome is not expired (`finished_at`'s index: an
                -- outcome is expired when its finish day ended by the cutoff, that is when it
                -- finished before the cutoff's day began), and the records with no outcome,
                -- the unfinished jobs. The anti-join with the rule written on each outcome
                -- (floor and extract per row, no index) took 2.21 s for 1,000,000 finished
                -- jobs.
                EXECUTE format('SELECT coalesce(array_agg(o.job_id), ''{}'') FROM "trioq".%I o '
                               'WHERE o.finished_at >= $1 LIMIT 10001',
                               'job_outcomes_e' || epoch_row.epoch)
                    INTO survivors USING expired_before;
                -- The unfinished jobs where the claims and the leader find them by id
                -- (ready_keyed, job_due, job_runs: what the epoch still holds, not the epoch),
                -- trusted only when there are as many as the two partitions' counts say. No
                -- statement deletes a record and keeps its outcome (a purge and this rotation
                -- delete both, a discarding completion a record that has none), so the
                -- records are the outcomes plus the records without one; each job found is
                -- one of those (a record, no outcome), and as many as that is all of them.
                -- One statement, one snapshot: the counts and the tables agree (a claim moves
                -- a job from one to another in one statement). OFFSET 0: pulled up, the
                -- subquery counted again at each use (five scans of 1,000,000 rows). The two
                -- counts took 123-150 ms for 1,000,000 finished jobs against 305 for the
                -- anti-join of the two primary keys and the count (bench/RESULTS.md, "The
                -- prune's read through the claims' tables"). Not the ring: a relation read
                -- here stays locked until the commit, and the leader's sweep truncates the
                -- ring's drained slots with a 10 ms lock timeout the claims queue behind;
                -- a plain job still ready a day after its epoch ended (a paused queue, a
                -- backlog a day deep) is read by the anti-join instead, as is any job the
                -- tables miss, more than 10,000 unfinished, or fewer records than outcomes.
                EXECUTE format(
                    'SELECT c.total, c.total - c.finished, CASE WHEN c.total > c.finished '
                    'AND c.total - c.finished <= 10000 THEN (SELECT coalesce(array_agg('
                    'DISTINCT n.id), ''{}'') FROM (SELECT k.id '
                    'FROM "trioq".ready_keyed k WHERE k.id >= $1 AND k.id < $2 '
                    'UNION ALL SELECT d.job_id FROM "trioq".job_due d '
                    'WHERE d.job_id >= $1 AND d.job_id < $2 UNION ALL SELECT u.job_id '
                    'FROM "trioq".job_runs u WHERE u.job_id >= $1 AND u.job_id < $2) AS n '
                    'WHERE EXISTS (SELECT FROM "trioq".%1$I j WHERE j.id = n.id) '
                    'AND NOT EXISTS (SELECT FROM "trioq".%2$I o WHERE o.job_id = n.id)) END '
                    'FROM (SELECT (SELECT count(*) FROM "trioq".%1$I) AS total, '
                    '(SELECT count(*) FROM "trioq".%2$I) AS finished OFFSET 0) AS c',
                    'job_rows_e' || epoch_row.epoch, 'job_outcomes_e' || epoch_row.epoch)
                    INTO total, unfinished, found USING low_id, epoch_row.high;
                IF unfinished <> 0 AND cardinality(found) IS DISTINCT FROM unfinished THEN
                    RAISE DEBUG 'satellite_epochs_rotate: epoch %: % unfinished, % found by '
                                'the claims'' tables: read by the anti-join', epoch_row.epoch,
                                unfinished, cardinality(found);
                    EXECUTE format(
                        'SELECT coalesce(array_agg(r.id), ''{}'') FROM (SELECT r.id '
                        'FROM "trioq".%I r WHERE NOT EXISTS (SELECT FROM "trioq".%I o '
                        'WHERE o.job_id = r.id) LIMIT 10001) AS r',
                        'job_rows_e' || epoch_row.epoch, 'job_outcomes_e' || epoch_row.epoch)
                        INTO found;
                ELSIF unfinished > 0 THEN
                    RAISE DEBUG 'satellite_epochs_rotate: epoch %: % unfinished, found by the '
                                'claims'' tables', epoch_row.epoch, unfinished;
                END IF;
                survivors := survivors || coalesce(found, '{}');
            END IF;
            kept := coalesce(cardinality(survivors), 0);
            IF kept > 10000 OR (kept > 0 AND total <= 2 * kept) THEN
                -- Too many kept to copy: the expired jobs row by row (see above).
                EXECUTE format(
                    'WITH doomed AS MATERIALIZED (SELECT o.job_id AS id FROM "trioq".%I o '
                    'WHERE o.finished_at < $1 LIMIT 10000), '
                    'outcomes AS (DELETE FROM "trioq".%I o USING doomed d '
                    'WHERE o.job_id = d.id), '
                    'records AS (DELETE FROM "trioq".job_rows r USING doomed d '
                    'WHERE r.id = d.id RETURNING 1) '
                    'SELECT count(*) FROM records',
                    'job_outcomes_e' || epoch_row.epoch, 'job_outcomes_e' || epoch_row.epoch)
                    INTO gone USING expired_before;
                -- Counted once done (a PL/pgSQL variable is not rolled back with the block).
                removed := removed + gone;
                IF gone = 10000 THEN
                    due := least(due, now_at + interval '1 minute');
                END IF;
                CONTINUE;
            END IF;
            IF kept = 0 THEN
                survivors := NULL;  -- none: truncated, or dropped once empty (below)
            END IF;
            gone := total - kept;
            -- What belongs to the expired jobs outside these partitions (job_keys read by its
            -- holders' ids: it holds only keyed jobs, a scan of the epoch's records reads all).
            DELETE FROM "trioq".job_keys k
            WHERE k.job_id >= low_id AND k.job_id < epoch_row.high
              AND k.job_id <> ALL(coalesce(survivors, '{}'));
            DELETE FROM "trioq".messages m
            WHERE m.job_id >= low_id AND m.job_id < epoch_row.high
              AND m.job_id <> ALL(coalesce(survivors, '{}'));
            DELETE FROM "trioq".partition_locks l
            WHERE l.job_id >= low_id AND l.job_id < epoch_row.high
              AND l.job_id <> ALL(coalesce(survivors, '{}'));
            -- An empty epoch is dropped whole at a later call than the one that emptied it: a
            -- DROP takes its parent's ACCESS EXCLUSIVE lock, which a claim's plan holds a lock
            -- against (the full claim's names `checkpoints`). Dropped in the pass that
            -- truncated the records, the epoch's empty checkpoints partition was refused its
            -- parent's lock under load, or deadlocked with a claim, and undid the truncation:
            -- `trioq purge` then deleted the 1,000,000 jobs row by row (130 s;
            -- bench/RESULTS.md, "Retention's read before its lock").
            IF cardinality(filled_parts) = 0 THEN
                IF epoch_row.ended_at < now_at - interval '1 day' THEN
                    FOREACH part IN ARRAY parts LOOP
                        EXECUTE format('DROP TABLE "trioq".%I', part);
                    END LOOP;
                END IF;
                CONTINUE;
            END IF;
            -- Each partition holding rows, in the order of `tables`: locked (ACCESS EXCLUSIVE),
            -- its survivors copied aside (`trioq_epoch_kept`), truncated, and the copy
            -- written back. Only those: a temporary table made and dropped for each of the
            -- five is catalog work under these locks (a prune with 1,000 survivors took 1.18 s
            -- by median against 0.94 s with none). Each lock is taken as its partition's turn
            -- comes, so the claims, which read the records and the checkpoints (their generic
            -- plans lock every partition of both), queue behind those two only, after the
            -- outcomes, attempts and values are done: a truncation rebuilds each index empty
            -- with an fsync (the outcomes' 3.7 ms of the 10 for 1,000,000 finished jobs here;
            -- bench/RESULTS.md, "The prune's read through the claims' tables"). A claim in
            -- flight holds the partitions it locked until its commit, and a settle that
            -- locked the records may wait for a satellite's partition behind this request (a
            -- deadlock that the lock's 50 ms or the detector ends on this side): so the whole
            -- sequence is tried again, up to five times, each failure undoing what it did and
            -- releasing what it got (the outcomes' SHARE lock is kept), before the epoch is
            -- left to a later call.
            FOR attempt IN 1 .. 5 LOOP
                BEGIN
                    FOREACH part IN ARRAY filled_parts LOOP
                        EXECUTE format('LOCK TABLE "trioq".%I IN ACCESS EXCLUSIVE MODE', part);
                        IF survivors IS NOT NULL THEN
                            EXECUTE format('CREATE TEMPORARY TABLE trioq_epoch_kept ON COMMIT '
                                           'DROP AS SELECT * FROM "trioq".%I WHERE %I = ANY($1)',
                                           part, CASE WHEN part LIKE 'job\_rows\_e%' THEN 'id'
                                                      ELSE 'job_id' END)
                                USING survivors;
                        END IF;
                        EXECUTE format('TRUNCATE "trioq".%I', part);
                        CONTINUE WHEN survivors IS NULL;
                        IF part LIKE 'job\_rows\_e%' THEN
                            EXECUTE format('ALTER TABLE "trioq".%I DISABLE TRIGGER USER', part);
                        END IF;
                        EXECUTE format('INSERT INTO "trioq".%I SELECT * FROM trioq_epoch_kept',
                                       part);
                        IF part LIKE 'job\_rows\_e%' THEN
                            EXECUTE format('ALTER TABLE "trioq".%I ENABLE TRIGGER USER', part);
                        END IF;
                        DROP TABLE trioq_epoch_kept;
                    END LOOP;
                    EXIT;
                EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
                    IF attempt = 5 THEN
                        RAISE;
                    END IF;
                END;
            END LOOP;
            -- Counted once done (a PL/pgSQL variable is not rolled back with the block).
            removed := removed + coalesce(gone, 0);
        EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
            due := least(due, now_at + interval '1 minute');
        END;
    END LOOP;
    RETURN QUERY SELECT removed, due;
END
$_$;

CREATE FUNCTION trioq.satellite_partition_add(tab text, part text, low bigint, high bigint) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    EXECUTE format('CREATE TABLE "trioq".%I (LIKE "trioq".%I INCLUDING ALL) '
                   'WITH (vacuum_truncate = off, toast.vacuum_truncate = off)', part, tab);
    EXECUTE format('ALTER TABLE "trioq".%I ATTACH PARTITION "trioq".%I '
                   'FOR VALUES FROM (%s) TO (%s)', tab, part, low, high);
END
$$;

CREATE FUNCTION trioq.send(p_job_id bigint, p_topic text, p_payload jsonb DEFAULT 'null'::jsonb) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    job_state text;
    final_state text;
    job_topic text;
    job_position integer;
    job_queue text;
    message_id bigint;
    woken_count bigint;
BEGIN
    PERFORM "trioq".payload_check(p_payload, 'payload');
    SELECT j.phase, j.wait_topic, j.wait_position INTO job_state, job_topic, job_position
    FROM "trioq".job_rows j WHERE j.id = p_job_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'send: no job %', p_job_id USING ERRCODE = 'P0002';
    END IF;
    -- Final: the job has its outcome (migration 0049; a completion appends it without the
    -- record's lock, so a message sent as the job finishes may still be queued: it goes with
    -- the job).
    SELECT o.state INTO final_state FROM "trioq".job_outcomes o WHERE o.job_id = p_job_id;
    IF FOUND THEN
        RAISE EXCEPTION 'send: job % is % (final): it receives no more messages',
            p_job_id, final_state USING ERRCODE = 'P0001';
    END IF;
    IF job_state = 'waiting' AND job_topic = p_topic AND job_position IS NOT NULL THEN
        -- A later statement: its snapshot sees the pending checkpoint the receive committed.
        UPDATE "trioq".checkpoints c
        SET value = jsonb_build_object('messages',
                                       jsonb_build_array(coalesce(p_payload, 'null')))
        WHERE c.job_id = p_job_id AND c.position = job_position AND c.kind = 'receive'
          AND c.name = p_topic AND c.value ? 'deadline' AND NOT c.value ? 'messages';
        IF FOUND THEN
            UPDATE "trioq".job_rows j
            SET phase = 'ready', filed = j.filed + 1, run_at = "trioq".db_now(),
                wait_topic = NULL, wait_position = NULL
            WHERE j.id = p_job_id
            RETURNING j.queue INTO job_queue;
            -- Woken: out of job_due (migration 0050), under the record's lock taken above.
            DELETE FROM "trioq".job_due d WHERE d.job_id = p_job_id;
            PERFORM pg_notify("trioq".ready_channel(job_queue), job_queue);
            RETURN nextval(pg_get_serial_sequence('"trioq".messages', 'id'));
        END IF;
    END IF;
    INSERT INTO "trioq".messages (job_id, topic, payload, created_at)
    VALUES (p_job_id, p_topic, coalesce(p_payload, 'null'), "trioq".db_now())
    RETURNING id INTO message_id;
    UPDATE "trioq".job_rows j
    SET phase = 'ready', filed = j.filed + 1, run_at = "trioq".db_now(), wait_topic = NULL,
        wait_position = NULL
    WHERE j.id = p_job_id AND j.phase = 'waiting' AND j.wait_topic = p_topic;
    IF FOUND THEN
        DELETE FROM "trioq".job_due d WHERE d.job_id = p_job_id;
    END IF;
    -- Woken just now, ready already, or due: a claim may have skipped it under our lock.
    SELECT count(pg_notify("trioq".ready_channel(j.queue), j.queue)) INTO woken_count
    FROM "trioq".job_rows j
    WHERE j.id = p_job_id
      AND NOT EXISTS (SELECT 1 FROM "trioq".job_runs u WHERE u.job_id = j.id)
      AND (j.phase = 'ready'
           OR (j.phase IN ('scheduled', 'sleeping', 'waiting') AND j.run_at <= "trioq".db_now()));
    RETURN message_id;
END
$$;

CREATE FUNCTION trioq.task_deadline_seconds(task text, version integer) RETURNS double precision
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN (SELECT d.deadline_seconds FROM "trioq".task_defaults d
            WHERE d.task OPERATOR(pg_catalog.=) task_deadline_seconds.task
              AND d.version OPERATOR(pg_catalog.=) task_deadline_seconds.version);
END
$$;

CREATE TABLE trioq.attempts (
    id bigint NOT NULL,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    outcome text NOT NULL,
    error_type text,
    error_message text,
    traceback text,
    trace_id text,
    worker_id uuid,
    started_at timestamp with time zone,
    finished_at timestamp with time zone NOT NULL,
    CONSTRAINT attempts_outcome_check CHECK ((outcome = ANY (ARRAY['retried'::text, 'failed'::text, 'lost'::text, 'cancelled'::text])))
)
PARTITION BY RANGE (job_id);

CREATE TABLE trioq.attempts_e0 (
    id bigint NOT NULL,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    outcome text NOT NULL,
    error_type text,
    error_message text,
    traceback text,
    trace_id text,
    worker_id uuid,
    started_at timestamp with time zone,
    finished_at timestamp with time zone NOT NULL,
    CONSTRAINT attempts_e0_bound CHECK ((job_id < '1099511627776'::bigint)),
    CONSTRAINT attempts_outcome_check CHECK ((outcome = ANY (ARRAY['retried'::text, 'failed'::text, 'lost'::text, 'cancelled'::text])))
)
WITH (autovacuum_vacuum_scale_factor='0.02', autovacuum_vacuum_threshold='1000', vacuum_truncate=off, toast.vacuum_truncate=off);

CREATE TABLE trioq.attempts_e1 (
    id bigint NOT NULL,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    outcome text NOT NULL,
    error_type text,
    error_message text,
    traceback text,
    trace_id text,
    worker_id uuid,
    started_at timestamp with time zone,
    finished_at timestamp with time zone NOT NULL,
    CONSTRAINT attempts_outcome_check CHECK ((outcome = ANY (ARRAY['retried'::text, 'failed'::text, 'lost'::text, 'cancelled'::text])))
)
WITH (vacuum_truncate=off, toast.vacuum_truncate=off);

ALTER TABLE trioq.attempts ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME trioq.attempts_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE trioq.checkpoints (
    job_id bigint NOT NULL,
    "position" integer NOT NULL,
    kind text NOT NULL,
    name text NOT NULL,
    value jsonb,
    created_at timestamp with time zone NOT NULL,
    CONSTRAINT checkpoints_position_check CHECK (("position" >= 0))
)
PARTITION BY RANGE (job_id);

CREATE TABLE trioq.checkpoints_e0 (
    job_id bigint NOT NULL,
    "position" integer NOT NULL,
    kind text NOT NULL,
    name text NOT NULL,
    value jsonb,
    created_at timestamp with time zone NOT NULL,
    CONSTRAINT checkpoints_e0_bound CHECK ((job_id < '1099511627776'::bigint)),
    CONSTRAINT checkpoints_position_check CHECK (("position" >= 0))
)
WITH (vacuum_truncate=off, toast.vacuum_truncate=off);

CREATE TABLE trioq.checkpoints_e1 (
    job_id bigint NOT NULL,
    "position" integer NOT NULL,
    kind text NOT NULL,
    name text NOT NULL,
    value jsonb,
    created_at timestamp with time zone NOT NULL,
    CONSTRAINT checkpoints_position_check CHECK (("position" >= 0))
)
WITH (vacuum_truncate=off, toast.vacuum_truncate=off);

CREATE TABLE trioq.concurrency_holds (
    concurrency_key text NOT NULL,
    slot integer NOT NULL,
    job_id bigint NOT NULL,
    CONSTRAINT concurrency_holds_slot_check CHECK ((slot >= 0))
);

CREATE TABLE trioq.concurrency_limits (
    pattern text NOT NULL,
    max_running integer NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    CONSTRAINT concurrency_limits_max_running_check CHECK (((max_running >= 1) AND (max_running <= 10000))),
    CONSTRAINT concurrency_limits_pattern_check CHECK ((((length(pattern) >= 1) AND (length(pattern) <= 512)) AND (POSITION(('*'::text) IN ("left"(pattern, '-1'::integer))) = 0)))
);

CREATE TABLE trioq.concurrency_rate_starts (
    concurrency_key text NOT NULL,
    slot integer NOT NULL,
    started_at timestamp with time zone NOT NULL,
    rate_period double precision NOT NULL,
    job_id bigint NOT NULL,
    CONSTRAINT concurrency_rate_starts_slot_check CHECK ((slot >= 0))
);

CREATE TABLE trioq.concurrency_rates (
    pattern text NOT NULL,
    rate_allowed integer NOT NULL,
    rate_period double precision NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    CONSTRAINT concurrency_rates_pattern_check CHECK ((((length(pattern) >= 1) AND (length(pattern) <= 512)) AND (POSITION(('*'::text) IN ("left"(pattern, '-1'::integer))) = 0))),
    CONSTRAINT concurrency_rates_rate_allowed_check CHECK (((rate_allowed >= 1) AND (rate_allowed <= 10000))),
    CONSTRAINT concurrency_rates_rate_period_check CHECK ((rate_period > (0)::double precision))
);

CREATE TABLE trioq.dashboard_audit (
    id bigint NOT NULL,
    at timestamp with time zone NOT NULL,
    actor text NOT NULL,
    address text NOT NULL,
    action text NOT NULL,
    target text NOT NULL,
    detail jsonb DEFAULT '{}'::jsonb NOT NULL,
    outcome text,
    CONSTRAINT dashboard_audit_action_check CHECK (((length(action) >= 1) AND (length(action) <= 64))),
    CONSTRAINT dashboard_audit_actor_check CHECK (((length(actor) >= 1) AND (length(actor) <= 256))),
    CONSTRAINT dashboard_audit_address_check CHECK ((length(address) <= 256)),
    CONSTRAINT dashboard_audit_outcome_check CHECK ((length(outcome) <= 4096)),
    CONSTRAINT dashboard_audit_target_check CHECK ((length(target) <= 1024))
);

ALTER TABLE trioq.dashboard_audit ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME trioq.dashboard_audit_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE trioq.events (
    key text NOT NULL,
    payload jsonb,
    emitted_at timestamp with time zone,
    created_at timestamp with time zone NOT NULL,
    CONSTRAINT events_key_check CHECK (((length(key) >= 1) AND (length(key) <= 512)))
);

CREATE TABLE trioq.function_digest (
    digest text NOT NULL,
    applied_at timestamp with time zone NOT NULL
);

CREATE TABLE trioq.job_due (
    job_id bigint NOT NULL,
    queue text NOT NULL,
    state text NOT NULL,
    run_at timestamp with time zone,
    CONSTRAINT job_due_state_check CHECK ((state = ANY (ARRAY['scheduled'::text, 'sleeping'::text, 'waiting'::text])))
)
WITH (autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_threshold='1000', autovacuum_vacuum_insert_scale_factor='0.02', autovacuum_analyze_scale_factor='0.02', autovacuum_vacuum_cost_delay='1', vacuum_truncate=off);

CREATE TABLE trioq.job_keys (
    key trioq.job_dedup_key NOT NULL,
    job_id bigint NOT NULL,
    task trioq.job_task NOT NULL
)
WITH (fillfactor='80', autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_threshold='1000', autovacuum_analyze_scale_factor='0.02', vacuum_truncate=off);

CREATE TABLE trioq.job_outcomes (
    job_id bigint NOT NULL,
    state text NOT NULL,
    result jsonb,
    error jsonb,
    attempt integer NOT NULL,
    executions integer NOT NULL,
    worker_id uuid,
    started_at timestamp with time zone,
    finished_at timestamp with time zone NOT NULL,
    queue text NOT NULL,
    CONSTRAINT job_outcomes_state_check CHECK ((state = ANY ('{completed,failed,cancelled}'::text[])))
)
PARTITION BY RANGE (job_id);

CREATE TABLE trioq.job_outcomes_e0 (
    job_id bigint NOT NULL,
    state text NOT NULL,
    result jsonb,
    error jsonb,
    attempt integer NOT NULL,
    executions integer NOT NULL,
    worker_id uuid,
    started_at timestamp with time zone,
    finished_at timestamp with time zone NOT NULL,
    queue text NOT NULL,
    CONSTRAINT job_outcomes_state_check CHECK ((state = ANY ('{completed,failed,cancelled}'::text[])))
)
WITH (vacuum_truncate=off, toast.vacuum_truncate=off);

CREATE TABLE trioq.job_outcomes_e1 (
    job_id bigint NOT NULL,
    state text NOT NULL,
    result jsonb,
    error jsonb,
    attempt integer NOT NULL,
    executions integer NOT NULL,
    worker_id uuid,
    started_at timestamp with time zone,
    finished_at timestamp with time zone NOT NULL,
    queue text NOT NULL,
    CONSTRAINT job_outcomes_state_check CHECK ((state = ANY ('{completed,failed,cancelled}'::text[])))
)
WITH (vacuum_truncate=off, toast.vacuum_truncate=off);

CREATE TABLE trioq.job_rows (
    id bigint NOT NULL,
    queue trioq.job_queue NOT NULL,
    task trioq.job_task NOT NULL,
    payload trioq.job_payload NOT NULL,
    phase text DEFAULT 'ready'::text NOT NULL,
    priority smallint DEFAULT 0 NOT NULL,
    run_at timestamp with time zone,
    partition_key trioq.job_partition_key,
    dedup_key trioq.job_dedup_key,
    attempt trioq.job_attempt DEFAULT 0 NOT NULL,
    max_attempts trioq.job_max_attempts,
    worker_id uuid,
    cancel_requested boolean DEFAULT false NOT NULL,
    error jsonb,
    created_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone,
    checkpoint_count trioq.job_checkpoint_count DEFAULT 0 NOT NULL,
    parent_id bigint,
    parent_position integer,
    wait_event_key text,
    wait_children bigint[],
    children_settled integer DEFAULT 0 NOT NULL,
    unique_states trioq.job_unique_states DEFAULT '{}'::text[] NOT NULL,
    unique_until timestamp with time zone,
    trace_context trioq.job_trace_context,
    version trioq.job_version DEFAULT 1 NOT NULL,
    wait_topic text,
    on_parent_cancel trioq.job_on_parent_cancel DEFAULT 'cancel'::text NOT NULL,
    executions integer DEFAULT 0 NOT NULL,
    deadline_at timestamp with time zone,
    deadline_source text,
    traced boolean DEFAULT false NOT NULL,
    wait_position integer,
    concurrency_key trioq.job_concurrency_key,
    concurrency_limit trioq.job_concurrency_limit,
    result_watched boolean DEFAULT false NOT NULL,
    filed integer DEFAULT 0 NOT NULL,
    CONSTRAINT jobs_one_kind_of_key CHECK (((partition_key IS NULL) OR (concurrency_key IS NULL))),
    CONSTRAINT jobs_phase_check CHECK ((phase = ANY ('{scheduled,ready,claimed,sleeping,waiting,done}'::text[]))),
    CONSTRAINT jobs_run_at_check CHECK (((run_at IS NOT NULL) OR (phase = ANY ('{waiting,done}'::text[]))))
)
PARTITION BY RANGE (id);

CREATE TABLE trioq.job_runs (
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    lease_token uuid NOT NULL,
    lease_expires_at timestamp with time zone NOT NULL,
    worker_id uuid,
    traced boolean NOT NULL,
    started_at timestamp with time zone,
    executions integer NOT NULL,
    queue text NOT NULL,
    partition_key text,
    concurrency_key text,
    parent_id bigint,
    result_watched boolean NOT NULL
)
WITH (fillfactor='70', autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_threshold='1000', autovacuum_analyze_scale_factor='0.02', vacuum_truncate=off);

CREATE VIEW trioq.jobs AS
 SELECT j.id,
    j.queue,
    j.task,
    j.payload,
        CASE
            WHEN (o.job_id IS NOT NULL) THEN o.state
            WHEN (u.job_id IS NOT NULL) THEN 'running'::text
            ELSE j.phase
        END AS state,
    j.priority,
    j.run_at,
    j.partition_key,
    j.dedup_key,
    COALESCE(o.attempt, u.attempt, (j.attempt)::integer) AS attempt,
    j.max_attempts,
    u.lease_token,
    u.lease_expires_at,
    COALESCE(o.worker_id, u.worker_id, j.worker_id) AS worker_id,
    j.cancel_requested,
    o.result,
        CASE
            WHEN (o.job_id IS NOT NULL) THEN o.error
            WHEN (u.job_id IS NOT NULL) THEN NULL::jsonb
            ELSE j.error
        END AS error,
    j.created_at,
    COALESCE(o.started_at, u.started_at, j.started_at) AS started_at,
    o.finished_at,
    j.checkpoint_count,
    j.parent_id,
    j.parent_position,
    j.wait_event_key,
    j.wait_children,
    j.children_settled,
    j.unique_states,
    j.unique_until,
    j.trace_context,
    j.version,
    j.wait_topic,
    j.on_parent_cancel,
    COALESCE(o.executions, u.executions, j.executions) AS executions,
    j.deadline_at,
    j.deadline_source,
    COALESCE(u.traced, j.traced) AS traced,
    j.wait_position,
    j.concurrency_key,
    j.concurrency_limit,
    (j.result_watched OR COALESCE(u.result_watched, false)) AS result_watched
   FROM ((trioq.job_rows j
     LEFT JOIN trioq.job_runs u ON ((u.job_id = j.id)))
     LEFT JOIN trioq.job_outcomes o ON ((o.job_id = j.id)));

CREATE TABLE trioq.task_defaults (
    task text NOT NULL,
    version integer NOT NULL,
    max_attempts integer NOT NULL,
    declared_at timestamp with time zone NOT NULL,
    deadline_seconds double precision,
    CONSTRAINT task_defaults_deadline_seconds_check CHECK ((deadline_seconds > (0)::double precision)),
    CONSTRAINT task_defaults_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 1000)))
);

CREATE VIEW trioq.job_records AS
 SELECT j.id,
    j.queue,
    j.task,
    j.payload,
    j.state,
    j.priority,
    j.run_at,
    j.partition_key,
    ( SELECT k.key
           FROM trioq.job_keys k
          WHERE (((k.key)::text = (j.dedup_key)::text) AND (k.job_id = j.id))) AS dedup_key,
    j.attempt,
    COALESCE((j.max_attempts)::integer, ( SELECT d.max_attempts
           FROM trioq.task_defaults d
          WHERE ((d.task = (j.task)::text) AND (d.version = (j.version)::integer))), 5) AS max_attempts,
    j.worker_id,
    j.result,
    j.error,
    j.created_at,
    j.started_at,
    j.finished_at,
    j.executions,
    j.deadline_at,
    j.deadline_source
   FROM trioq.jobs j;

CREATE TABLE trioq.job_rows_e0 (
    id bigint NOT NULL,
    queue trioq.job_queue NOT NULL,
    task trioq.job_task NOT NULL,
    payload trioq.job_payload NOT NULL,
    phase text DEFAULT 'ready'::text NOT NULL,
    priority smallint DEFAULT 0 NOT NULL,
    run_at timestamp with time zone,
    partition_key trioq.job_partition_key,
    dedup_key trioq.job_dedup_key,
    attempt trioq.job_attempt DEFAULT 0 NOT NULL,
    max_attempts trioq.job_max_attempts,
    worker_id uuid,
    cancel_requested boolean DEFAULT false NOT NULL,
    error jsonb,
    created_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone,
    checkpoint_count trioq.job_checkpoint_count DEFAULT 0 NOT NULL,
    parent_id bigint,
    parent_position integer,
    wait_event_key text,
    wait_children bigint[],
    children_settled integer DEFAULT 0 NOT NULL,
    unique_states trioq.job_unique_states DEFAULT '{}'::text[] NOT NULL,
    unique_until timestamp with time zone,
    trace_context trioq.job_trace_context,
    version trioq.job_version DEFAULT 1 NOT NULL,
    wait_topic text,
    on_parent_cancel trioq.job_on_parent_cancel DEFAULT 'cancel'::text NOT NULL,
    executions integer DEFAULT 0 NOT NULL,
    deadline_at timestamp with time zone,
    deadline_source text,
    traced boolean DEFAULT false NOT NULL,
    wait_position integer,
    concurrency_key trioq.job_concurrency_key,
    concurrency_limit trioq.job_concurrency_limit,
    result_watched boolean DEFAULT false NOT NULL,
    filed integer DEFAULT 0 NOT NULL,
    CONSTRAINT jobs_one_kind_of_key CHECK (((partition_key IS NULL) OR (concurrency_key IS NULL))),
    CONSTRAINT jobs_phase_check CHECK ((phase = ANY ('{scheduled,ready,claimed,sleeping,waiting,done}'::text[]))),
    CONSTRAINT jobs_run_at_check CHECK (((run_at IS NOT NULL) OR (phase = ANY ('{waiting,done}'::text[]))))
)
WITH (vacuum_truncate=off, toast.vacuum_truncate=off);

CREATE TABLE trioq.job_rows_e1 (
    id bigint NOT NULL,
    queue trioq.job_queue NOT NULL,
    task trioq.job_task NOT NULL,
    payload trioq.job_payload NOT NULL,
    phase text DEFAULT 'ready'::text NOT NULL,
    priority smallint DEFAULT 0 NOT NULL,
    run_at timestamp with time zone,
    partition_key trioq.job_partition_key,
    dedup_key trioq.job_dedup_key,
    attempt trioq.job_attempt DEFAULT 0 NOT NULL,
    max_attempts trioq.job_max_attempts,
    worker_id uuid,
    cancel_requested boolean DEFAULT false NOT NULL,
    error jsonb,
    created_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone,
    checkpoint_count trioq.job_checkpoint_count DEFAULT 0 NOT NULL,
    parent_id bigint,
    parent_position integer,
    wait_event_key text,
    wait_children bigint[],
    children_settled integer DEFAULT 0 NOT NULL,
    unique_states trioq.job_unique_states DEFAULT '{}'::text[] NOT NULL,
    unique_until timestamp with time zone,
    trace_context trioq.job_trace_context,
    version trioq.job_version DEFAULT 1 NOT NULL,
    wait_topic text,
    on_parent_cancel trioq.job_on_parent_cancel DEFAULT 'cancel'::text NOT NULL,
    executions integer DEFAULT 0 NOT NULL,
    deadline_at timestamp with time zone,
    deadline_source text,
    traced boolean DEFAULT false NOT NULL,
    wait_position integer,
    concurrency_key trioq.job_concurrency_key,
    concurrency_limit trioq.job_concurrency_limit,
    result_watched boolean DEFAULT false NOT NULL,
    filed integer DEFAULT 0 NOT NULL,
    CONSTRAINT jobs_one_kind_of_key CHECK (((partition_key IS NULL) OR (concurrency_key IS NULL))),
    CONSTRAINT jobs_phase_check CHECK ((phase = ANY ('{scheduled,ready,claimed,sleeping,waiting,done}'::text[]))),
    CONSTRAINT jobs_run_at_check CHECK (((run_at IS NOT NULL) OR (phase = ANY ('{waiting,done}'::text[]))))
)
WITH (vacuum_truncate=off, toast.vacuum_truncate=off);

ALTER TABLE trioq.job_rows ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME trioq.jobs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE trioq.leader (
    seat integer DEFAULT 1 NOT NULL,
    leader_id uuid NOT NULL,
    scheduler boolean NOT NULL,
    elected_at timestamp with time zone NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    CONSTRAINT leader_seat_check CHECK ((seat = 1))
);

CREATE TABLE trioq.messages (
    id bigint NOT NULL,
    job_id bigint NOT NULL,
    topic text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamp with time zone NOT NULL,
    CONSTRAINT messages_topic_check CHECK (((length(topic) >= 1) AND (length(topic) <= 512)))
);

ALTER TABLE trioq.messages ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME trioq.messages_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE trioq.migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE trioq.partition_locks (
    queue text NOT NULL,
    partition_key text NOT NULL,
    job_id bigint NOT NULL
)
WITH (vacuum_truncate=off);

CREATE TABLE trioq.queue_limits (
    queue text NOT NULL,
    global_limit integer,
    rate_allowed integer,
    rate_period double precision,
    recent_starts timestamp with time zone[] DEFAULT '{}'::timestamp with time zone[] NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    CONSTRAINT queue_limits_check CHECK (((rate_allowed IS NULL) = (rate_period IS NULL))),
    CONSTRAINT queue_limits_check1 CHECK (((global_limit IS NOT NULL) OR (rate_allowed IS NOT NULL))),
    CONSTRAINT queue_limits_global_limit_check CHECK (((global_limit >= 1) AND (global_limit <= 100000))),
    CONSTRAINT queue_limits_rate_allowed_check CHECK (((rate_allowed >= 1) AND (rate_allowed <= 10000))),
    CONSTRAINT queue_limits_rate_period_check CHECK ((rate_period > (0)::double precision))
);

CREATE TABLE trioq.queue_pauses (
    queue text NOT NULL,
    paused_at timestamp with time zone NOT NULL,
    CONSTRAINT queue_pauses_queue_check CHECK ((queue ~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$'::text))
);

CREATE TABLE trioq.ready_keyed (
    queue text NOT NULL,
    kind "char" NOT NULL,
    key text NOT NULL,
    priority smallint NOT NULL,
    run_at timestamp with time zone NOT NULL,
    id bigint NOT NULL,
    filed integer NOT NULL,
    task text NOT NULL,
    version integer NOT NULL,
    concurrency_limit integer,
    CONSTRAINT ready_keyed_kind_check CHECK ((kind = ANY (ARRAY['p'::"char", 'c'::"char"])))
)
WITH (autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_threshold='1000', autovacuum_vacuum_insert_scale_factor='0.02', autovacuum_analyze_scale_factor='0.02', autovacuum_vacuum_cost_delay='1', vacuum_truncate=off);

CREATE TABLE trioq.ready_ring (
    slot smallint NOT NULL,
    queue text NOT NULL,
    task text NOT NULL,
    version integer NOT NULL,
    priority smallint NOT NULL,
    run_at timestamp with time zone NOT NULL,
    id bigint NOT NULL,
    filed integer DEFAULT 0 NOT NULL
)
PARTITION BY LIST (slot);

CREATE TABLE trioq.ready_ring_0 (
    slot smallint NOT NULL,
    queue text NOT NULL,
    task text NOT NULL,
    version integer NOT NULL,
    priority smallint NOT NULL,
    run_at timestamp with time zone NOT NULL,
    id bigint NOT NULL,
    filed integer DEFAULT 0 NOT NULL
)
WITH (vacuum_truncate=off);

CREATE TABLE trioq.ready_ring_1 (
    slot smallint NOT NULL,
    queue text NOT NULL,
    task text NOT NULL,
    version integer NOT NULL,
    priority smallint NOT NULL,
    run_at timestamp with time zone NOT NULL,
    id bigint NOT NULL,
    filed integer DEFAULT 0 NOT NULL
)
WITH (vacuum_truncate=off);

CREATE TABLE trioq.ready_ring_2 (
    slot smallint NOT NULL,
    queue text NOT NULL,
    task text NOT NULL,
    version integer NOT NULL,
    priority smallint NOT NULL,
    run_at timestamp with time zone NOT NULL,
    id bigint NOT NULL,
    filed integer DEFAULT 0 NOT NULL
)
WITH (vacuum_truncate=off);

CREATE TABLE trioq.ready_ring_3 (
    slot smallint NOT NULL,
    queue text NOT NULL,
    task text NOT NULL,
    version integer NOT NULL,
    priority smallint NOT NULL,
    run_at timestamp with time zone NOT NULL,
    id bigint NOT NULL,
    filed integer DEFAULT 0 NOT NULL
)
WITH (vacuum_truncate=off);

CREATE TABLE trioq.ready_ring_state (
    one boolean DEFAULT true NOT NULL,
    base smallint DEFAULT 0 NOT NULL,
    low smallint DEFAULT 0 NOT NULL,
    blocked_since timestamp with time zone,
    moved_at timestamp with time zone,
    retired_tried_at timestamp with time zone,
    CONSTRAINT ready_ring_state_one_check CHECK (one)
);

CREATE TABLE trioq.satellite_epochs (
    epoch integer NOT NULL,
    low bigint,
    high bigint NOT NULL,
    started_at timestamp with time zone,
    ended_at timestamp with time zone,
    CONSTRAINT satellite_epochs_epoch_check CHECK ((epoch >= 0))
);

CREATE TABLE trioq.schedules (
    name text NOT NULL,
    task text NOT NULL,
    queue text NOT NULL,
    payload jsonb NOT NULL,
    cron text NOT NULL,
    timezone text NOT NULL,
    misfire text NOT NULL,
    catchup_limit integer NOT NULL,
    max_attempts integer NOT NULL,
    version integer DEFAULT 1 NOT NULL,
    origin text NOT NULL,
    anchor_at timestamp with time zone NOT NULL,
    next_fire_at timestamp with time zone,
    last_fire_at timestamp with time zone,
    fired bigint DEFAULT 0 NOT NULL,
    missed bigint DEFAULT 0 NOT NULL,
    created_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    CONSTRAINT schedules_catchup_limit_check CHECK (((catchup_limit >= 1) AND (catchup_limit <= 10000))),
    CONSTRAINT schedules_cron_check CHECK (((length(cron) >= 1) AND (length(cron) <= 256))),
    CONSTRAINT schedules_max_attempts_check CHECK ((max_attempts >= 1)),
    CONSTRAINT schedules_misfire_check CHECK ((misfire = ANY (ARRAY['skip'::text, 'latest'::text, 'all'::text]))),
    CONSTRAINT schedules_name_check CHECK ((name ~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$'::text)),
    CONSTRAINT schedules_origin_check CHECK ((origin = ANY (ARRAY['code'::text, 'runtime'::text]))),
    CONSTRAINT schedules_payload_check CHECK ((pg_column_size(payload) <= 4000000)),
    CONSTRAINT schedules_queue_check CHECK ((queue ~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$'::text)),
    CONSTRAINT schedules_task_check CHECK ((task ~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$'::text)),
    CONSTRAINT schedules_timezone_check CHECK (((length(timezone) >= 1) AND (length(timezone) <= 128))),
    CONSTRAINT schedules_version_check CHECK ((version >= 1))
);

CREATE TABLE trioq.workers (
    id uuid NOT NULL,
    hostname text NOT NULL,
    pid integer NOT NULL,
    queues text[] NOT NULL,
    concurrency integer NOT NULL,
    state text DEFAULT 'running'::text NOT NULL,
    started_at timestamp with time zone NOT NULL,
    heartbeat_at timestamp with time zone NOT NULL,
    task_versions text[] DEFAULT '{}'::text[] NOT NULL,
    admission jsonb,
    queue_concurrency integer[],
    heartbeat_seconds double precision,
    CONSTRAINT workers_heartbeat_seconds_check CHECK ((heartbeat_seconds > (0)::double precision)),
    CONSTRAINT workers_state_check CHECK ((state = ANY (ARRAY['running'::text, 'draining'::text, 'stopped'::text])))
)
WITH (vacuum_truncate=off);

CREATE TABLE trioq.workflow_values (
    job_id bigint NOT NULL,
    key text NOT NULL,
    value jsonb NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    CONSTRAINT workflow_values_key_check CHECK (((length(key) >= 1) AND (length(key) <= 512)))
)
PARTITION BY RANGE (job_id);

CREATE TABLE trioq.workflow_values_e0 (
    job_id bigint NOT NULL,
    key text NOT NULL,
    value jsonb NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    CONSTRAINT workflow_values_e0_bound CHECK ((job_id < '1099511627776'::bigint)),
    CONSTRAINT workflow_values_key_check CHECK (((length(key) >= 1) AND (length(key) <= 512)))
);

CREATE TABLE trioq.workflow_values_e1 (
    job_id bigint NOT NULL,
    key text NOT NULL,
    value jsonb NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    CONSTRAINT workflow_values_key_check CHECK (((length(key) >= 1) AND (length(key) <= 512)))
)
WITH (vacuum_truncate=off, toast.vacuum_truncate=off);

ALTER TABLE ONLY trioq.attempts ATTACH PARTITION trioq.attempts_e0 FOR VALUES FROM (MINVALUE) TO ('1099511627776');

ALTER TABLE ONLY trioq.attempts ATTACH PARTITION trioq.attempts_e1 FOR VALUES FROM ('1099511627776') TO ('1103806595072');

ALTER TABLE ONLY trioq.checkpoints ATTACH PARTITION trioq.checkpoints_e0 FOR VALUES FROM (MINVALUE) TO ('1099511627776');

ALTER TABLE ONLY trioq.checkpoints ATTACH PARTITION trioq.checkpoints_e1 FOR VALUES FROM ('1099511627776') TO ('1103806595072');

ALTER TABLE ONLY trioq.job_outcomes ATTACH PARTITION trioq.job_outcomes_e0 FOR VALUES FROM (MINVALUE) TO ('1099511627776');

ALTER TABLE ONLY trioq.job_outcomes ATTACH PARTITION trioq.job_outcomes_e1 FOR VALUES FROM ('1099511627776') TO ('1103806595072');

ALTER TABLE ONLY trioq.job_rows ATTACH PARTITION trioq.job_rows_e0 FOR VALUES FROM (MINVALUE) TO ('1099511627776');

ALTER TABLE ONLY trioq.job_rows ATTACH PARTITION trioq.job_rows_e1 FOR VALUES FROM ('1099511627776') TO ('1103806595072');

ALTER TABLE ONLY trioq.ready_ring ATTACH PARTITION trioq.ready_ring_0 FOR VALUES IN ('0');

ALTER TABLE ONLY trioq.ready_ring ATTACH PARTITION trioq.ready_ring_1 FOR VALUES IN ('1');

ALTER TABLE ONLY trioq.ready_ring ATTACH PARTITION trioq.ready_ring_2 FOR VALUES IN ('2');

ALTER TABLE ONLY trioq.ready_ring ATTACH PARTITION trioq.ready_ring_3 FOR VALUES IN ('3');

ALTER TABLE ONLY trioq.workflow_values ATTACH PARTITION trioq.workflow_values_e0 FOR VALUES FROM (MINVALUE) TO ('1099511627776');

ALTER TABLE ONLY trioq.workflow_values ATTACH PARTITION trioq.workflow_values_e1 FOR VALUES FROM ('1099511627776') TO ('1103806595072');

ALTER TABLE ONLY trioq.attempts
    ADD CONSTRAINT attempts_pkey PRIMARY KEY (job_id, id);

ALTER TABLE ONLY trioq.attempts_e0
    ADD CONSTRAINT attempts_e0_pkey PRIMARY KEY (job_id, id);

ALTER TABLE ONLY trioq.attempts_e1
    ADD CONSTRAINT attempts_e1_pkey PRIMARY KEY (job_id, id);

ALTER TABLE ONLY trioq.checkpoints
    ADD CONSTRAINT checkpoints_pkey PRIMARY KEY (job_id, "position");

ALTER TABLE ONLY trioq.checkpoints_e0
    ADD CONSTRAINT checkpoints_e0_pkey PRIMARY KEY (job_id, "position");

ALTER TABLE ONLY trioq.checkpoints_e1
    ADD CONSTRAINT checkpoints_e1_pkey PRIMARY KEY (job_id, "position");

ALTER TABLE ONLY trioq.concurrency_holds
    ADD CONSTRAINT concurrency_holds_pkey PRIMARY KEY (concurrency_key, slot);

ALTER TABLE ONLY trioq.concurrency_limits
    ADD CONSTRAINT concurrency_limits_pkey PRIMARY KEY (pattern);

ALTER TABLE ONLY trioq.concurrency_rate_starts
    ADD CONSTRAINT concurrency_rate_starts_pkey PRIMARY KEY (concurrency_key, slot);

ALTER TABLE ONLY trioq.concurrency_rates
    ADD CONSTRAINT concurrency_rates_pkey PRIMARY KEY (pattern);

ALTER TABLE ONLY trioq.dashboard_audit
    ADD CONSTRAINT dashboard_audit_pkey PRIMARY KEY (id);

ALTER TABLE ONLY trioq.events
    ADD CONSTRAINT events_pkey PRIMARY KEY (key);

ALTER TABLE ONLY trioq.job_due
    ADD CONSTRAINT job_due_pkey PRIMARY KEY (job_id);

ALTER TABLE ONLY trioq.job_keys
    ADD CONSTRAINT job_keys_pkey PRIMARY KEY (key);

ALTER TABLE ONLY trioq.job_outcomes
    ADD CONSTRAINT job_outcomes_pkey PRIMARY KEY (job_id);

ALTER TABLE ONLY trioq.job_outcomes_e0
    ADD CONSTRAINT job_outcomes_e0_pkey PRIMARY KEY (job_id);

ALTER TABLE ONLY trioq.job_outcomes_e1
    ADD CONSTRAINT job_outcomes_e1_pkey PRIMARY KEY (job_id);

ALTER TABLE ONLY trioq.job_rows
    ADD CONSTRAINT job_rows_pkey PRIMARY KEY (id);

ALTER TABLE ONLY trioq.job_rows_e0
    ADD CONSTRAINT job_rows_e0_pkey PRIMARY KEY (id);

ALTER TABLE ONLY trioq.job_rows_e1
    ADD CONSTRAINT job_rows_e1_pkey PRIMARY KEY (id);

ALTER TABLE ONLY trioq.job_runs
    ADD CONSTRAINT job_runs_pkey PRIMARY KEY (job_id);

ALTER TABLE ONLY trioq.leader
    ADD CONSTRAINT leader_pkey PRIMARY KEY (seat);

ALTER TABLE ONLY trioq.messages
    ADD CONSTRAINT messages_pkey PRIMARY KEY (id);

ALTER TABLE ONLY trioq.migrations
    ADD CONSTRAINT migrations_pkey PRIMARY KEY (version);

ALTER TABLE ONLY trioq.partition_locks
    ADD CONSTRAINT partition_locks_pkey PRIMARY KEY (queue, partition_key);

ALTER TABLE ONLY trioq.queue_limits
    ADD CONSTRAINT queue_limits_pkey PRIMARY KEY (queue);

ALTER TABLE ONLY trioq.queue_pauses
    ADD CONSTRAINT queue_pauses_pkey PRIMARY KEY (queue);

ALTER TABLE ONLY trioq.ready_keyed
    ADD CONSTRAINT ready_keyed_pkey PRIMARY KEY (queue, kind, key, priority, run_at, id);

ALTER TABLE ONLY trioq.ready_ring_state
    ADD CONSTRAINT ready_ring_state_pkey PRIMARY KEY (one);

ALTER TABLE ONLY trioq.satellite_epochs
    ADD CONSTRAINT satellite_epochs_pkey PRIMARY KEY (epoch);

ALTER TABLE ONLY trioq.schedules
    ADD CONSTRAINT schedules_pkey PRIMARY KEY (name);

ALTER TABLE ONLY trioq.task_defaults
    ADD CONSTRAINT task_defaults_pkey PRIMARY KEY (task, version);

ALTER TABLE ONLY trioq.workers
    ADD CONSTRAINT workers_pkey PRIMARY KEY (id);

ALTER TABLE ONLY trioq.workflow_values
    ADD CONSTRAINT workflow_values_pkey PRIMARY KEY (job_id, key);

ALTER TABLE ONLY trioq.workflow_values_e0
    ADD CONSTRAINT workflow_values_e0_pkey PRIMARY KEY (job_id, key);

ALTER TABLE ONLY trioq.workflow_values_e1
    ADD CONSTRAINT workflow_values_e1_pkey PRIMARY KEY (job_id, key);

CREATE INDEX attempts_job_idx ON ONLY trioq.attempts USING btree (job_id, attempt);

CREATE INDEX attempts_e0_job_idx ON trioq.attempts_e0 USING btree (job_id, attempt);

CREATE INDEX attempts_e1_job_id_attempt_idx ON trioq.attempts_e1 USING btree (job_id, attempt);

CREATE INDEX events_age_idx ON trioq.events USING btree (COALESCE(emitted_at, created_at));

CREATE INDEX job_due_queue_idx ON trioq.job_due USING btree (queue, run_at);

CREATE INDEX job_due_state_idx ON trioq.job_due USING btree (state, job_id);

CREATE INDEX job_outcomes_finished_idx ON ONLY trioq.job_outcomes USING btree (finished_at);

CREATE INDEX job_outcomes_e0_finished_at_idx ON trioq.job_outcomes_e0 USING btree (finished_at);

CREATE INDEX job_outcomes_e1_finished_at_idx ON trioq.job_outcomes_e1 USING btree (finished_at);

CREATE INDEX jobs_deadline_idx ON ONLY trioq.job_rows USING btree (deadline_at) WHERE ((deadline_at IS NOT NULL) AND (NOT cancel_requested) AND (phase <> 'done'::text));

CREATE INDEX job_rows_e0_deadline_at_idx ON trioq.job_rows_e0 USING btree (deadline_at) WHERE ((deadline_at IS NOT NULL) AND (NOT cancel_requested) AND (phase <> 'done'::text));

CREATE INDEX jobs_parent_idx ON ONLY trioq.job_rows USING btree (parent_id, parent_position) WHERE (parent_id IS NOT NULL);

CREATE INDEX job_rows_e0_parent_id_parent_position_idx ON trioq.job_rows_e0 USING btree (parent_id, parent_position) WHERE (parent_id IS NOT NULL);

CREATE INDEX jobs_wait_event_idx ON ONLY trioq.job_rows USING btree (wait_event_key) WHERE (wait_event_key IS NOT NULL);

CREATE INDEX job_rows_e0_wait_event_key_idx ON trioq.job_rows_e0 USING btree (wait_event_key) WHERE (wait_event_key IS NOT NULL);

CREATE INDEX job_rows_e1_deadline_at_idx ON trioq.job_rows_e1 USING btree (deadline_at) WHERE ((deadline_at IS NOT NULL) AND (NOT cancel_requested) AND (phase <> 'done'::text));

CREATE INDEX job_rows_e1_parent_id_parent_position_idx ON trioq.job_rows_e1 USING btree (parent_id, parent_position) WHERE (parent_id IS NOT NULL);

CREATE INDEX job_rows_e1_wait_event_key_idx ON trioq.job_rows_e1 USING btree (wait_event_key) WHERE (wait_event_key IS NOT NULL);

CREATE INDEX messages_job_topic_idx ON trioq.messages USING btree (job_id, topic, id);

CREATE INDEX partition_locks_job_idx ON trioq.partition_locks USING btree (job_id);

CREATE INDEX ready_ring_claim_idx ON ONLY trioq.ready_ring USING btree (queue, task, priority, run_at, id);

CREATE INDEX ready_ring_0_queue_task_priority_run_at_id_idx ON trioq.ready_ring_0 USING btree (queue, task, priority, run_at, id);

CREATE INDEX ready_ring_1_queue_task_priority_run_at_id_idx ON trioq.ready_ring_1 USING btree (queue, task, priority, run_at, id);

CREATE INDEX ready_ring_2_queue_task_priority_run_at_id_idx ON trioq.ready_ring_2 USING btree (queue, task, priority, run_at, id);

CREATE INDEX ready_ring_3_queue_task_priority_run_at_id_idx ON trioq.ready_ring_3 USING btree (queue, task, priority, run_at, id);

CREATE INDEX schedules_next_fire_idx ON trioq.schedules USING btree (next_fire_at NULLS FIRST);

ALTER INDEX trioq.attempts_job_idx ATTACH PARTITION trioq.attempts_e0_job_idx;

ALTER INDEX trioq.attempts_pkey ATTACH PARTITION trioq.attempts_e0_pkey;

ALTER INDEX trioq.attempts_job_idx ATTACH PARTITION trioq.attempts_e1_job_id_attempt_idx;

ALTER INDEX trioq.attempts_pkey ATTACH PARTITION trioq.attempts_e1_pkey;

ALTER INDEX trioq.checkpoints_pkey ATTACH PARTITION trioq.checkpoints_e0_pkey;

ALTER INDEX trioq.checkpoints_pkey ATTACH PARTITION trioq.checkpoints_e1_pkey;

ALTER INDEX trioq.job_outcomes_finished_idx ATTACH PARTITION trioq.job_outcomes_e0_finished_at_idx;

ALTER INDEX trioq.job_outcomes_pkey ATTACH PARTITION trioq.job_outcomes_e0_pkey;

ALTER INDEX trioq.job_outcomes_finished_idx ATTACH PARTITION trioq.job_outcomes_e1_finished_at_idx;

ALTER INDEX trioq.job_outcomes_pkey ATTACH PARTITION trioq.job_outcomes_e1_pkey;

ALTER INDEX trioq.jobs_deadline_idx ATTACH PARTITION trioq.job_rows_e0_deadline_at_idx;

ALTER INDEX trioq.jobs_parent_idx ATTACH PARTITION trioq.job_rows_e0_parent_id_parent_position_idx;

ALTER INDEX trioq.job_rows_pkey ATTACH PARTITION trioq.job_rows_e0_pkey;

ALTER INDEX trioq.jobs_wait_event_idx ATTACH PARTITION trioq.job_rows_e0_wait_event_key_idx;

ALTER INDEX trioq.jobs_deadline_idx ATTACH PARTITION trioq.job_rows_e1_deadline_at_idx;

ALTER INDEX trioq.jobs_parent_idx ATTACH PARTITION trioq.job_rows_e1_parent_id_parent_position_idx;

ALTER INDEX trioq.job_rows_pkey ATTACH PARTITION trioq.job_rows_e1_pkey;

ALTER INDEX trioq.jobs_wait_event_idx ATTACH PARTITION trioq.job_rows_e1_wait_event_key_idx;

ALTER INDEX trioq.ready_ring_claim_idx ATTACH PARTITION trioq.ready_ring_0_queue_task_priority_run_at_id_idx;

ALTER INDEX trioq.ready_ring_claim_idx ATTACH PARTITION trioq.ready_ring_1_queue_task_priority_run_at_id_idx;

ALTER INDEX trioq.ready_ring_claim_idx ATTACH PARTITION trioq.ready_ring_2_queue_task_priority_run_at_id_idx;

ALTER INDEX trioq.ready_ring_claim_idx ATTACH PARTITION trioq.ready_ring_3_queue_task_priority_run_at_id_idx;

ALTER INDEX trioq.workflow_values_pkey ATTACH PARTITION trioq.workflow_values_e0_pkey;

ALTER INDEX trioq.workflow_values_pkey ATTACH PARTITION trioq.workflow_values_e1_pkey;

CREATE STATISTICS trioq.jobs_queue_state (mcv) ON queue, state FROM trioq.job_due;

CREATE TRIGGER job_due_filed_insert AFTER INSERT ON trioq.job_rows FOR EACH ROW WHEN ((new.phase = ANY ('{scheduled,sleeping,waiting}'::text[]))) EXECUTE FUNCTION trioq.jobs_live_file();

CREATE TRIGGER job_runs_concurrency_release AFTER DELETE ON trioq.job_runs FOR EACH ROW WHEN ((old.concurrency_key IS NOT NULL)) EXECUTE FUNCTION trioq.concurrency_release();

CREATE TRIGGER jobs_deleted AFTER DELETE ON trioq.job_rows REFERENCING OLD TABLE AS deleted_jobs FOR EACH STATEMENT EXECUTE FUNCTION trioq.checkpoints_delete_of_jobs();

CREATE TRIGGER jobs_keys_delete AFTER DELETE ON trioq.job_rows REFERENCING OLD TABLE AS deleted_jobs FOR EACH STATEMENT EXECUTE FUNCTION trioq.job_keys_delete_of_jobs();

CREATE TRIGGER jobs_live_left AFTER DELETE ON trioq.job_rows FOR EACH ROW WHEN ((old.phase = ANY (ARRAY['scheduled'::text, 'sleeping'::text, 'waiting'::text]))) EXECUTE FUNCTION trioq.jobs_live_left();

CREATE TRIGGER ready_keyed_filed_insert AFTER INSERT ON trioq.job_rows FOR EACH ROW WHEN ((((new.partition_key IS NOT NULL) OR (new.concurrency_key IS NOT NULL)) AND (new.phase = 'ready'::text))) EXECUTE FUNCTION trioq.ready_keyed_file();

CREATE TRIGGER ready_keyed_filed_update AFTER UPDATE OF phase, run_at, filed, priority ON trioq.job_rows FOR EACH ROW WHEN ((((new.partition_key IS NOT NULL) OR (new.concurrency_key IS NOT NULL)) AND ((new.phase = 'ready'::text) OR (old.phase = 'ready'::text)) AND ((new.phase <> 'claimed'::text) OR (old.phase <> 'ready'::text)) AND ((new.phase <> old.phase) OR (new.filed <> old.filed) OR (new.run_at IS DISTINCT FROM old.run_at) OR (new.priority <> old.priority)))) EXECUTE FUNCTION trioq.ready_keyed_file();

CREATE TRIGGER ready_keyed_left AFTER DELETE ON trioq.job_rows FOR EACH ROW WHEN ((((old.partition_key IS NOT NULL) OR (old.concurrency_key IS NOT NULL)) AND (old.phase = 'ready'::text))) EXECUTE FUNCTION trioq.ready_keyed_file();

CREATE TRIGGER ready_ring_filed_insert AFTER INSERT ON trioq.job_rows FOR EACH ROW WHEN (((new.phase = 'ready'::text) AND (new.partition_key IS NULL) AND (new.concurrency_key IS NULL))) EXECUTE FUNCTION trioq.ready_ring_file();

CREATE TRIGGER ready_ring_filed_update AFTER UPDATE OF phase, filed ON trioq.job_rows FOR EACH ROW WHEN (((new.phase = 'ready'::text) AND ((old.phase <> 'ready'::text) OR (old.filed <> new.filed)) AND (new.partition_key IS NULL) AND (new.concurrency_key IS NULL))) EXECUTE FUNCTION trioq.ready_ring_file();

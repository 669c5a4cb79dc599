-- trioq schema, version 21: a whole-workflow deadline (`deadline=` at enqueue, or per task).
--
-- deadline_at: when the job (a workflow, across all its executions, retries, sleeps and waits)
-- must be finished; NULL for the jobs without one, which every statement below skips, so they
-- pay nothing. deadline_source says who set it, for the stored error: 'set at enqueue',
-- 'set by task <name>', 'inherited from job <id>'. Adding nullable columns without a default
-- rewrites no row.
ALTER TABLE {schema}.jobs
    ADD COLUMN deadline_at timestamptz,
    ADD COLUMN deadline_source text;

-- The leader's deadline pass (job_deadline_pass) reads this index only: the unfinished jobs
-- with a deadline that are not already being cancelled, in deadline order. Jobs without a
-- deadline are not in it at all.
CREATE INDEX jobs_deadline_idx ON {schema}.jobs (deadline_at)
    WHERE deadline_at IS NOT NULL AND NOT cancel_requested
      AND state IN ('scheduled', 'ready', 'running', 'sleeping', 'waiting');

-- The stored error of a job whose deadline passed (the settle of its cancelled attempt writes
-- it, and so does the pass for a job it cancels without running it again).
CREATE FUNCTION {schema}.deadline_error(deadline_at timestamptz, deadline_source text)
RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object(
        'type', 'DeadlineExceeded',
        'message', 'deadline passed at '
                   || to_char(deadline_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
                   || ' (' || coalesce(deadline_source, 'set at enqueue') || ')');
$$;

-- One bounded deadline pass: at most `max_jobs` unfinished jobs whose deadline has passed, in
-- deadline order (jobs_deadline_idx), are cancelled with their trees (job_cancel_tree,
-- migration 0017, which follows each child's on_parent_cancel policy): a scheduled or ready job
-- ends cancelled at once, a running one is flagged and its worker told on `control_channel`
-- (its handler is cancelled and its attempt recorded cancelled with the deadline error), a
-- sleeping or waiting workflow is woken, flagged, to run its cleanup. No retry: a deadline is
-- the workflow's own limit, not a failure another attempt could fix (Temporal's workflow
-- execution timeout ends the run the same way). The rows are locked with SKIP LOCKED, so a
-- pass racing a cancel or a settle leaves those rows to the next pass. Returns how many jobs
-- it cancelled (the runtime loops while a full batch comes back).
CREATE FUNCTION {schema}.job_deadline_pass(max_jobs integer, control_channel text)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    passed bigint[];
BEGIN
    SELECT array_agg(p.id) INTO passed FROM (
        SELECT j.id FROM {schema}.jobs j
        WHERE j.deadline_at IS NOT NULL AND NOT j.cancel_requested
          AND j.state IN ('scheduled', 'ready', 'running', 'sleeping', 'waiting')
          AND j.deadline_at <= {schema}.db_now()
          -- A lost lease is the recovery's (the same maintenance statement): next pass.
          AND NOT (j.state = 'running' AND j.lease_expires_at < {schema}.db_now())
        ORDER BY j.deadline_at
        LIMIT max_jobs
        FOR NO KEY UPDATE OF j SKIP LOCKED) AS p;
    IF passed IS NULL THEN
        RETURN 0;
    END IF;
    -- The reason first: a job cancelled at once by the tree cancel keeps this error.
    UPDATE {schema}.jobs j SET error = {schema}.deadline_error(j.deadline_at, j.deadline_source)
    WHERE j.id = ANY(passed);
    PERFORM 1 FROM {schema}.job_cancel_tree(passed, control_channel, false);
    RETURN cardinality(passed);
END
$$;

-- The SQL enqueue gains `deadline` (an absolute time; NULL: none). A new argument changes the
-- signature, so the function is dropped and created again; calls from before keep working
-- (the new argument is last).
DROP FUNCTION {schema}.enqueue(text, jsonb, text, timestamptz, smallint, text, text, integer,
                               interval, text[], text);

CREATE FUNCTION {schema}.enqueue(
    task          text,
    payload       jsonb       DEFAULT 'null',
    queue         text        DEFAULT 'default',
    run_at        timestamptz DEFAULT NULL,
    priority      smallint    DEFAULT 0,
    partition_key text        DEFAULT NULL,
    dedup_key     text        DEFAULT NULL,
    max_attempts  integer     DEFAULT NULL,
    unique_for    interval    DEFAULT NULL,
    unique_states text[]      DEFAULT NULL,
    traceparent   text        DEFAULT NULL,
    deadline      timestamptz DEFAULT NULL
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
    IF enqueue.traceparent IS NOT NULL
       AND enqueue.traceparent !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN
        RAISE EXCEPTION 'traceparent: % is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)',
            enqueue.traceparent USING ERRCODE = '22023';
    END IF;
    IF enqueue.deadline IS NOT NULL AND enqueue.deadline <= {schema}.db_now() THEN
        RAISE EXCEPTION 'deadline: % has passed (give a future timestamptz)',
            enqueue.deadline USING ERRCODE = '22023';
    END IF;
    IF enqueue.dedup_key IS NOT NULL THEN
        UPDATE {schema}.jobs j SET dedup_key = NULL
        WHERE j.dedup_key = enqueue.dedup_key
          AND j.state IN ('completed', 'failed', 'cancelled')
          AND NOT (j.state = ANY(j.unique_states)
                   AND (j.unique_until IS NULL OR j.unique_until > {schema}.db_now()));
    END IF;
    INSERT INTO {schema}.jobs AS j (queue, task, payload, state, priority, run_at,
                                   partition_key, dedup_key, max_attempts, created_at,
                                   unique_states, unique_until, trace_context, deadline_at,
                                   deadline_source)
    VALUES (enqueue.queue, enqueue.task, enqueue.payload,
            CASE WHEN due > {schema}.db_now() THEN 'scheduled' ELSE 'ready' END,
            enqueue.priority, due,
            enqueue.partition_key, enqueue.dedup_key, enqueue.max_attempts, {schema}.db_now(),
            held, CASE WHEN enqueue.dedup_key IS NOT NULL
                       THEN {schema}.db_now() + enqueue.unique_for END,
            enqueue.traceparent, enqueue.deadline,
            CASE WHEN enqueue.deadline IS NOT NULL THEN 'set at enqueue' END)
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL
    DO UPDATE SET dedup_key = excluded.dedup_key
    RETURNING j.id INTO job_id;
    IF due <= {schema}.db_now() THEN
        PERFORM pg_notify({schema}.ready_channel(enqueue.queue), enqueue.queue);
    END IF;
    RETURN job_id;
END
$$;

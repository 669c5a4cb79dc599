-- trioq schema, version 3: durable events and child jobs (docs/workflows.md, "Lock order").
-- Needs version 2 (the `waiting` state, checkpoints).

-- One row per event key. A row with emitted_at NULL was only waited for so far: the waiter
-- inserts it so that the waiter and the emitter always meet on the SAME row lock, whichever
-- comes first (see event_emit below and job_wait_event in queries.sql). The first emit fills
-- payload and emitted_at; later emits change nothing (the first emit wins).
CREATE TABLE {schema}.events (
    key        text        PRIMARY KEY CHECK (length(key) BETWEEN 1 AND 512),
    payload    jsonb,
    emitted_at timestamptz,
    created_at timestamptz NOT NULL
);
-- Retention prunes events oldest first (maintenance_pass).
CREATE INDEX events_age_idx ON {schema}.events ((coalesce(emitted_at, created_at)));

-- Children: a child records its parent and the parent's checkpoint position that spawned it;
-- the unique index makes a spawn exactly-once per (parent, position) across replays, and it is
-- also the index cancel cascades walk ("the children of job X").
ALTER TABLE {schema}.jobs ADD COLUMN parent_id bigint;
ALTER TABLE {schema}.jobs ADD COLUMN parent_position integer;
CREATE UNIQUE INDEX jobs_parent_idx ON {schema}.jobs (parent_id, parent_position)
    WHERE parent_id IS NOT NULL;

-- What a waiting job waits for: an event key, or the set of its children not final yet.
-- children_settled counts this job's children that reached a final state; a parent about to
-- suspend compares it with the value its snapshot saw, under its own row lock, so a child that
-- finished in between is never missed (no lost wake-up, no lock on the children).
ALTER TABLE {schema}.jobs ADD COLUMN wait_event_key text;
ALTER TABLE {schema}.jobs ADD COLUMN wait_children bigint[];
ALTER TABLE {schema}.jobs ADD COLUMN children_settled integer NOT NULL DEFAULT 0;
CREATE INDEX jobs_wait_event_idx ON {schema}.jobs (wait_event_key)
    WHERE wait_event_key IS NOT NULL;

-- Emit: take the event row's lock FIRST (insert, or lock the waiter's placeholder), THEN wake
-- the waiters in a LATER statement. A VOLATILE plpgsql function gives each statement a fresh
-- snapshot at READ COMMITTED, so the wake statement sees every waiter that registered before
-- the emitter got the row lock: such a waiter's registration committed (it held the same row
-- lock) before our first statement returned. A waiter registering after the lock sees the
-- emitted row (its ON CONFLICT DO UPDATE waits for our commit and returns the newest version).
-- One round trip; the ready notifications are sent when the caller's transaction commits.
CREATE FUNCTION {schema}.event_emit(event_key text, event_payload jsonb)
RETURNS TABLE (emitted_first boolean, woken_count bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    won boolean;
    wake_count bigint;
    stored jsonb;
BEGIN
    INSERT INTO {schema}.events AS e (key, payload, emitted_at, created_at)
    VALUES (event_key, event_payload, {schema}.db_now(), {schema}.db_now())
    ON CONFLICT (key) DO UPDATE
        SET payload = excluded.payload, emitted_at = excluded.emitted_at
        WHERE e.emitted_at IS NULL
    RETURNING true INTO won;
    -- ON CONFLICT DO UPDATE locks the conflicting row even when its WHERE is false; this
    -- statement sees the newest version (ours, or the first emitter's).
    SELECT e.payload INTO stored FROM {schema}.events e WHERE e.key = event_key;
    -- Wake the waiters and resolve their pending wait in the same statement: the payload
    -- becomes their checkpoint, so the woken handler resumes without another statement.
    WITH woken AS (
        UPDATE {schema}.jobs j
        SET state = 'ready', run_at = {schema}.db_now(), wait_event_key = NULL
        WHERE j.wait_event_key = event_key AND j.state = 'waiting'
        RETURNING j.id, j.queue
    ),
    resolved AS (
        UPDATE {schema}.checkpoints c
        SET value = jsonb_build_object('payload', stored)
        FROM woken w
        WHERE c.job_id = w.id AND c.kind = 'event' AND c.name = event_key
          AND c.value ? 'deadline'
        RETURNING c.job_id
    ),
    notified AS (
        SELECT count(pg_notify({schema}.ready_channel(q.queue), q.queue)) AS n
        FROM (SELECT DISTINCT queue FROM woken) AS q
    )
    SELECT (SELECT count(*) FROM woken) INTO wake_count
    FROM notified CROSS JOIN (SELECT count(*) FROM resolved) AS side_effects;
    RETURN QUERY SELECT coalesce(won, false), wake_count;
END
$$;

-- A child reached a final state: tell its parent. Called by the statements that finalise jobs
-- outside the claim round (cancel); the settle and recovery statements inline the same logic as
-- CTEs. Parents are locked in id order (two callers never deadlock on them) whatever state they
-- are in, and the decision is taken on the row's NEWEST version under that lock:
--  * children_settled counts up, so a parent whose suspension is in flight sees that a child
--    finished after its snapshot (job_wait_children compares the count under its row lock);
--  * a waiting parent drops the children from wait_children and is woken (ready, with a ready
--    notification) when none is left or one of them did not complete.
CREATE FUNCTION {schema}.parents_notify(child_ids bigint[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    wake_count bigint;
BEGIN
    WITH finished AS (
        SELECT c.parent_id, array_agg(c.id) AS ids,
               coalesce(array_agg(c.id) FILTER (WHERE c.state <> 'completed'), '{}') AS failed
        FROM {schema}.jobs c
        WHERE c.id = ANY(child_ids) AND c.parent_id IS NOT NULL
          AND c.state IN ('completed', 'failed', 'cancelled')
        GROUP BY c.parent_id
    ),
    locked AS MATERIALIZED (
        SELECT p.id FROM {schema}.jobs p JOIN finished f ON f.parent_id = p.id
        WHERE p.state NOT IN ('completed', 'failed', 'cancelled')
        ORDER BY p.id
        FOR NO KEY UPDATE OF p
    ),
    woken AS (
        UPDATE {schema}.jobs p
        SET children_settled = p.children_settled + cardinality(f.ids),
            wait_children = CASE WHEN p.state = 'waiting' AND p.wait_children && f.ids
                                 THEN ARRAY(SELECT unnest(p.wait_children)
                                            EXCEPT SELECT unnest(f.ids))
                                 ELSE p.wait_children END,
            state = CASE WHEN p.state = 'waiting' AND p.wait_children && f.ids
                              AND (p.wait_children <@ f.ids OR p.wait_children && f.failed)
                         THEN 'ready' ELSE p.state END,
            run_at = CASE WHEN p.state = 'waiting' AND p.wait_children && f.ids
                               AND (p.wait_children <@ f.ids OR p.wait_children && f.failed)
                          THEN {schema}.db_now() ELSE p.run_at END
        FROM finished f JOIN locked l ON l.id = f.parent_id
        WHERE p.id = f.parent_id
        RETURNING p.queue, p.state
    ),
    notified AS (
        SELECT count(pg_notify({schema}.ready_channel(q.queue), q.queue)) AS n
        FROM (SELECT DISTINCT queue FROM woken WHERE state = 'ready') AS q
    )
    SELECT (SELECT count(*) FROM woken WHERE state = 'ready') INTO wake_count FROM notified;
    RETURN wake_count;
END
$$;

-- Cancel jobs and everything they spawned, recursively. The whole tree is locked first, in id
-- order. Then, per unfinished job: a running one is flagged and its worker told on the control
-- channel; one with a running descendant waits (flagged) for its unfinished children, so that
-- a parent is final only after its children are: each child's end wakes it and its worker
-- records it cancelled; every other one is cancelled at once (dropping its partition key).
-- Finally the parents of the roots hear about roots that became final (parents_notify).
-- Returns one row per root: its state before and after.
CREATE FUNCTION {schema}.job_cancel_tree(root_ids bigint[], control_channel text)
RETURNS TABLE (id bigint, previous_state text, state text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    tree_ids bigint[];
    plan_ids bigint[];
    plan_parents bigint[];
    plan_old text[];
    plan_new text[];
    sent bigint;
BEGIN
    WITH RECURSIVE tree AS (
        SELECT j.id FROM {schema}.jobs j WHERE j.id = ANY(root_ids)
        UNION
        SELECT c.id FROM {schema}.jobs c JOIN tree t ON c.parent_id = t.id
    )
    SELECT array_agg(tree.id) INTO tree_ids FROM tree;
    PERFORM 1 FROM {schema}.jobs j WHERE j.id = ANY(tree_ids) ORDER BY j.id FOR NO KEY UPDATE;
    -- A new statement: its snapshot sees the newest version of every row locked above.
    WITH RECURSIVE nodes AS (
        SELECT j.id, j.parent_id, j.state, ARRAY[j.id] AS path
        FROM {schema}.jobs j WHERE j.id = ANY(root_ids)
        UNION ALL
        SELECT c.id, c.parent_id, c.state, n.path || c.id
        FROM {schema}.jobs c JOIN nodes n ON c.parent_id = n.id
    ),
    blocked AS (
        SELECT DISTINCT unnest(n.path[1:cardinality(n.path) - 1]) AS id
        FROM nodes n WHERE n.state = 'running'
    ),
    plan AS (
        SELECT DISTINCT ON (n.id) n.id, n.parent_id, n.state AS old_state,
               CASE WHEN n.state IN ('completed', 'failed', 'cancelled', 'running') THEN n.state
                    WHEN n.id IN (SELECT b.id FROM blocked b) THEN 'waiting'
                    ELSE 'cancelled' END AS new_state
        FROM nodes n
    )
    SELECT array_agg(p.id), array_agg(p.parent_id), array_agg(p.old_state), array_agg(p.new_state)
    INTO plan_ids, plan_parents, plan_old, plan_new
    FROM plan p;
    WITH plan AS (
        SELECT * FROM unnest(plan_ids, plan_parents, plan_old, plan_new)
                 AS t(id, parent_id, old_state, new_state)
    ),
    changed AS (
        UPDATE {schema}.jobs j
        SET cancel_requested = true,
            state = p.new_state,
            finished_at = CASE WHEN p.new_state = 'cancelled' THEN {schema}.db_now()
                               ELSE j.finished_at END,
            run_at = CASE WHEN p.new_state = 'waiting' THEN NULL ELSE j.run_at END,
            wait_event_key = NULL,
            wait_children = CASE WHEN p.new_state = 'waiting' THEN
                                ARRAY(SELECT c.id FROM plan c
                                      WHERE c.parent_id = p.id
                                        AND c.new_state IN ('running', 'waiting'))
                            ELSE j.wait_children END
        FROM plan p
        WHERE j.id = p.id AND p.old_state NOT IN ('completed', 'failed', 'cancelled')
        RETURNING j.id, j.state
    ),
    unlocked AS (
        DELETE FROM {schema}.partition_locks l USING changed c
        WHERE c.state = 'cancelled' AND l.job_id = c.id
        RETURNING l.job_id
    ),
    notified AS (
        SELECT count(pg_notify(CASE WHEN c.state = 'running' THEN control_channel
                                    ELSE {schema}.result_channel(c.id) END,
                               c.id::text)) AS n
        FROM changed c WHERE c.state IN ('running', 'cancelled')
    )
    SELECT n.n + (SELECT count(*) FROM unlocked) INTO sent FROM notified n;
    PERFORM {schema}.parents_notify(root_ids);
    RETURN QUERY
        SELECT t.id, t.old_state, t.new_state
        FROM unnest(plan_ids, plan_old, plan_new) AS t(id, old_state, new_state)
        WHERE t.id = ANY(root_ids);
END
$$;

-- gather's fail-fast: record the decision (which child failed first) as the parent's
-- checkpoint, fenced by its lease, THEN cancel the unfinished siblings (job_cancel_tree). Two
-- statements in one round trip; returns false (and changes nothing) when the lease is lost.
CREATE FUNCTION {schema}.job_cancel_children(
    p_job_id bigint, p_job_attempt integer, p_job_lease_token uuid, p_checkpoint_position integer,
    p_checkpoint_kind text, p_checkpoint_name text, p_checkpoint_value jsonb, p_child_ids bigint[],
    p_control_channel text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE {schema}.jobs j
    SET checkpoint_count = greatest(j.checkpoint_count, p_checkpoint_position + 1)
    WHERE j.id = p_job_id AND j.attempt = p_job_attempt AND j.lease_token = p_job_lease_token
      AND j.state = 'running';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO {schema}.checkpoints (job_id, position, kind, name, value, created_at)
    VALUES (p_job_id, p_checkpoint_position, p_checkpoint_kind, p_checkpoint_name, p_checkpoint_value,
            {schema}.db_now())
    ON CONFLICT ON CONSTRAINT checkpoints_pkey DO NOTHING;
    PERFORM 1 FROM {schema}.job_cancel_tree(
        ARRAY(SELECT c.id FROM {schema}.jobs c
              WHERE c.id = ANY(p_child_ids) AND c.parent_id = p_job_id),
        p_control_channel);
    RETURN true;
END
$$;

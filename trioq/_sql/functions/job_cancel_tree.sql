-- Cancel a job and its descendants, locked in id order: a scheduled or ready job ends
-- cancelled at once; a running one is flagged (its worker cancels the handler and records
-- the outcome); a sleeping or waiting one is woken, flagged, to run its cleanup; a parent with
-- a running child waits for it, flagged. Children follow the `on_parent_cancel` policy of
-- their spawn (cancel, abandon, wait) unless `tree` says every descendant. A cancelled child
-- wakes its waiting parent (parents_notify).
CREATE OR REPLACE FUNCTION {schema}.job_cancel_tree(root_ids bigint[], control_channel text,
                                         whole_tree boolean)
RETURNS TABLE (id bigint, previous_state text, state text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
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
        SELECT j.id, false AS kept FROM {schema}.job_rows j WHERE j.id = ANY(root_ids)
        UNION
        SELECT c.id, (NOT whole_tree AND c.on_parent_cancel = 'wait')
        FROM {schema}.job_rows c JOIN tree t ON c.parent_id = t.id
        WHERE NOT t.kept AND (whole_tree OR c.on_parent_cancel <> 'abandon')
    )
    SELECT array_agg(tree.id) INTO tree_ids FROM tree;
    PERFORM 1 FROM {schema}.job_rows j WHERE j.id = ANY(tree_ids) ORDER BY j.id
    FOR NO KEY UPDATE;
    -- A new statement: its snapshot sees the newest version of every row locked above, and the
    -- runs as they are now (migration 0047): while a row is held no claim can start its job,
    -- so a job seen not running stays so, and one seen running can only end (its settle then
    -- reads the flag set here).
    WITH RECURSIVE nodes AS (
        SELECT j.id, j.parent_id,
               -- include: job_state
               AS state, ARRAY[j.id] AS path, false AS kept
        FROM {schema}.job_rows j LEFT JOIN {schema}.job_runs u ON u.job_id = j.id
        LEFT JOIN {schema}.job_outcomes o ON o.job_id = j.id
        WHERE j.id = ANY(root_ids)
        UNION ALL
        SELECT j.id, j.parent_id,
               -- include: job_state
               AS state, n.path || j.id, (NOT whole_tree AND j.on_parent_cancel = 'wait')
        FROM {schema}.job_rows j JOIN nodes n ON j.parent_id = n.id
        LEFT JOIN {schema}.job_runs u ON u.job_id = j.id
        LEFT JOIN {schema}.job_outcomes o ON o.job_id = j.id
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
        UPDATE {schema}.job_rows j
        SET cancel_requested = true,
            -- A running job's row keeps its phase: its worker ends the run. A job cancelled
            -- here is `done`, its outcome appended below (migration 0049).
            phase = CASE WHEN p.new_state = 'running' THEN j.phase
                         WHEN p.new_state = 'cancelled' THEN 'done' ELSE p.new_state END,
            filed = j.filed + CASE WHEN p.new_state = 'ready' THEN 1 ELSE 0 END,
            run_at = CASE WHEN p.new_state = 'waiting' THEN NULL
                          WHEN p.new_state = 'ready' THEN {schema}.db_now()
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
        INSERT INTO {schema}.job_outcomes (job_id, state, error, attempt, executions,
                                           worker_id, started_at, finished_at, queue)
        SELECT c.id, 'cancelled', c.error, c.attempt, c.executions, c.worker_id, c.started_at,
               {schema}.db_now(), c.queue
        FROM changed c WHERE c.state = 'cancelled'
        RETURNING job_id
    ),
    woken AS (
        SELECT count(pg_notify({schema}.ready_channel(q.queue), q.queue)) AS n
        FROM (SELECT DISTINCT c.queue FROM changed c WHERE c.state = 'ready') AS q
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
    SELECT n.n + (SELECT count(*) FROM unlocked) + (SELECT w.n FROM woken w)
           + (SELECT count(*) FROM ended), ARRAY(SELECT c.id FROM changed c) INTO sent, changed_ids
    FROM notified n;
    -- job_due follows the records written above (migration 0050: no trigger writes it): a
    -- suspended job woken or cancelled leaves it, a parent left waiting for a running child
    -- (its wait's timeout gone) has its copy rewritten. Statements of their own, so their
    -- snapshots see every copy filed before the tree's locks were taken.
    DELETE FROM {schema}.job_due d USING {schema}.job_rows j
    WHERE d.job_id = ANY(changed_ids) AND j.id = d.job_id
      AND j.phase <> ALL ('{scheduled,sleeping,waiting}'::text[]);
    INSERT INTO {schema}.job_due AS d (job_id, queue, state, run_at)
    SELECT j.id, j.queue, j.phase, j.run_at FROM {schema}.job_rows j
    WHERE j.id = ANY(changed_ids) AND j.phase = ANY ('{scheduled,sleeping,waiting}'::text[])
    ON CONFLICT (job_id) DO UPDATE SET state = excluded.state, run_at = excluded.run_at
    WHERE (d.state, d.run_at) IS DISTINCT FROM (excluded.state, excluded.run_at);
    PERFORM {schema}.parents_notify(root_ids);
    RETURN QUERY
        SELECT t.id, t.old_state, t.new_state
        FROM unnest(plan_ids, plan_old, plan_new) AS t(id, old_state, new_state)
        WHERE t.id = ANY(root_ids);
END
$$;

-- The two-argument form (job_cancel, gather's fail-fast in job_cancel_children) follows the
-- policies.
CREATE OR REPLACE FUNCTION {schema}.job_cancel_tree(root_ids bigint[], control_channel text)
RETURNS TABLE (id bigint, previous_state text, state text)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM {schema}.job_cancel_tree(root_ids, control_channel, false);
$$;

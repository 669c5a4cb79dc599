-- The parent wake-up, written once: job_settle_many and maintenance_pass call it when they
-- finished children, the cancel paths through job_cancel_tree. Parents are locked in id order,
-- and the decision is taken on the row's NEWEST version under that lock:
--  * children_settled counts up, so a parent whose suspension is in flight sees that a child
--    finished after its snapshot (job_wait_children compares the count under its row lock);
--  * a waiting parent drops the children from wait_children and is woken (ready now, with a
--    ready notification) when none it waits for is left or one of them did not complete.
-- skip_ids are parents the calling statement writes itself: a row is written once per
-- statement, and such a parent is not deciding a wait now. A volatile function's queries see
-- the writes of the statement that calls it so far, so a statement passes the ids of the
-- children it has just finished and their states are read here. Returns how many parents it
-- woke.
CREATE OR REPLACE FUNCTION {schema}.parents_notify(child_ids bigint[], skip_ids bigint[] DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    wake_count bigint;
    woken_ids bigint[];
BEGIN
    WITH finished AS (
        SELECT c.parent_id, array_agg(c.id) AS ids,
               coalesce(array_agg(c.id) FILTER (WHERE o.state <> 'completed'), '{}') AS failed
        -- A finished child is one with an outcome (migration 0049).
        FROM {schema}.job_rows c JOIN {schema}.job_outcomes o ON o.job_id = c.id
        WHERE c.id = ANY(child_ids) AND c.parent_id IS NOT NULL
        GROUP BY c.parent_id
    ),
    locked AS MATERIALIZED (
        SELECT p.id, p.filed FROM {schema}.job_rows p JOIN finished f ON f.parent_id = p.id
        WHERE p.id <> ALL(skip_ids)
        ORDER BY p.id
        FOR NO KEY UPDATE OF p
    ),
    woken AS (
        UPDATE {schema}.job_rows p
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
                          THEN {schema}.db_now() ELSE p.run_at END
        FROM finished f JOIN locked l ON l.id = f.parent_id
        WHERE p.id = f.parent_id
        -- `woken`: moved into ready here (a parent that runs reads ready too).
        RETURNING p.id, p.queue, CASE WHEN p.filed > l.filed THEN 'ready' END AS state
    ),
    notified AS (
        SELECT count(pg_notify({schema}.ready_channel(q.queue), q.queue)) AS n
        FROM (SELECT DISTINCT queue FROM woken WHERE state = 'ready') AS q
    )
    SELECT (SELECT count(*) FROM woken WHERE state = 'ready'),
           ARRAY(SELECT id FROM woken WHERE state = 'ready')
    INTO wake_count, woken_ids FROM notified;
    -- The woken leave job_due (migration 0050), in a statement of its own: its fresh snapshot
    -- sees every copy filed before the parents' locks were taken.
    IF wake_count > 0 THEN
        DELETE FROM {schema}.job_due d WHERE d.job_id = ANY(woken_ids);
    END IF;
    RETURN wake_count;
END
$$;

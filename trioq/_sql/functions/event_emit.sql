-- Emit: take the event row's lock FIRST (insert, or lock the waiter's placeholder), THEN wake
-- the waiters in a LATER statement. A VOLATILE plpgsql function gives each statement a fresh
-- snapshot at READ COMMITTED, so the wake statement sees every waiter that registered before
-- the emitter got the row lock: such a waiter's registration committed (it held the same row
-- lock) before our first statement returned. A waiter registering after the lock sees the
-- emitted row (its ON CONFLICT DO UPDATE waits for our commit and returns the newest version).
-- One round trip; the ready notifications are sent when the caller's transaction commits.
CREATE OR REPLACE FUNCTION {schema}.event_emit(event_key text, event_payload jsonb)
RETURNS TABLE (emitted_first boolean, woken_count bigint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    won boolean;
    wake_count bigint;
    woken_ids bigint[];
    stored jsonb;
BEGIN
    PERFORM {schema}.payload_check(event_payload, 'payload');
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
        UPDATE {schema}.job_rows j
        SET phase = 'ready', filed = j.filed + 1, run_at = {schema}.db_now(),
            wait_event_key = NULL
        WHERE j.wait_event_key = event_key AND j.phase = 'waiting'
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
    SELECT (SELECT count(*) FROM woken), ARRAY(SELECT id FROM woken) INTO wake_count, woken_ids
    FROM notified CROSS JOIN (SELECT count(*) FROM resolved) AS side_effects;
    -- The woken leave job_due (migration 0050), in a statement of its own: its fresh snapshot
    -- sees every copy filed before the wake statement locked the records.
    DELETE FROM {schema}.job_due d WHERE d.job_id = ANY(woken_ids);
    RETURN QUERY SELECT coalesce(won, false), wake_count;
END
$$;

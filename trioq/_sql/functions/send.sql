-- Send from SQL, inside the caller's transaction:
--   SELECT {schema}.send(42, 'review', '{"approved": true}');
-- Locks the job row first (the lock job_receive takes through its fence), so the state read
-- under it is the newest. A job waiting for this topic at a known position: the message becomes
-- that receive's checkpoint ({"messages": [payload]}, replacing the pending {"deadline": t}) and
-- the job is made ready, in this one transaction, so every claim that sees the job ready sees
-- the checkpoint too (one commit). Only the send that wakes the job delivers: once it is ready, a
-- claim may take it at any moment with a snapshot taken before a later send's commit, and would
-- miss a message added to the checkpoint then; so later sends of a burst queue, and the
-- handler's next receive takes them in one statement, without suspending. Anything else queues
-- the message and wakes the job's queue when it is claimable. The message id comes from the
-- queue's identity either way, so ids still give the send order. Returns the message id.
CREATE OR REPLACE FUNCTION {schema}.send(p_job_id bigint, p_topic text,
                                         p_payload jsonb DEFAULT 'null')
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    job_state text;
    final_state text;
    job_topic text;
    job_position integer;
    job_queue text;
    message_id bigint;
    woken_count bigint;
BEGIN
    PERFORM {schema}.payload_check(p_payload, 'payload');
    SELECT j.phase, j.wait_topic, j.wait_position INTO job_state, job_topic, job_position
    FROM {schema}.job_rows j WHERE j.id = p_job_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'send: no job %', p_job_id USING ERRCODE = 'P0002';
    END IF;
    -- Final: the job has its outcome (migration 0049; a completion appends it without the
    -- record's lock, so a message sent as the job finishes may still be queued: it goes with
    -- the job).
    SELECT o.state INTO final_state FROM {schema}.job_outcomes o WHERE o.job_id = p_job_id;
    IF FOUND THEN
        RAISE EXCEPTION 'send: job % is % (final): it receives no more messages',
            p_job_id, final_state USING ERRCODE = 'P0001';
    END IF;
    IF job_state = 'waiting' AND job_topic = p_topic AND job_position IS NOT NULL THEN
        -- A later statement: its snapshot sees the pending checkpoint the receive committed.
        UPDATE {schema}.checkpoints c
        SET value = jsonb_build_object('messages',
                                       jsonb_build_array(coalesce(p_payload, 'null')))
        WHERE c.job_id = p_job_id AND c.position = job_position AND c.kind = 'receive'
          AND c.name = p_topic AND c.value ? 'deadline' AND NOT c.value ? 'messages';
        IF FOUND THEN
            UPDATE {schema}.job_rows j
            SET phase = 'ready', filed = j.filed + 1, run_at = {schema}.db_now(),
                wait_topic = NULL, wait_position = NULL
            WHERE j.id = p_job_id
            RETURNING j.queue INTO job_queue;
            -- Woken: out of job_due (migration 0050), under the record's lock taken above.
            DELETE FROM {schema}.job_due d WHERE d.job_id = p_job_id;
            PERFORM pg_notify({schema}.ready_channel(job_queue), job_queue);
            RETURN nextval(pg_get_serial_sequence('{schema}.messages', 'id'));
        END IF;
    END IF;
    INSERT INTO {schema}.messages (job_id, topic, payload, created_at)
    VALUES (p_job_id, p_topic, coalesce(p_payload, 'null'), {schema}.db_now())
    RETURNING id INTO message_id;
    UPDATE {schema}.job_rows j
    SET phase = 'ready', filed = j.filed + 1, run_at = {schema}.db_now(), wait_topic = NULL,
        wait_position = NULL
    WHERE j.id = p_job_id AND j.phase = 'waiting' AND j.wait_topic = p_topic;
    IF FOUND THEN
        DELETE FROM {schema}.job_due d WHERE d.job_id = p_job_id;
    END IF;
    -- Woken just now, ready already, or due: a claim may have skipped it under our lock.
    SELECT count(pg_notify({schema}.ready_channel(j.queue), j.queue)) INTO woken_count
    FROM {schema}.job_rows j
    WHERE j.id = p_job_id
      AND NOT EXISTS (SELECT 1 FROM {schema}.job_runs u WHERE u.job_id = j.id)
      AND (j.phase = 'ready'
           OR (j.phase IN ('scheduled', 'sleeping', 'waiting') AND j.run_at <= {schema}.db_now()));
    RETURN message_id;
END
$$;

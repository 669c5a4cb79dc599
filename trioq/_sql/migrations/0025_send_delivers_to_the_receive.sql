-- trioq schema, version 25: a send to a job waiting in ctx.receive for its topic writes the
-- message straight into that receive's checkpoint, so the woken handler replays the receive from
-- its history and runs no statement for it (docs/workflows.md, "Messages").
--
-- The position of the receive a waiting job is suspended in (NULL otherwise). Set by
-- job_receive when it suspends, cleared by the send that delivers into it or by the receive
-- that records a result. Rows suspended before this version have none: a send to them queues
-- the message and wakes them as version 20 did, and the woken receive takes it from the queue.
ALTER TABLE {schema}.jobs ADD COLUMN wait_position integer;

-- Send from SQL, inside the caller's transaction (signature and errors as in version 20):
--   SELECT {schema}.send(42, 'review', '{"approved": true}');
-- Locks the job row first (the lock job_receive takes through its fence), so the state read
-- under it is the newest. A job waiting for this topic at a known position: the message becomes
-- that receive's checkpoint ({"messages": [payload]}, replacing the pending {"deadline": t}) and
-- the job is made ready, in this one transaction, so every claim that sees the job ready sees
-- the checkpoint too (one commit). Only the send that wakes the job delivers: once it is ready, a
-- claim may take it at any moment with a snapshot taken before a later send's commit, and would
-- miss a message added to the checkpoint then; so later sends of a burst queue, and the
-- handler's next receive takes them in one statement, without suspending. Anything else queues
-- the message and wakes the job's queue when it is claimable, as in version 20. The message id
-- comes from the queue's identity either way, so ids still give the send order.
CREATE OR REPLACE FUNCTION {schema}.send(p_job_id bigint, p_topic text,
                                         p_payload jsonb DEFAULT 'null')
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    job_state text;
    job_topic text;
    job_position integer;
    job_queue text;
    message_id bigint;
    woken_count bigint;
BEGIN
    SELECT j.state, j.wait_topic, j.wait_position INTO job_state, job_topic, job_position
    FROM {schema}.jobs j WHERE j.id = p_job_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'send: no job %', p_job_id USING ERRCODE = 'P0002';
    END IF;
    IF job_state IN ('completed', 'failed', 'cancelled') THEN
        RAISE EXCEPTION 'send: job % is % (final): it receives no more messages',
            p_job_id, job_state USING ERRCODE = 'P0001';
    END IF;
    IF job_state = 'waiting' AND job_topic = p_topic AND job_position IS NOT NULL THEN
        -- A later statement: its snapshot sees the pending checkpoint the receive committed.
        UPDATE {schema}.checkpoints c
        SET value = jsonb_build_object('messages',
                                       jsonb_build_array(coalesce(p_payload, 'null')))
        WHERE c.job_id = p_job_id AND c.position = job_position AND c.kind = 'receive'
          AND c.name = p_topic AND c.value ? 'deadline' AND NOT c.value ? 'messages';
        IF FOUND THEN
            UPDATE {schema}.jobs j
            SET state = 'ready', run_at = {schema}.db_now(), wait_topic = NULL,
                wait_position = NULL
            WHERE j.id = p_job_id
            RETURNING j.queue INTO job_queue;
            PERFORM pg_notify({schema}.ready_channel(job_queue), job_queue);
            RETURN nextval(pg_get_serial_sequence('{schema}.messages', 'id'));
        END IF;
    END IF;
    INSERT INTO {schema}.messages (job_id, topic, payload, created_at)
    VALUES (p_job_id, p_topic, coalesce(p_payload, 'null'), {schema}.db_now())
    RETURNING id INTO message_id;
    UPDATE {schema}.jobs j
    SET state = 'ready', run_at = {schema}.db_now(), wait_topic = NULL, wait_position = NULL
    WHERE j.id = p_job_id AND j.state = 'waiting' AND j.wait_topic = p_topic;
    -- Woken just now, ready already, or due: a claim may have skipped it under our lock.
    SELECT count(pg_notify({schema}.ready_channel(j.queue), j.queue)) INTO woken_count
    FROM {schema}.jobs j
    WHERE j.id = p_job_id
      AND (j.state = 'ready'
           OR (j.state IN ('scheduled', 'sleeping', 'waiting') AND j.run_at <= {schema}.db_now()));
    RETURN message_id;
END
$$;

-- job_receive as in version 16 (see there), and it keeps wait_position: set to p_position when
-- the receive suspends, cleared with wait_topic when it records what it took or its timeout.
CREATE OR REPLACE FUNCTION {schema}.job_receive(
    p_job_id bigint, p_attempt integer, p_lease_token uuid, p_position integer, p_topic text,
    p_timeout_seconds float8, p_deadline timestamptz, p_limit integer,
    p_value_keys text[], p_value_values jsonb[])
RETURNS TABLE (state text, messages jsonb, deadline timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    due timestamptz := coalesce(p_deadline,
                                {schema}.db_now() + p_timeout_seconds * interval '1 second');
    stored jsonb;
    taken jsonb;
    taken_count bigint;
BEGIN
    UPDATE {schema}.jobs j
    SET checkpoint_count = greatest(j.checkpoint_count, p_position + 1)
    WHERE j.id = p_job_id AND j.attempt = p_attempt AND j.lease_token = p_lease_token
      AND j.state = 'running';
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'lost'::text, NULL::jsonb, due;
        RETURN;
    END IF;
    IF cardinality(p_value_keys) > 0 THEN
        INSERT INTO {schema}.workflow_values AS v (job_id, key, value, updated_at)
        SELECT p_job_id, t.key, t.value, {schema}.db_now()
        FROM unnest(p_value_keys, p_value_values) AS t(key, value)
        ON CONFLICT (job_id, key) DO UPDATE SET value = excluded.value,
                                                updated_at = excluded.updated_at;
        PERFORM pg_notify({schema}.result_channel(p_job_id), p_job_id::text);
    END IF;
    SELECT c.value INTO stored FROM {schema}.checkpoints c
    WHERE c.job_id = p_job_id AND c.position = p_position;
    IF stored ? 'messages' THEN
        RETURN QUERY SELECT 'received'::text, stored -> 'messages', due;
        RETURN;
    END IF;
    WITH gone AS (
        DELETE FROM {schema}.messages m
        WHERE m.id IN (SELECT q.id FROM {schema}.messages q
                       WHERE q.job_id = p_job_id AND q.topic = p_topic
                       ORDER BY q.id LIMIT p_limit)
        RETURNING m.id, m.payload
    )
    SELECT coalesce(jsonb_agg(g.payload ORDER BY g.id), '[]'::jsonb), count(*)
    INTO taken, taken_count FROM gone g;
    IF taken_count > 0 OR due <= {schema}.db_now() THEN
        INSERT INTO {schema}.checkpoints AS c (job_id, position, kind, name, value, created_at)
        VALUES (p_job_id, p_position, 'receive', p_topic, jsonb_build_object('messages', taken),
                {schema}.db_now())
        ON CONFLICT (job_id, position) DO UPDATE SET value = excluded.value;
        UPDATE {schema}.jobs j SET wait_topic = NULL, wait_position = NULL
        WHERE j.id = p_job_id AND (j.wait_topic IS NOT NULL OR j.wait_position IS NOT NULL);
        RETURN QUERY SELECT CASE WHEN taken_count > 0 THEN 'received' ELSE 'timeout' END,
                            taken, due;
        RETURN;
    END IF;
    INSERT INTO {schema}.checkpoints AS c (job_id, position, kind, name, value, created_at)
    VALUES (p_job_id, p_position, 'receive', p_topic, jsonb_build_object('deadline', due),
            {schema}.db_now())
    ON CONFLICT (job_id, position) DO NOTHING;
    UPDATE {schema}.jobs j
    SET state = 'waiting', run_at = due, attempt = j.attempt - 1, lease_token = NULL,
        lease_expires_at = NULL, wait_topic = p_topic, wait_position = p_position,
        wait_event_key = NULL,
        wait_children = NULL
    WHERE j.id = p_job_id;
    RETURN QUERY SELECT 'waiting'::text, '[]'::jsonb, due;
END
$$;

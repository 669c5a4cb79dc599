-- trioq schema, version 16: messages to a running workflow (`client.send`, `ctx.receive`) and
-- readable workflow state (`ctx.set_value`, `client.get_value`). docs/workflows.md, "Messages"
-- and "Readable state".

-- One row per message not yet received. `id` is the send order: senders to one job are
-- serialised by the job row lock (message_send), so id order is commit order for each job. A
-- receive deletes what it takes in the same statement that records it as the job's checkpoint,
-- so a message is either still here or in exactly one checkpoint (delivered once).
CREATE TABLE {schema}.messages (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     bigint      NOT NULL REFERENCES {schema}.jobs (id) ON DELETE CASCADE,
    topic      text        NOT NULL CHECK (length(topic) BETWEEN 1 AND 512),
    payload    jsonb       NOT NULL,
    created_at timestamptz NOT NULL
);
-- A receive takes the oldest messages of (job, topic) in order: one range scan.
CREATE INDEX messages_job_topic_idx ON {schema}.messages (job_id, topic, id);

-- The values a workflow published with ctx.set_value, newest per key; readable in any state of
-- the job and kept until the job is deleted.
CREATE TABLE {schema}.workflow_values (
    job_id     bigint      NOT NULL REFERENCES {schema}.jobs (id) ON DELETE CASCADE,
    key        text        NOT NULL CHECK (length(key) BETWEEN 1 AND 512),
    value      jsonb       NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (job_id, key)
);

-- The topic a waiting job waits for (NULL otherwise). Only message_send reads it, by job id,
-- so it needs no index. It can stay set on a job a timeout made ready: a wake-up needs state
-- 'waiting' too, and the next receive of the same position (replay is deterministic) resets it.
ALTER TABLE {schema}.jobs ADD COLUMN wait_topic text;

-- Send from SQL, inside the caller's transaction:
--   SELECT {schema}.send(42, 'review', '{"approved": true}');
-- Locks the job row FIRST (the same lock job_receive takes through its fence), then queues the
-- message and, in a later statement with a fresh snapshot, wakes the job if it waits for this
-- topic. A receive that locked the row before us has committed its decision when our lock is
-- granted: we see it waiting and wake it. One that locks after us sees our message (its own
-- later statement has a fresh snapshot). So no wake-up is lost. A burst wakes the job once: the
-- first send makes it ready, the rest find it not waiting. Raises (SQLSTATE P0002, no row) for
-- an unknown job and (P0001) for a final one, naming the job.
CREATE FUNCTION {schema}.send(p_job_id bigint, p_topic text, p_payload jsonb DEFAULT 'null')
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    job_state text;
    message_id bigint;
    woken_count bigint;
BEGIN
    SELECT j.state INTO job_state FROM {schema}.jobs j WHERE j.id = p_job_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'send: no job %', p_job_id USING ERRCODE = 'P0002';
    END IF;
    IF job_state IN ('completed', 'failed', 'cancelled') THEN
        RAISE EXCEPTION 'send: job % is % (final): it receives no more messages',
            p_job_id, job_state USING ERRCODE = 'P0001';
    END IF;
    INSERT INTO {schema}.messages (job_id, topic, payload, created_at)
    VALUES (p_job_id, p_topic, coalesce(p_payload, 'null'), {schema}.db_now())
    RETURNING id INTO message_id;
    WITH woken AS (
        UPDATE {schema}.jobs j
        SET state = 'ready', run_at = {schema}.db_now(), wait_topic = NULL
        WHERE j.id = p_job_id AND j.state = 'waiting' AND j.wait_topic = p_topic
        RETURNING j.queue
    )
    SELECT count(pg_notify({schema}.ready_channel(w.queue), w.queue)) INTO woken_count
    FROM woken w;
    RETURN message_id;
END
$$;

-- A running job receives up to p_limit messages of p_topic, fenced by its lease. The fenced
-- UPDATE takes the job row lock first (see send above); the messages are read and deleted in a
-- LATER statement, whose fresh snapshot sees every send that committed before our lock.
--  * messages queued: they are deleted and recorded, in send order, as the job's checkpoint
--    ({"messages": [...]}), and returned;
--  * none, deadline passed: {"messages": []} is recorded (the timeout);
--  * otherwise the job suspends: waiting until the deadline, attempt restored, lease dropped,
--    partition key kept, wait_topic set, and a pending checkpoint ({"deadline": t}) keeps the
--    deadline for the replay after the wake-up.
-- A position already recorded returns what it holds and takes nothing: a call repeated after a
-- lost reply receives the same messages, never more. Values set since the last checkpoint
-- (p_value_keys/p_value_values) are written in the same transaction (group commit).
-- Returns (state, messages, deadline): state 'received', 'timeout', 'waiting' or 'lost'.
CREATE FUNCTION {schema}.job_receive(
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
        UPDATE {schema}.jobs j SET wait_topic = NULL
        WHERE j.id = p_job_id AND j.wait_topic IS NOT NULL;
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
        lease_expires_at = NULL, wait_topic = p_topic, wait_event_key = NULL,
        wait_children = NULL
    WHERE j.id = p_job_id;
    RETURN QUERY SELECT 'waiting'::text, '[]'::jsonb, due;
END
$$;

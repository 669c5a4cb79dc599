-- trioq schema, version 20: a send to a job that is ready (or due) also wakes its queue.
--
-- send() locks the job row (FOR NO KEY UPDATE, and its message's foreign key a KEY SHARE lock)
-- until the caller's transaction ends. A claim round running meanwhile locks candidates with
-- FOR UPDATE SKIP LOCKED, which conflicts with both: it skips the job and, finding nothing
-- else, goes back to waiting. Up to version 18 send() notified only when it woke a waiting job,
-- so a send to a job already ready (enqueued, or woken by an earlier send of a burst) left the
-- skipped job to the next poll (tests/test_messages.py, "the claim skipped it while the send held
-- its row"). Now send() notifies the job's queue whenever the job is claimable or promotable
-- after its update: ready, or suspended and due. The notification is delivered at commit, when
-- the lock is gone, so the round it starts can take the job. A running job (the usual case for
-- a message) sends nothing.
CREATE OR REPLACE FUNCTION {schema}.send(p_job_id bigint, p_topic text,
                                         p_payload jsonb DEFAULT 'null')
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
    UPDATE {schema}.jobs j
    SET state = 'ready', run_at = {schema}.db_now(), wait_topic = NULL
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

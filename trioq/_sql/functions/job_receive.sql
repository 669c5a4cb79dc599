-- A running job takes up to `p_limit` messages of `p_topic` as checkpoint `p_position`, or
-- suspends waiting for them until `p_deadline` (fenced by its lease). It keeps wait_position:
-- set to p_position when the receive suspends, cleared with wait_topic when it records what it
-- took or its timeout, so `send` can deliver to the waiting receive's checkpoint.
CREATE OR REPLACE FUNCTION {schema}.job_receive(
    p_job_id bigint, p_attempt integer, p_lease_token uuid, p_position integer, p_topic text,
    p_timeout_seconds float8, p_deadline timestamptz, p_limit integer,
    p_value_keys text[], p_value_values jsonb[])
RETURNS TABLE (state text, messages jsonb, deadline timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    due timestamptz := coalesce(p_deadline,
                                {schema}.db_now() + p_timeout_seconds * interval '1 second');
    stored jsonb;
    taken jsonb;
    taken_count bigint;
    run {schema}.job_runs;
BEGIN
    -- The fence is the run (migration 0047), locked first, then the row written; a suspension
    -- deletes it.
    SELECT * INTO run FROM {schema}.job_runs u
    WHERE u.job_id = p_job_id AND u.attempt = p_attempt AND u.lease_token = p_lease_token
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'lost'::text, NULL::jsonb, due;
        RETURN;
    END IF;
    UPDATE {schema}.job_rows j
    SET checkpoint_count = greatest(j.checkpoint_count, p_position + 1)
    WHERE j.id = p_job_id;
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
        UPDATE {schema}.job_rows j SET wait_topic = NULL, wait_position = NULL
        WHERE j.id = p_job_id AND (j.wait_topic IS NOT NULL OR j.wait_position IS NOT NULL);
        RETURN QUERY SELECT CASE WHEN taken_count > 0 THEN 'received' ELSE 'timeout' END,
                            taken, due;
        RETURN;
    END IF;
    INSERT INTO {schema}.checkpoints AS c (job_id, position, kind, name, value, created_at)
    VALUES (p_job_id, p_position, 'receive', p_topic, jsonb_build_object('deadline', due),
            {schema}.db_now())
    ON CONFLICT (job_id, position) DO NOTHING;
    DELETE FROM {schema}.job_runs u WHERE u.job_id = p_job_id;
    UPDATE {schema}.job_rows j
    SET phase = 'waiting', run_at = due, executions = run.executions,
        worker_id = run.worker_id, started_at = run.started_at, wait_topic = p_topic,
        wait_position = p_position, wait_event_key = NULL, wait_children = NULL
    WHERE j.id = p_job_id;
    -- Filed in job_due by this writer (migration 0050): the running record had no copy.
    INSERT INTO {schema}.job_due (job_id, queue, state, run_at)
    SELECT j.id, j.queue, j.phase, j.run_at FROM {schema}.job_rows j WHERE j.id = p_job_id;
    RETURN QUERY SELECT 'waiting'::text, '[]'::jsonb, due;
END
$$;

-- gather's fail-fast: record the decision (which child failed first) as the parent's
-- checkpoint, fenced by its lease, THEN cancel the unfinished siblings (job_cancel_tree). Two
-- statements in one round trip; returns false (and changes nothing) when the lease is lost.
CREATE OR REPLACE FUNCTION {schema}.job_cancel_children(
    p_job_id bigint, p_job_attempt integer, p_job_lease_token uuid, p_checkpoint_position integer,
    p_checkpoint_kind text, p_checkpoint_name text, p_checkpoint_value jsonb, p_child_ids bigint[],
    p_control_channel text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- The fence is the run (migration 0047), locked first, then the row written.
    PERFORM 1 FROM {schema}.job_runs u
    WHERE u.job_id = p_job_id AND u.attempt = p_job_attempt
      AND u.lease_token = p_job_lease_token
    FOR SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE {schema}.job_rows j
    SET checkpoint_count = greatest(j.checkpoint_count, p_checkpoint_position + 1)
    WHERE j.id = p_job_id;
    INSERT INTO {schema}.checkpoints (job_id, position, kind, name, value, created_at)
    VALUES (p_job_id, p_checkpoint_position, p_checkpoint_kind, p_checkpoint_name, p_checkpoint_value,
            {schema}.db_now())
    ON CONFLICT ON CONSTRAINT checkpoints_pkey DO NOTHING;
    PERFORM 1 FROM {schema}.job_cancel_tree(
        ARRAY(SELECT c.id FROM {schema}.job_rows c
              WHERE c.id = ANY(p_child_ids) AND c.parent_id = p_job_id),
        p_control_channel);
    RETURN true;
END
$$;

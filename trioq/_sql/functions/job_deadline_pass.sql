-- One bounded deadline pass: at most `max_jobs` unfinished jobs whose deadline has passed, in
-- deadline order (jobs_deadline_idx), are cancelled with their trees (job_cancel_tree,
-- which follows each child's on_parent_cancel policy): a scheduled or ready job
-- ends cancelled at once, a running one is flagged and its worker told on `control_channel`
-- (its handler is cancelled and its attempt recorded cancelled with the deadline error), a
-- sleeping or waiting workflow is woken, flagged, to run its cleanup. No retry: a deadline is
-- the workflow's own limit, not a failure another attempt could fix (Temporal's workflow
-- execution timeout ends the run the same way). The rows are locked with SKIP LOCKED, so a
-- pass racing a cancel or a settle leaves those rows to the next pass. Returns how many jobs
-- it cancelled (the runtime loops while a full batch comes back).
CREATE OR REPLACE FUNCTION {schema}.job_deadline_pass(max_jobs integer, control_channel text)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    passed bigint[];
BEGIN
    -- A job finished on the fast path keeps its record's phase (`ready` or `claimed`) under its
    -- outcome (migration 0049), so it stays in jobs_deadline_idx until its deadline passes:
    -- then it is written `done` here, lazily, off the completion's path, and leaves the index.
    UPDATE {schema}.job_rows j SET phase = 'done'
    WHERE j.id = ANY(ARRAY(
        SELECT f.id FROM {schema}.job_rows f
        WHERE f.deadline_at IS NOT NULL AND NOT f.cancel_requested
          AND f.phase IN ('ready', 'claimed')
          AND f.deadline_at <= {schema}.db_now()
          AND EXISTS (SELECT 1 FROM {schema}.job_outcomes o WHERE o.job_id = f.id)
        ORDER BY f.deadline_at
        LIMIT max_jobs
        FOR NO KEY UPDATE OF f SKIP LOCKED));
    SELECT array_agg(p.id) INTO passed FROM (
        SELECT j.id FROM {schema}.job_rows j
        WHERE j.deadline_at IS NOT NULL AND NOT j.cancel_requested
          AND j.phase <> 'done'
          AND j.deadline_at <= {schema}.db_now()
          -- A lost lease is the recovery's (the same maintenance statement): next pass.
          AND NOT EXISTS (SELECT 1 FROM {schema}.job_runs u
                          WHERE u.job_id = j.id AND u.lease_expires_at < {schema}.db_now())
          AND NOT EXISTS (SELECT 1 FROM {schema}.job_outcomes o WHERE o.job_id = j.id)
        ORDER BY j.deadline_at
        LIMIT max_jobs
        FOR NO KEY UPDATE OF j SKIP LOCKED) AS p;
    IF passed IS NULL THEN
        RETURN 0;
    END IF;
    -- The reason first: a job cancelled at once by the tree cancel keeps this error.
    UPDATE {schema}.job_rows j SET error = {schema}.deadline_error(j.deadline_at, j.deadline_source)
    WHERE j.id = ANY(passed);
    PERFORM 1 FROM {schema}.job_cancel_tree(passed, control_channel, false);
    RETURN cardinality(passed);
END
$$;

-- The runs' fence of the previous release's statements, kept for its workers while they drain (a
-- later release drops it): job_runs_settle_fenced() without the token column, one DELETE for both.
CREATE OR REPLACE FUNCTION {schema}.job_runs_settle(ids bigint[], attempts integer[],
                                                    lease_tokens uuid[], states text[])
RETURNS TABLE (run_job_id bigint, run_attempt integer, run_executions integer,
               run_worker_id uuid, run_traced boolean, run_started_at timestamptz,
               run_result_watched boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- The fenced one's DELETE, without its token column (one body for both).
    RETURN QUERY
    SELECT f.run_job_id, f.run_attempt, f.run_executions, f.run_worker_id, f.run_traced,
           f.run_started_at, f.run_result_watched
    FROM {schema}.job_runs_settle_fenced(ids, attempts, lease_tokens, states) AS f;
END
$$;

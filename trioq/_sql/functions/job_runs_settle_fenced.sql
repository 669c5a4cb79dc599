-- Ends the runs the settle (job_settle_many) names, fenced by attempt and lease token, and returns
-- each ended run's token with what the outcome records: the statement joins its batch's rows to
-- the runs this ended by id, attempt and token. A batch may name one job twice: a completer still
-- holding the outcome of a run it lost (its writes failed while the database was away, and its
-- lease expired, the run recovered) when it finished the job's next run too. Joined by id alone,
-- the lost run's row was applied with the current one's: a second outcome (a unique violation that
-- stopped the worker, tests/test_fault_suite.py's restarts) or the lost run's retry. A new name:
-- CREATE OR REPLACE cannot change a function's columns, and the previous release's statements call
-- job_runs_settle() (now a wrapper of this one).
-- Ends the runs a settle names (job_settle_many: a retry, a release, a sleep, a wait, a failure, a
-- cancel, a completion with a key or a parent), fenced by attempt and lease token, each found by
-- primary key, as job_runs_finish_fenced() does for the plain completions (its comment: a generic
-- plan made on a small job_runs scans it whole once it bloats). `states` are the outcomes: a run
-- settled `cancelled` ends only for a stored request (a cancel or a passed deadline sets it on the
-- row); a worker told to cancel by anything else changes nothing. Its own name rather than
-- job_runs_finish_fenced() with a fourth argument: CREATE OR REPLACE would leave both signatures,
-- ambiguous to a three-argument call.
CREATE OR REPLACE FUNCTION {schema}.job_runs_settle_fenced(ids bigint[], attempts integer[],
                                                    lease_tokens uuid[], states text[])
RETURNS TABLE (run_job_id bigint, run_attempt integer, run_executions integer,
               run_worker_id uuid, run_traced boolean, run_started_at timestamptz,
               run_result_watched boolean, run_lease_token uuid)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY
    DELETE FROM {schema}.job_runs u
    USING unnest(ids, attempts, lease_tokens, states) AS i(id, attempt, lease_token, state)
    WHERE u.job_id OPERATOR(pg_catalog.=) i.id
      AND u.attempt OPERATOR(pg_catalog.=) i.attempt
      AND u.lease_token OPERATOR(pg_catalog.=) i.lease_token
      AND u.job_id OPERATOR(pg_catalog.=) ANY(ids)
      AND (i.state OPERATOR(pg_catalog.<>) 'cancelled'
           OR EXISTS (SELECT 1 FROM {schema}.job_rows c
                      WHERE c.id OPERATOR(pg_catalog.=) u.job_id AND c.cancel_requested))
    RETURNING u.job_id, u.attempt, u.executions, u.worker_id, u.traced, u.started_at,
              u.result_watched, u.lease_token;
END
$$;

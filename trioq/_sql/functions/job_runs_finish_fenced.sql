-- Ends the runs the plain completion (job_complete_plain; job_complete_discard joins no row of its
-- batch) names, fenced by attempt and lease token, and returns each ended run's token with what
-- the outcome records: the statement joins its batch's rows to the runs this ended by id, attempt
-- and token. A batch may name one job twice: a completer still holding the outcome of a run it
-- lost (its writes failed while the database was away, and its lease expired, the run recovered)
-- when it finished the job's next run too. Joined by id alone, the lost run's row was applied with
-- the current one's: a second outcome (a unique violation that stopped the worker,
-- tests/test_fault_suite.py's restarts) or the lost run's retry. A new name: CREATE OR REPLACE
-- cannot change a function's columns, and the previous release's statements call job_runs_finish()
-- (now a wrapper of this one).
-- Ends the runs a completion names (job_complete_plain, job_complete_discard: migration 0047),
-- fenced by attempt and lease token, each found by primary key; returns what the job's outcome
-- records (migration 0049: with the queue, so that the completion never reads the record).
-- Replaces job_runs_end(), whose reply had no queue (a return type CREATE OR REPLACE cannot
-- change; 0049 drops it).
-- A function for its SET clause, as ready_ring_take(): job_runs gets a row inserted and
-- deleted per job, and between two vacuums its inserts only extend it (nothing but VACUUM
-- records the space page pruning frees): 3.5 MB, no live row, after a 20,000-job live drain.
-- The completion's generic plan, made in a worker's first seconds while the table had a page
-- or two, hashed a sequential scan of it and kept it as the table grew: 573 buffer hits a
-- completion of 25 against 415 by key (bench/RESULTS.md, "job_runs' plans"). With seqscan
-- off the runs are always found by primary key, whatever the table's size when planned.
CREATE OR REPLACE FUNCTION {schema}.job_runs_finish_fenced(ids bigint[], attempts integer[],
                                                 lease_tokens uuid[])
RETURNS TABLE (run_job_id bigint, run_attempt integer, run_executions integer,
               run_worker_id uuid, run_traced boolean, run_started_at timestamptz,
               run_result_watched boolean, run_queue text,
               run_lease_token uuid)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY
    DELETE FROM {schema}.job_runs u
    USING unnest(ids, attempts, lease_tokens) AS i(id, attempt, lease_token)
    WHERE u.job_id OPERATOR(pg_catalog.=) i.id
      AND u.attempt OPERATOR(pg_catalog.=) i.attempt
      AND u.lease_token OPERATOR(pg_catalog.=) i.lease_token
      AND u.job_id OPERATOR(pg_catalog.=) ANY(ids)
    RETURNING u.job_id, u.attempt, u.executions, u.worker_id, u.traced, u.started_at,
              u.result_watched, u.queue, u.lease_token;
END
$$;

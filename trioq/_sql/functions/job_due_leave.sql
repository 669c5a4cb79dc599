-- Deletes the job_due rows of jobs the calling statement moved out of scheduled, sleeping or
-- waiting (migration 0050: the statements that change a record's phase write job_due
-- themselves; the claim's promotion and due claim call this). A function for its fresh
-- snapshot: the calling statement locked each record on its newest version, and a copy filed
-- after that statement's snapshot (the record left its due spell and came back while the claim
-- ran) is invisible to a DELETE written in the statement, which would leave it stale for good
-- (a next due time no claim ever clears); a VOLATILE function's query sees every commit before
-- it, and under the records' locks no other copy can come. By primary key whatever job_due's
-- size (its SET clauses, as ready_keyed_take()'s); one generic plan for every call.
CREATE OR REPLACE FUNCTION {schema}.job_due_leave(ids bigint[]) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    left_count bigint;
BEGIN
    DELETE FROM {schema}.job_due d WHERE d.job_id OPERATOR(pg_catalog.=) ANY(ids);
    GET DIAGNOSTICS left_count = ROW_COUNT;
    RETURN left_count;
END
$$;

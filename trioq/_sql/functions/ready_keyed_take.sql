-- Deletes the ready_keyed entries a claim took (migration 0048; job_claim's keyed_taken), by
-- row address: `rows` the entries' ctids, `ids` their jobs (a guard: an address names the
-- entry the claim read, and its job's id must match). A function for its SET clauses, as
-- ready_ring_take(): the DELETE written in the claim statement was planned, in the generic
-- plan made while the table was small, as a sequential scan of ready_keyed
-- (tests/test_claim_path.py), which a key's backlog of thousands of entries would make read
-- whole at every keyed claim. With seqscan off it is a TID scan of at most `limit` addresses,
-- whatever the table's size; one generic plan for every call.
CREATE OR REPLACE FUNCTION {schema}.ready_keyed_take(rows tid[], ids bigint[]) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    taken bigint;
BEGIN
    DELETE FROM {schema}.ready_keyed e WHERE e.ctid = ANY(rows) AND e.id = ANY(ids);
    GET DIAGNOSTICS taken = ROW_COUNT;
    RETURN taken;
END
$$;

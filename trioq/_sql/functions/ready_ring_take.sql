-- Deletes the ready ring's entries a claim took (migration 0039; the claim statements'
-- ring_taken), by row address: `rows` the entries' ctids, `ids` their jobs (a ctid names a
-- row within one slot; the id tells a slot's entry from another slot's at the same address).
-- A function for its SET clause: in the claim statement's generic plan a slot that was small
-- when it was planned was deleted from by a sequential scan (a TID scan of 25 addresses is
-- costed as 25 random page reads, a scan of a slot under ~100 pages as less), and that plan
-- was kept while the slot grew to thousands of entries. With seqscan off every slot is a TID
-- scan: 25 fetches, whatever the slot's size.
-- And one generic plan for every call: left to choose, PL/pgSQL's plan cache compares each
-- call's custom plan with the generic one, and a custom plan of an empty array (an idle
-- queue's claim) or of a few addresses is cheaper than the generic plan's guess of ten, so
-- after the idle claims a worker starts with, it planned the DELETE at every call, 25
-- addresses included: 240 us a call against 78 with the generic plan (`SELECT 1`: 43).
CREATE OR REPLACE FUNCTION {schema}.ready_ring_take(rows tid[], ids bigint[]) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    taken bigint;
BEGIN
    DELETE FROM {schema}.ready_ring r WHERE r.ctid = ANY(rows) AND r.id = ANY(ids);
    GET DIAGNOSTICS taken = ROW_COUNT;
    RETURN taken;
END
$$;

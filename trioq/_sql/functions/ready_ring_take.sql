-- Deletes the ready ring's entries a claim took (migration 0039; the claim statements'
-- ring_taken), by row address: `rows` the entries' ctids, `ids` their jobs (a ctid names a
-- row within one slot; the id tells a slot's entry from another slot's at the same address).
-- A function for its SET clause: in the claim statement's generic plan a slot that was small
-- when it was planned was deleted from by a sequential scan (a TID scan of 25 addresses is
-- costed as 25 random page reads, a scan of a slot under ~100 pages as less), and that plan
-- was kept while the slot grew to thousands of entries. With seqscan off every slot is a TID
-- scan: 25 fetches, whatever the slot's size.
CREATE OR REPLACE FUNCTION {schema}.ready_ring_take(rows tid[], ids bigint[]) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off AS $$
DECLARE
    taken bigint;
BEGIN
    DELETE FROM {schema}.ready_ring r WHERE r.ctid = ANY(rows) AND r.id = ANY(ids);
    GET DIAGNOSTICS taken = ROW_COUNT;
    RETURN taken;
END
$$;

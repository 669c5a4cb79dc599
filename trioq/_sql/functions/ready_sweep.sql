-- Truncates the ready ring's drained slots (migration 0039): a slot that is not being written
-- (ready_slot() of now and of the coming 5 s), holds no entry of a job that is still ready
-- (an entry that outlived its job's readiness, a cancelled job's, goes with its slot) and
-- has pages left. A TRUNCATE
-- leaves no dead tuple, whatever snapshot is open: what vacuum cannot remove while a long
-- transaction pins the horizon is gone here. Every lock waits 10 ms at most (the claims
-- queued behind the request wait no longer; with NOWAIT the claims, which read every slot,
-- refused most tries): a slot a claim, an enqueue's open transaction or a `pg_dump` is
-- holding is left for the next call (an
-- enqueue that filed a row there holds its lock until it commits, so no entry is lost: and
-- a claim reads every slot, so a row filed late in an old slot is found). The elected leader
-- calls it every 2 s from a maintenance pass that found a slot with pages until no slot has
-- any (trioq/_runtime/services/maintenance.py). Returns the slots truncated and the slots
-- that still have pages (ready_pending(); 0: nothing to sweep until jobs become ready again).
-- SECURITY DEFINER: a worker's role may not TRUNCATE (docs/operations.md, "Roles"). It takes no
-- input; every name it builds is `ready_ring_` and a digit.
CREATE OR REPLACE FUNCTION {schema}.ready_sweep()
RETURNS TABLE (truncated integer, pending integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '10ms' AS $$
DECLARE
    writing   smallint := {schema}.ready_slot(now());
    next_slot smallint := {schema}.ready_slot(now() + interval '5 seconds');
    slot      smallint;
    filled    boolean;
BEGIN
    truncated := 0;
    FOR slot IN 0 .. 3 LOOP
        CONTINUE WHEN slot IN (writing, next_slot);
        CONTINUE WHEN pg_relation_size(format('{schema}.ready_ring_%s', slot)::regclass) = 0;
        BEGIN
            EXECUTE format('LOCK TABLE {schema}.ready_ring_%s IN ACCESS EXCLUSIVE MODE', slot);
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM {schema}.ready_ring_%s r'
                           ' JOIN {schema}.jobs_live j ON j.id = r.id AND j.state = ''ready'')',
                           slot)
                INTO filled;
            IF NOT filled THEN
                EXECUTE format('TRUNCATE {schema}.ready_ring_%s', slot);
                truncated := truncated + 1;
            END IF;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END LOOP;
    pending := {schema}.ready_pending();
    RETURN NEXT;
END
$$;

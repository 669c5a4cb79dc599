-- The lowest slot of the ready ring the claims and the counters read (migration 0041: a bank
-- the ring has left, while a `pg_dump` holds it, lies below). A state emptied by hand (a test
-- suite truncating every table) reads as 0, the first bank, as ready_ring_file() files there.
-- A STABLE call, not inlined (its body holds a sub-select), so a statement comparing `slot`
-- with it prunes the slots below as it starts ("Subplans Removed": their scans never run).
-- No SET clause, so it names its relation by schema (tests/test_search_path.py).
CREATE OR REPLACE FUNCTION {schema}.ready_ring_low() RETURNS smallint
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce((SELECT s.low FROM {schema}.ready_ring_state s), 0::smallint)
$$;

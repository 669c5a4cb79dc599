-- The lowest slot of the ready ring the claims and the counters read (migration 0041: a bank
-- the ring has left, while a `pg_dump` holds it, lies below). A state emptied by hand (a test
-- suite truncating every table) reads as 0, the first bank, as ready_ring_file() files there.
-- Statements read it once, by a sub-select (`slot >= (SELECT ready_ring_low())`), which
-- prunes the slots below as the statement runs (their scans are never executed).
-- PL/pgSQL, not SQL: its body holds a sub-select, so as SQL it was never inlined, and a called
-- SQL function parses and plans its body at every statement that calls it (94 us a claim in a
-- drain); PL/pgSQL keeps the plan for the session.
-- No SET clause, so it names its relation by schema (tests/test_search_path.py).
CREATE OR REPLACE FUNCTION {schema}.ready_ring_low() RETURNS smallint
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN coalesce((SELECT s.low FROM {schema}.ready_ring_state s), 0::smallint);
END
$$;

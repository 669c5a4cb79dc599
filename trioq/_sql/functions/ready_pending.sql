-- The ready ring's slots that have pages (migration 0039): what ready_sweep() may still have
-- to truncate. The leader's maintenance pass reads it (while it is above 0 the leader sweeps
-- every 2 s), and so does ready_sweep() after its truncations. Every name it builds is
-- `ready_ring_` and a digit.
CREATE OR REPLACE FUNCTION {schema}.ready_pending() RETURNS integer
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT count(*)::integer FROM generate_series(0, 3) AS s(n)
    WHERE pg_relation_size(('{schema}.ready_ring_' || s.n)::regclass) > 0
$$;

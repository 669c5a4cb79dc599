-- What ready_sweep() may still have to do (migrations 0039, 0041): the ready ring's slots that
-- have pages or lie below `low` (a bank left behind, dropped once it can be), and 1 while a
-- bank is still read below `base`. The leader's maintenance pass reads it (while it is above 0
-- the leader sweeps every 2 s), and so does ready_sweep() after its work.
CREATE OR REPLACE FUNCTION {schema}.ready_pending() RETURNS integer
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT (SELECT count(*)::integer
            FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = '{schema}.ready_ring'::regclass
              AND (pg_relation_size(c.oid) > 0
                   OR (c.relname ~ '^ready_ring_[0-9]+$'
                       AND substr(c.relname, 12)::integer < coalesce(s.low, 0))))
           + coalesce((s.low < s.base)::integer, 0)
    FROM (SELECT 1) AS one LEFT JOIN {schema}.ready_ring_state s ON true
$$;

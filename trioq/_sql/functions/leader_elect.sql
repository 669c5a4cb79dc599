-- Take or extend the seat; true when `candidate` holds it afterwards. The seat is taken when it
-- is free, expired, or held by a leader that does not run the scheduler while this candidate
-- does (so schedules keep firing in a fleet where some workers run with the scheduler off).
-- Locking: INSERT .. ON CONFLICT DO UPDATE locks the one row, and its WHERE is evaluated on the
-- newest version once locked, so of two candidates racing for an expired seat exactly one wins.
CREATE OR REPLACE FUNCTION {schema}.leader_elect(candidate uuid, runs_scheduler boolean, ttl_seconds float8)
RETURNS boolean
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO {schema}.leader AS l (seat, leader_id, scheduler, elected_at, expires_at)
    VALUES (1, candidate, runs_scheduler, {schema}.db_now(),
            {schema}.db_now() + ttl_seconds * interval '1 second')
    ON CONFLICT (seat) DO UPDATE
    SET leader_id = excluded.leader_id,
        scheduler = excluded.scheduler,
        elected_at = CASE WHEN l.leader_id = excluded.leader_id THEN l.elected_at
                          ELSE excluded.elected_at END,
        expires_at = excluded.expires_at
    WHERE l.leader_id = excluded.leader_id
       OR l.expires_at < {schema}.db_now()
       OR (excluded.scheduler AND NOT l.scheduler)
    RETURNING true
$$;

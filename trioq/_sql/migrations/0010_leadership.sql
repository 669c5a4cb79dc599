-- trioq schema, version 10: ONE elected leader per schema runs maintenance and the scheduler
-- (River's leader table, Oban's Peer). The seat is one row with a TTL: the leader extends it
-- with every maintenance pass, the other workers try to take it when it has expired, and a
-- leader that drains or stops deletes it (and tells the others on the control channel), so
-- leadership moves at once on a clean stop and within the TTL when the leader dies.
CREATE TABLE {schema}.leader (
    seat       int PRIMARY KEY DEFAULT 1 CHECK (seat = 1),
    leader_id  uuid NOT NULL,
    scheduler  boolean NOT NULL,  -- the leader runs the scheduler (WorkerConfig.run_scheduler)
    elected_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);

-- Take or extend the seat; true when `candidate` holds it afterwards. The seat is taken when it
-- is free, expired, or held by a leader that does not run the scheduler while this candidate
-- does (so schedules keep firing in a fleet where some workers run with the scheduler off).
-- Locking: INSERT .. ON CONFLICT DO UPDATE locks the one row, and its WHERE is evaluated on the
-- newest version once locked, so of two candidates racing for an expired seat exactly one wins.
CREATE FUNCTION {schema}.leader_elect(candidate uuid, runs_scheduler boolean, ttl_seconds float8)
RETURNS boolean
LANGUAGE sql VOLATILE AS $$
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

-- What a claim poll would find, per queue, without claiming: whether work is due (a ready row,
-- or a scheduled/sleeping/waiting row whose run_at has passed, which the next claim promotes)
-- and the first future due time. The periodic statements of the worker's services (leader
-- election, maintenance) carry it, so an idle claim loop told "nothing due" skips its next
-- poll: the services' statements stand in for polls instead of adding to them.
-- Planner: per queue three index probes, each LIMIT 1 on a partial index that holds only
-- ready rows (jobs_ready_unkeyed_idx, jobs_partition_ready_idx) or only due-able rows
-- (jobs_due_idx); finished history is never read.
CREATE FUNCTION {schema}.queue_probe(queues text[])
RETURNS TABLE (queue text, work_due boolean, next_due timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT q.queue,
           EXISTS (SELECT 1 FROM {schema}.jobs j
                   WHERE j.queue = q.queue AND j.state = 'ready' AND j.partition_key IS NULL)
           OR EXISTS (SELECT 1 FROM {schema}.jobs j
                      WHERE j.queue = q.queue AND j.state = 'ready'
                        AND j.partition_key IS NOT NULL)
           OR coalesce(d.run_at <= {schema}.db_now(), false),
           CASE WHEN d.run_at > {schema}.db_now() THEN d.run_at END
    FROM unnest(queues) WITH ORDINALITY AS q(queue, ord)
    LEFT JOIN LATERAL (
        SELECT j.run_at FROM {schema}.jobs j
        WHERE j.queue = q.queue AND j.state IN ('scheduled', 'sleeping', 'waiting')
          AND j.run_at IS NOT NULL
        ORDER BY j.run_at LIMIT 1
    ) AS d ON true
    ORDER BY q.ord
$$;

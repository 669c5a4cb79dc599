-- The gate of a limited queue's claim: how many of `requested` jobs the claim may take now.
-- It locks the queue's row (FOR UPDATE: limited claims of the queue run one at a time, until
-- the claimer's COMMIT) and then counts the queue's running jobs. VOLATILE and plpgsql, so the
-- count runs on a snapshot taken after the lock was granted: every claim that held the lock
-- before has committed and is counted (in one statement, the count would read the snapshot
-- from before the lock wait, and two claimers could both see the same free slots). Settles and
-- lease recoveries meanwhile only lower the count. The running count reads job_runs whole
-- (every run, filtered by queue): its cost grows with the cluster's running jobs and is paid
-- by limited queues only; an index of the runs' queue would be paid by every claim and
-- completion of every queue.
-- `started_at`: the claim's start time, read after the count (database time, as db_now()
-- moves). queue_limit_spend stores it on the claimed rows and in the rate's log: the
-- transaction's own now() is its BEGIN, before the lock wait, and a job another worker
-- settled during that wait (not counted) would seem to overlap the new ones. Read after the
-- count, every job not counted finished before it, and the stored start and finish times
-- show the limit exactly. They increase from one limited claim to the next (one at a time).
-- Rate: `next_start_at` is when the next start is allowed once this claim has used `allowed`
-- (NULL: a start is allowed now).
CREATE OR REPLACE FUNCTION {schema}.queue_limit_gate(
    gate_queue text, requested integer,
    OUT allowed integer, OUT running integer, OUT global_limit integer,
    OUT rate_allowed integer, OUT rate_period double precision, OUT next_start_at timestamptz,
    OUT started_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    l {schema}.queue_limits%ROWTYPE;
    recent integer;
BEGIN
    allowed := requested;
    SELECT * INTO l FROM {schema}.queue_limits q WHERE q.queue = gate_queue FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    global_limit := l.global_limit;
    rate_allowed := l.rate_allowed;
    rate_period := l.rate_period;
    IF l.global_limit IS NOT NULL THEN
        -- The runs carry their queue (migration 0047).
        SELECT count(*) INTO running FROM {schema}.job_runs u WHERE u.queue = gate_queue;
        allowed := least(allowed, greatest(l.global_limit - running, 0));
    END IF;
    started_at := {schema}.db_now() + (clock_timestamp() - now());
    IF l.rate_allowed IS NOT NULL THEN
        SELECT count(*) INTO recent FROM unnest(l.recent_starts) AS s(at)
        WHERE s.at > started_at - l.rate_period * interval '1 second';
        allowed := least(allowed, greatest(l.rate_allowed - recent, 0));
        -- The window is full once this claim's starts are in: the next start is allowed when
        -- the oldest start still counted leaves it.
        IF recent + allowed >= l.rate_allowed THEN
            next_start_at := (SELECT s.at FROM unnest(l.recent_starts) AS s(at)
                              WHERE s.at > started_at - l.rate_period * interval '1 second'
                              ORDER BY s.at OFFSET (recent + allowed - l.rate_allowed) LIMIT 1)
                             + l.rate_period * interval '1 second';
            next_start_at := coalesce(next_start_at,
                                      started_at + l.rate_period * interval '1 second');
        END IF;
    END IF;
END
$$;

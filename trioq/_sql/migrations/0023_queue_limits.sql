-- trioq schema, version 23: cluster-wide limits per queue (`trioq queue limit NAME N`, `trioq
-- queue rate NAME N/PERIOD`). A queue has a row only while it has a limit: a queue without one
-- never reads this table in its claim (PgDriver runs the gate only for queues with a row).
CREATE TABLE {schema}.queue_limits (
    queue text PRIMARY KEY,
    -- At most this many of the queue's jobs running at once, across every worker.
    global_limit integer CHECK (global_limit BETWEEN 1 AND 100000),
    -- At most rate_allowed starts in any window of rate_period seconds.
    rate_allowed integer CHECK (rate_allowed BETWEEN 1 AND 10000),
    rate_period double precision CHECK (rate_period > 0),
    -- The start times of the queue's last rate_allowed starts, oldest first (a sliding log:
    -- exact for any window, unlike a GCRA, whose burst tolerance lets a window hold up to
    -- 2N-1 starts). Never trimmed by age: a claim whose transaction began a little earlier
    -- than the previous one's still sees every start its window holds.
    recent_starts timestamptz[] NOT NULL DEFAULT '{}',
    updated_at timestamptz NOT NULL,
    CHECK ((rate_allowed IS NULL) = (rate_period IS NULL)),
    CHECK (global_limit IS NOT NULL OR rate_allowed IS NOT NULL)
);

-- The gate of a limited queue's claim: how many of `requested` jobs the claim may take now.
-- It locks the queue's row (FOR UPDATE: limited claims of the queue run one at a time, until
-- the claimer's COMMIT) and then counts the queue's running jobs. VOLATILE and plpgsql, so the
-- count runs on a snapshot taken after the lock was granted: every claim that held the lock
-- before has committed and is counted (in one statement, the count would read the snapshot
-- from before the lock wait, and two claimers could both see the same free slots). Settles and
-- lease recoveries meanwhile only lower the count. The running count reads jobs_lease_idx
-- (every running row, filtered by queue): its cost grows with the cluster's running jobs and
-- is paid by limited queues only; an index on (queue) WHERE state = 'running' would be paid
-- by every claim and settle of every queue.
-- `started_at`: the claim's start time, read after the count (database time, as db_now()
-- moves). queue_limit_spend stores it on the claimed rows and in the rate's log: the
-- transaction's own now() is its BEGIN, before the lock wait, and a job another worker
-- settled during that wait (not counted) would seem to overlap the new ones. Read after the
-- count, every job not counted finished before it, and the stored start and finish times
-- show the limit exactly. They increase from one limited claim to the next (one at a time).
-- Rate: `next_start_at` is when the next start is allowed once this claim has used `allowed`
-- (NULL: a start is allowed now).
CREATE FUNCTION {schema}.queue_limit_gate(
    gate_queue text, requested integer,
    OUT allowed integer, OUT running integer, OUT global_limit integer,
    OUT rate_allowed integer, OUT rate_period double precision, OUT next_start_at timestamptz,
    OUT started_at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
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
        SELECT count(*) INTO running FROM {schema}.jobs j
        WHERE j.state = 'running' AND j.queue = gate_queue;
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

-- A limited claim's starts, recorded in its transaction (the gate's lock is still held): the
-- claimed rows' started_at becomes the gate's `started_at` (see above), and with a rate the
-- log keeps the newest rate_allowed start times, oldest first. Returns when the next start is
-- allowed (NULL: now, or no rate).
CREATE FUNCTION {schema}.queue_limit_spend(spend_queue text, claimed bigint[],
                                           claimed_at timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    l {schema}.queue_limits%ROWTYPE;
    kept timestamptz[];
BEGIN
    UPDATE {schema}.jobs j SET started_at = claimed_at
    WHERE claimed_at IS NOT NULL AND j.id = ANY(claimed) AND j.state = 'running';
    SELECT * INTO l FROM {schema}.queue_limits q WHERE q.queue = spend_queue FOR UPDATE;
    IF NOT FOUND OR l.rate_allowed IS NULL OR cardinality(claimed) = 0 THEN
        RETURN NULL;
    END IF;
    kept := ARRAY(SELECT newest.at FROM (
                      SELECT s.at FROM unnest(l.recent_starts
                                              || array_fill(claimed_at,
                                                            ARRAY[cardinality(claimed)]))
                                       AS s(at)
                      ORDER BY s.at DESC LIMIT l.rate_allowed) AS newest
                  ORDER BY newest.at);
    UPDATE {schema}.queue_limits q SET recent_starts = kept WHERE q.queue = spend_queue;
    IF cardinality(kept) < l.rate_allowed THEN
        RETURN NULL;
    END IF;
    RETURN kept[1] + l.rate_period * interval '1 second';
END
$$;

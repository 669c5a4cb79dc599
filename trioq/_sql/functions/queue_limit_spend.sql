-- A limited queue's claim records its starts: the claimed rows' started_at and the rate's log.
-- The stored start is the later of the gate's time (queue_limit_gate) and the claim's own. The
-- gate's time comes before the claim statement's snapshot, and a concurrency key's slot freed
-- by a job that finished in between is taken by the claim: stored as the gate's time, that
-- start preceded the finish, and the stored intervals showed a key limit of 3 reached 5 times
-- at once with 4 workers racing (the handlers' own log: 3). The claim stores a keyed job's
-- start from its clock after its snapshot, so the later time keeps both the queue's and the
-- key's stored intervals exact. The rate's log takes the starts as stored: each is after the
-- gate's count, before this claim's commit (so before the next gate's time), which keeps the
-- window rule exact on stored starts.
CREATE OR REPLACE FUNCTION {schema}.queue_limit_spend(spend_queue text, claimed bigint[],
                                                      claimed_at timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    l {schema}.queue_limits%ROWTYPE;
    kept timestamptz[];
BEGIN
    UPDATE {schema}.job_runs u SET started_at = greatest(u.started_at, claimed_at)
    WHERE claimed_at IS NOT NULL AND u.job_id = ANY(claimed);
    SELECT * INTO l FROM {schema}.queue_limits q WHERE q.queue = spend_queue FOR UPDATE;
    IF NOT FOUND OR l.rate_allowed IS NULL OR cardinality(claimed) = 0 THEN
        RETURN NULL;
    END IF;
    kept := ARRAY(SELECT newest.at FROM (
                      SELECT s.at FROM (
                          SELECT unnest(l.recent_starts) AS at
                          UNION ALL
                          SELECT coalesce(u.started_at, claimed_at) FROM unnest(claimed) AS c(id)
                          LEFT JOIN {schema}.job_runs u ON u.job_id = c.id) AS s
                      ORDER BY s.at DESC LIMIT l.rate_allowed) AS newest
                  ORDER BY newest.at);
    UPDATE {schema}.queue_limits q SET recent_starts = kept WHERE q.queue = spend_queue;
    IF cardinality(kept) < l.rate_allowed THEN
        RETURN NULL;
    END IF;
    RETURN kept[1] + l.rate_period * interval '1 second';
END
$$;

-- trioq schema, version 28: rate limits per concurrency key (`trioq key rate PATTERN N/PERIOD`,
-- docs/flow-control.md): at most N starts of a key's jobs in any window of PERIOD, across every
-- queue and worker. A cluster with no row in concurrency_rates claims with the statements it
-- used before (PgDriver asks once a second whether any rate is set: `key_rated`).

-- Rates set by operators or code, by pattern as for concurrency_limits (a whole key or a prefix
-- ending in `*`; the longest matching pattern wins). Kept apart from the limits: a key may have
-- a rate, a limit, or both, and removing one leaves the other.
CREATE TABLE {schema}.concurrency_rates (
    pattern      text             PRIMARY KEY
                                  CHECK (length(pattern) BETWEEN 1 AND 512
                                         AND position('*' IN left(pattern, -1)) = 0),
    rate_allowed integer          NOT NULL CHECK (rate_allowed BETWEEN 1 AND 10000),
    rate_period  double precision NOT NULL CHECK (rate_period > 0),
    updated_at   timestamptz      NOT NULL
);

-- A rated key's starts: slot 0 .. rate_allowed-1 of the key, each holding the time of its last
-- start. A start takes a slot whose last start is at least a period old (or a new slot), so two
-- starts of one slot are a period apart and any window of one period holds at most one start
-- per slot: at most rate_allowed, the queue rate's sliding-log rule (migration 0023) spread
-- over rows. The claim takes a slot with INSERT .. ON CONFLICT DO UPDATE .. WHERE the slot's
-- last start is old enough: the WHERE is checked on the newest version of the row, after
-- waiting for a racing claimer's commit, never on the statement's snapshot, so two claimers
-- whose snapshots both saw the slot free never both take it (the loser's row is not returned
-- and its job is not claimed). `rate_period` is the period the start was taken under; `job_id`
-- the job it started (for reading, not a reference: the job may be gone).
CREATE TABLE {schema}.concurrency_rate_starts (
    concurrency_key text             NOT NULL,
    slot            integer          NOT NULL CHECK (slot >= 0),
    started_at      timestamptz      NOT NULL,
    rate_period     double precision NOT NULL,
    job_id          bigint           NOT NULL,
    PRIMARY KEY (concurrency_key, slot)
);

-- The rate that applies to `key`: the longest matching pattern (the whole key before a prefix
-- of the same length), as concurrency_limit_of picks a limit; no row: the key has no rate.
CREATE FUNCTION {schema}.concurrency_rate_of(key text)
RETURNS TABLE (rate_allowed integer, rate_period double precision)
LANGUAGE sql STABLE AS $$
    SELECT r.rate_allowed, r.rate_period FROM {schema}.concurrency_rates r
    WHERE r.pattern = key
       OR (right(r.pattern, 1) = '*' AND starts_with(key, left(r.pattern, -1)))
    ORDER BY length(r.pattern) DESC, right(r.pattern, 1) = '*' LIMIT 1
$$;

-- A limited queue's claim (migration 0023) that also takes concurrency keys: its stored start
-- is the later of the gate's time and the claim's own. The gate's time comes before the claim
-- statement's snapshot, and a key's slot freed by a job that finished in between is taken by
-- the claim: stored as the gate's time, that start preceded the finish, and the stored
-- intervals showed a key limit of 3 reached 5 times at once with 4 workers racing (the
-- handlers' own log: 3). The claim stores a keyed job's start from its clock after its
-- snapshot, so the later time keeps both the queue's and the key's stored intervals exact.
-- The rate's log takes the starts as stored: each is after the gate's count, before this
-- claim's commit (so before the next gate's time), which keeps the window rule exact on
-- stored starts.
CREATE OR REPLACE FUNCTION {schema}.queue_limit_spend(spend_queue text, claimed bigint[],
                                                      claimed_at timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    l {schema}.queue_limits%ROWTYPE;
    kept timestamptz[];
BEGIN
    UPDATE {schema}.jobs j SET started_at = greatest(j.started_at, claimed_at)
    WHERE claimed_at IS NOT NULL AND j.id = ANY(claimed) AND j.state = 'running';
    SELECT * INTO l FROM {schema}.queue_limits q WHERE q.queue = spend_queue FOR UPDATE;
    IF NOT FOUND OR l.rate_allowed IS NULL OR cardinality(claimed) = 0 THEN
        RETURN NULL;
    END IF;
    kept := ARRAY(SELECT newest.at FROM (
                      SELECT s.at FROM (
                          SELECT unnest(l.recent_starts) AS at
                          UNION ALL
                          SELECT coalesce(j.started_at, claimed_at) FROM unnest(claimed) AS c(id)
                          LEFT JOIN {schema}.jobs j ON j.id = c.id) AS s
                      ORDER BY s.at DESC LIMIT l.rate_allowed) AS newest
                  ORDER BY newest.at);
    UPDATE {schema}.queue_limits q SET recent_starts = kept WHERE q.queue = spend_queue;
    IF cardinality(kept) < l.rate_allowed THEN
        RETURN NULL;
    END IF;
    RETURN kept[1] + l.rate_period * interval '1 second';
END
$$;

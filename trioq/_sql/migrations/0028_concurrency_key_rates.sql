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

-- concurrency_rate_of(): its current body is trioq/_sql/functions/concurrency_rate_of.sql.

-- queue_limit_spend(): its current body is trioq/_sql/functions/queue_limit_spend.sql.

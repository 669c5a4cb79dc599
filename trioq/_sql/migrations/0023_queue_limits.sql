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

-- queue_limit_gate(): its current body is trioq/_sql/functions/queue_limit_gate.sql.

-- queue_limit_spend(): its current body is trioq/_sql/functions/queue_limit_spend.sql.

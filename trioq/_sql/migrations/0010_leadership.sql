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

-- leader_elect(): its current body is trioq/_sql/functions/leader_elect.sql.

-- queue_probe(): its current body is trioq/_sql/functions/queue_probe.sql.

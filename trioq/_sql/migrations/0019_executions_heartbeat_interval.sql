-- trioq schema, version 19: a job's executions, and each worker's heartbeat interval.
--
-- `executions` counts the claims of a job. `attempt` counts only the executions that may fail
-- (a workflow's sleep or wait gives its attempt back), so a workflow that ran twice showed
-- `try 0/5` in `trioq jobs`. The claim's SET list raises it in the row update it makes anyway.
-- Adding a column with a constant default rewrites nothing (PostgreSQL 11+).
ALTER TABLE {schema}.jobs ADD COLUMN executions integer NOT NULL DEFAULT 0;

-- `heartbeat_seconds`: the longest gap the worker promises between two heartbeats (an idle
-- worker beats with its election or maintenance pass). `trioq status` calls a worker silent
-- for more than two of them "probably dead", and `trioq explain` does not count it as live.
-- NULL for workers registered by an older version: the fixed 120 s rule applies to them.
ALTER TABLE {schema}.workers ADD COLUMN heartbeat_seconds float8
    CHECK (heartbeat_seconds > 0);

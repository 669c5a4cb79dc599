-- Version 7: cron schedules, and handler versions on jobs and workers.

-- One row per schedule, declared in code (`@app.periodic`, upserted by each starting worker)
-- or at runtime (`client.schedule`). The elected scheduler enqueues each fire time once: it
-- advances next_fire_at with a fence on the value it read, in the same statement that inserts
-- the occurrence's job (whose dedup key names the schedule and the fire time).
CREATE TABLE {schema}.schedules (
    name          text        PRIMARY KEY
                  CHECK (name ~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$'),
    task          text        NOT NULL
                  CHECK (task ~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$'),
    queue         text        NOT NULL
                  CHECK (queue ~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$'),
    payload       jsonb       NOT NULL CHECK (pg_column_size(payload) <= 4000000),
    cron          text        NOT NULL CHECK (length(cron) BETWEEN 1 AND 256),
    timezone      text        NOT NULL CHECK (length(timezone) BETWEEN 1 AND 128),
    misfire       text        NOT NULL CHECK (misfire IN ('skip', 'latest', 'all')),
    catchup_limit integer     NOT NULL CHECK (catchup_limit BETWEEN 1 AND 10000),
    max_attempts  integer     NOT NULL CHECK (max_attempts >= 1),
    version       integer     NOT NULL DEFAULT 1 CHECK (version >= 1),
    origin        text        NOT NULL CHECK (origin IN ('code', 'runtime')),
    -- Fire times start after anchor_at (set when the schedule is created or re-timed).
    anchor_at     timestamptz NOT NULL,
    -- NULL until the scheduler computes it from anchor_at (cron maths lives in Python).
    next_fire_at  timestamptz,
    last_fire_at  timestamptz,
    fired         bigint      NOT NULL DEFAULT 0,
    missed        bigint      NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL
);
CREATE INDEX schedules_next_fire_idx ON {schema}.schedules (next_fire_at NULLS FIRST);

-- Handler versions: a job runs only on a worker that serves its (task, version).
ALTER TABLE {schema}.jobs ADD COLUMN version integer NOT NULL DEFAULT 1 CHECK (version >= 1);
-- The (task, version) pairs a worker serves, as 'task@version' ('@' is not allowed in names).
ALTER TABLE {schema}.workers ADD COLUMN task_versions text[] NOT NULL DEFAULT '{}';

-- trioq schema, version 3: durable events and child jobs (docs/workflows.md, "Lock order").
-- Needs version 2 (the `waiting` state, checkpoints).

-- One row per event key. A row with emitted_at NULL was only waited for so far: the waiter
-- inserts it so that the waiter and the emitter always meet on the SAME row lock, whichever
-- comes first (see event_emit below and job_wait_event in queries.sql). The first emit fills
-- payload and emitted_at; later emits change nothing (the first emit wins).
CREATE TABLE {schema}.events (
    key        text        PRIMARY KEY CHECK (length(key) BETWEEN 1 AND 512),
    payload    jsonb,
    emitted_at timestamptz,
    created_at timestamptz NOT NULL
);
-- Retention prunes events oldest first (maintenance_pass).
CREATE INDEX events_age_idx ON {schema}.events ((coalesce(emitted_at, created_at)));

-- Children: a child records its parent and the parent's checkpoint position that spawned it;
-- the unique index makes a spawn exactly-once per (parent, position) across replays, and it is
-- also the index cancel cascades walk ("the children of job X").
ALTER TABLE {schema}.jobs ADD COLUMN parent_id bigint;
ALTER TABLE {schema}.jobs ADD COLUMN parent_position integer;
CREATE UNIQUE INDEX jobs_parent_idx ON {schema}.jobs (parent_id, parent_position)
    WHERE parent_id IS NOT NULL;

-- What a waiting job waits for: an event key, or the set of its children not final yet.
-- children_settled counts this job's children that reached a final state; a parent about to
-- suspend compares it with the value its snapshot saw, under its own row lock, so a child that
-- finished in between is never missed (no lost wake-up, no lock on the children).
ALTER TABLE {schema}.jobs ADD COLUMN wait_event_key text;
ALTER TABLE {schema}.jobs ADD COLUMN wait_children bigint[];
ALTER TABLE {schema}.jobs ADD COLUMN children_settled integer NOT NULL DEFAULT 0;
CREATE INDEX jobs_wait_event_idx ON {schema}.jobs (wait_event_key)
    WHERE wait_event_key IS NOT NULL;

-- event_emit(): its current body is trioq/_sql/functions/event_emit.sql.

-- parents_notify(): its current body is trioq/_sql/functions/parents_notify.sql.

-- job_cancel_tree(): its current body is trioq/_sql/functions/job_cancel_tree.sql.

-- job_cancel_children(): its current body is trioq/_sql/functions/job_cancel_children.sql.

-- trioq schema, version 2: the workflow state model, checkpoints and partition-key locks.
--
-- States (docs/state-machine.md): `scheduled` (not due yet: delayed enqueue, retry backoff; holds
-- no partition key), `ready` (due and claimable: the only state in the claim indexes),
-- `running`, `sleeping` (durable sleep until run_at; holds its key), `waiting` (suspended on an
-- event or children until woken, or until run_at when it has a deadline; holds its key), and the
-- final `completed`, `failed`, `cancelled`.

ALTER TABLE {schema}.jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE {schema}.jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('scheduled', 'ready', 'running', 'sleeping', 'waiting',
                     'completed', 'failed', 'cancelled'));
-- A waiting job without a deadline has no run_at; every other state has one.
ALTER TABLE {schema}.jobs ALTER COLUMN run_at DROP NOT NULL;
ALTER TABLE {schema}.jobs ADD CONSTRAINT jobs_run_at_check
    CHECK (run_at IS NOT NULL OR state IN ('waiting', 'completed', 'failed', 'cancelled'));
-- How much history the job has: the next checkpoint position (0: none). The claim loads
-- history only for jobs whose count is above 0, so plain jobs pay nothing for workflows.
ALTER TABLE {schema}.jobs ADD COLUMN checkpoint_count integer NOT NULL DEFAULT 0
    CHECK (checkpoint_count >= 0);

-- Existing future-dated ready rows become scheduled: due work only is in the claim's path.
UPDATE {schema}.jobs SET state = 'scheduled' WHERE state = 'ready' AND run_at > {schema}.db_now();

-- Promotion (scheduled/sleeping/waiting -> ready when run_at passes) and the claim's "next due
-- time" probe walk this index; it holds no ready or running rows, so it never slows a claim.
CREATE INDEX jobs_due_idx ON {schema}.jobs (queue, run_at)
    WHERE state IN ('scheduled', 'sleeping', 'waiting');

-- The claim no longer asks "does this key have a running job" of the jobs table (that read the
-- statement's snapshot: two claims could both see a key free): the key lock below is the authority.
DROP INDEX {schema}.jobs_partition_running_idx;

-- One row per held partition key: the job that holds it (running, sleeping, waiting, or ready
-- after waking from a suspension). The claim takes a key by inserting here with ON CONFLICT DO
-- NOTHING, which waits for a concurrent claimer of the same key and then skips the key, so two
-- jobs of one key never run at once whatever the snapshots saw.
CREATE TABLE {schema}.partition_locks (
    queue         text   NOT NULL,
    partition_key text   NOT NULL,
    job_id        bigint NOT NULL REFERENCES {schema}.jobs (id) ON DELETE CASCADE,
    PRIMARY KEY (queue, partition_key)
);
CREATE INDEX partition_locks_job_idx ON {schema}.partition_locks (job_id);
INSERT INTO {schema}.partition_locks (queue, partition_key, job_id)
SELECT DISTINCT ON (queue, partition_key) queue, partition_key, id
FROM {schema}.jobs WHERE state = 'running' AND partition_key IS NOT NULL
ORDER BY queue, partition_key, id;

-- A workflow's history: one row per primitive it completed, in execution order. `kind` is free
-- text (step, sleep, and the kinds of events and children); `value` is the stored result.
CREATE TABLE {schema}.checkpoints (
    job_id     bigint      NOT NULL REFERENCES {schema}.jobs (id) ON DELETE CASCADE,
    position   integer     NOT NULL CHECK (position >= 0),
    kind       text        NOT NULL,
    name       text        NOT NULL,
    value      jsonb,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (job_id, position)
);

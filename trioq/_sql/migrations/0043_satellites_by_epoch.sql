-- trioq schema, version 43: checkpoints, attempts and workflow values partitioned by their
-- job's id, in epochs that retention empties or drops whole (docs/concepts.md, "Storage";
-- functions/satellite_epochs_rotate.sql).
--
-- Why: a day of finished jobs was dropped whole, but their checkpoints, attempts and values
-- were DELETEd row by row first: 500,000 jobs of 3 checkpoints each took 1.87 s to prune and
-- left 1,551,647 dead tuples and a 181 MB schema (bench/RESULTS.md, "Satellites by epoch").
--
-- Each old table becomes its table's partition for the ids below 2^40 (epoch 0), in place, its
-- indexes with it: no row moves, and the CHECK migration 0042 validated spares the attach its
-- scan. Epoch 1 (the next 2^32 ids) is made now; the leader's first rotation on a later UTC day
-- starts it (the id sequence jumps to 2^40). Old workers keep working: their statements name
-- the same tables, constraints and sequences.
CREATE TABLE {schema}.satellite_epochs (
    epoch      integer PRIMARY KEY CHECK (epoch >= 0),
    low        bigint,                     -- NULL: from the lowest id (epoch 0)
    high       bigint NOT NULL,
    started_at timestamptz,                -- NULL: made ahead, not started yet
    ended_at   timestamptz
);
INSERT INTO {schema}.satellite_epochs (epoch, low, high, started_at)
VALUES (0, NULL, 1099511627776, {schema}.db_now()),
       (1, 1099511627776, 1099511627776 + 4294967296, NULL);

ALTER TABLE {schema}.checkpoints RENAME TO checkpoints_e0;
ALTER TABLE {schema}.checkpoints_e0 RENAME CONSTRAINT checkpoints_pkey TO checkpoints_e0_pkey;
CREATE TABLE {schema}.checkpoints
    (LIKE {schema}.checkpoints_e0 INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (job_id);
ALTER TABLE {schema}.checkpoints DROP CONSTRAINT checkpoints_e0_bound;
ALTER TABLE {schema}.checkpoints ATTACH PARTITION {schema}.checkpoints_e0
    FOR VALUES FROM (MINVALUE) TO (1099511627776);
ALTER TABLE {schema}.checkpoints ADD CONSTRAINT checkpoints_pkey PRIMARY KEY (job_id, position);
CREATE TABLE {schema}.checkpoints_e1 PARTITION OF {schema}.checkpoints
    FOR VALUES FROM (1099511627776) TO (1103806595072)
    WITH (vacuum_truncate = off, toast.vacuum_truncate = off);

ALTER TABLE {schema}.workflow_values RENAME TO workflow_values_e0;
ALTER TABLE {schema}.workflow_values_e0
    RENAME CONSTRAINT workflow_values_pkey TO workflow_values_e0_pkey;
CREATE TABLE {schema}.workflow_values
    (LIKE {schema}.workflow_values_e0 INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (job_id);
ALTER TABLE {schema}.workflow_values DROP CONSTRAINT workflow_values_e0_bound;
ALTER TABLE {schema}.workflow_values ATTACH PARTITION {schema}.workflow_values_e0
    FOR VALUES FROM (MINVALUE) TO (1099511627776);
ALTER TABLE {schema}.workflow_values ADD CONSTRAINT workflow_values_pkey PRIMARY KEY (job_id, key);
CREATE TABLE {schema}.workflow_values_e1 PARTITION OF {schema}.workflow_values
    FOR VALUES FROM (1099511627776) TO (1103806595072)
    WITH (vacuum_truncate = off, toast.vacuum_truncate = off);

-- attempts: its identity moves to the parent (a row inserted through the parent takes the
-- parent's), the same sequence name and the next value the old one would have given.
CREATE TEMPORARY TABLE attempts_next_id ON COMMIT DROP AS
    SELECT coalesce(pg_sequence_last_value('{schema}.attempts_id_seq'), 0) + 1 AS next_id;
ALTER TABLE {schema}.attempts ALTER COLUMN id DROP IDENTITY;
ALTER TABLE {schema}.attempts DROP CONSTRAINT attempts_pkey,
    ADD CONSTRAINT attempts_e0_pkey PRIMARY KEY USING INDEX attempts_e0_key;
ALTER TABLE {schema}.attempts RENAME TO attempts_e0;
ALTER INDEX {schema}.attempts_job_idx RENAME TO attempts_e0_job_idx;
CREATE TABLE {schema}.attempts
    (LIKE {schema}.attempts_e0 INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (job_id);
ALTER TABLE {schema}.attempts DROP CONSTRAINT attempts_e0_bound;
ALTER TABLE {schema}.attempts ATTACH PARTITION {schema}.attempts_e0
    FOR VALUES FROM (MINVALUE) TO (1099511627776);
ALTER TABLE {schema}.attempts ADD CONSTRAINT attempts_pkey PRIMARY KEY (job_id, id);
CREATE INDEX attempts_job_idx ON {schema}.attempts (job_id, attempt);
ALTER TABLE {schema}.attempts ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY
    (SEQUENCE NAME {schema}.attempts_id_seq);
SELECT setval('{schema}.attempts_id_seq', next_id, false) FROM attempts_next_id;
CREATE TABLE {schema}.attempts_e1 PARTITION OF {schema}.attempts
    FOR VALUES FROM (1099511627776) TO (1103806595072)
    WITH (vacuum_truncate = off, toast.vacuum_truncate = off);

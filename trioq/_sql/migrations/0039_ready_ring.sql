-- trioq schema, version 39: the claims find unkeyed ready jobs in a ring of four tables that
-- are truncated in turn, not in jobs_live's index (docs/concepts.md, "Storage").
--
-- Why: a claim takes the head of the ready index, and every job claimed since the oldest open
-- snapshot leaves its entry there (the claim's UPDATE, a DELETE or a move leave as many:
-- vacuum may remove none while a `pg_dump` or an analytics query holds its snapshot), so the
-- claim's cost grew with the time the horizon was pinned (120,000 pinned jobs: 0.41 -> 11.5 ms
-- a claim; a ring of truncated slots: 0.65 -> 0.84 ms; bench/RESULTS.md, "Storage layouts
-- under a pinned horizon"). A TRUNCATE leaves no dead tuple whatever snapshot is open.
--
-- ready_ring: an entry (slot, queue, task, version, priority, run_at, id) per job that became
-- ready with no key, filed by the ready_ring_filed triggers on jobs_live into slot
-- ready_slot(now()): each slot is written for 5 s, then drains, and the leader truncates it
-- once no entry in it is a ready job's (ready_sweep()). The claims (the unkeyed_scan
-- fragment) read every slot in claim order, take an entry only with its job's row, still
-- ready, locked with SKIP LOCKED, and delete the entries they took. jobs_live keeps its row
-- of record (and jobs_ready_task_idx, for the readers that count ready jobs).
--
-- Online: this migration needs no stop. A worker of the previous release claims from
-- jobs_live's index as before and leaves its jobs' entries behind; a worker of this release
-- steps over such an entry (its job is no longer ready), and it goes with its slot.
CREATE TABLE {schema}.ready_ring (
    slot     smallint NOT NULL,
    queue    text NOT NULL,
    task     text NOT NULL,
    version  integer NOT NULL,
    priority smallint NOT NULL,
    run_at   timestamptz NOT NULL,
    id       bigint NOT NULL
) PARTITION BY LIST (slot);
CREATE INDEX ready_ring_claim_idx ON {schema}.ready_ring (queue, task, priority, run_at, id);
-- Truncated, not vacuumed, in steady use; vacuum still tidies a slot that a lock kept.
CREATE TABLE {schema}.ready_ring_0 PARTITION OF {schema}.ready_ring FOR VALUES IN (0)
    WITH (vacuum_truncate = off);
CREATE TABLE {schema}.ready_ring_1 PARTITION OF {schema}.ready_ring FOR VALUES IN (1)
    WITH (vacuum_truncate = off);
CREATE TABLE {schema}.ready_ring_2 PARTITION OF {schema}.ready_ring FOR VALUES IN (2)
    WITH (vacuum_truncate = off);
CREATE TABLE {schema}.ready_ring_3 PARTITION OF {schema}.ready_ring FOR VALUES IN (3)
    WITH (vacuum_truncate = off);

-- The jobs already ready (a job inserted meanwhile is filed by the triggers below: the
-- trigger and this copy are in one transaction, under the CREATE TRIGGER's lock).
CREATE TRIGGER ready_ring_filed_insert AFTER INSERT ON {schema}.jobs_live
    FOR EACH ROW WHEN (new.state = 'ready' AND new.partition_key IS NULL
                       AND new.concurrency_key IS NULL)
    EXECUTE FUNCTION {schema}.ready_ring_file();
CREATE TRIGGER ready_ring_filed_update AFTER UPDATE OF state ON {schema}.jobs_live
    FOR EACH ROW WHEN (new.state = 'ready' AND old.state <> 'ready'
                       AND new.partition_key IS NULL AND new.concurrency_key IS NULL)
    EXECUTE FUNCTION {schema}.ready_ring_file();
INSERT INTO {schema}.ready_ring (slot, queue, task, version, priority, run_at, id)
SELECT {schema}.ready_slot(now()), queue, task, version, priority, run_at, id
FROM {schema}.jobs_live
WHERE state = 'ready' AND partition_key IS NULL AND concurrency_key IS NULL;

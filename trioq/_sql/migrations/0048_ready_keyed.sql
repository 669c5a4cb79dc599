-- trioq schema, version 48: the ready jobs with a partition key or a concurrency key are filed
-- in a narrow table of their own, ready_keyed; the keyed claims, the probes, the pages and
-- `trioq explain` read it instead of jobs_live's two keyed partial indexes, which are dropped
-- (bench/plans/write_once_layout.md, stage 3; docs/concepts.md, "Storage").
--
-- Why: the job records are to be written once and partitioned by id epoch (stage 6). A partial
-- index on every epoch cannot serve a claim (a loose index scan over N partitions is a
-- MergeAppend of N probes per key), and a record the fast path leaves `ready` would stay in a
-- `phase = 'ready'` index. One unpartitioned table of the keyed ready rows serves the key scans
-- with one probe per key whatever the layout of the records. Unlike the ring it is never
-- truncated: a key's backlog can live for days.
--
-- ready_keyed: one row (an entry) per jobs_live row that is ready with a key, holding only what
-- the readers choose and filter entries by, so a key scan reads no job row until it locks one:
--  * queue, kind ('p' partition key, 'c' concurrency key: a job has at most one,
--    jobs_one_kind_of_key), key, priority, run_at, id: the primary key, in claim order, the
--    key scans' index (one probe per key visited, the head the first entry of its range);
--  * filed: the row's `filed` when it was filed (migration 0047); the claim locks the row and
--    rechecks `phase = 'ready' AND filed = entry.filed`, so an entry read from an old snapshot
--    never claims a job that has left ready since, even one that came back;
--  * task, version: the heads are filtered by the worker's handlers before any row is locked
--    (as the keyed partial indexes' heap rows were);
--  * concurrency_limit: a concurrency key's limit is its head's (`concurrency_limit_of`,
--    trioq/_core/concurrency.py `claim_limit`), read from the head entry; NULL for 'p'.
-- Not kept: attempt (the recheck is `filed`), payload and the rest (read from the locked row).
--
-- Writers: the triggers below (functions/ready_keyed_file.sql) file a row entering ready with a
-- key (enqueue, spawn, promotion, settle into ready, release, recovery, redrive, wake-ups,
-- continue-as-new, cancel of a suspended job) and delete its entry when it leaves ready in
-- place or leaves jobs_live (cancel, deadline, purge); the keyed claim deletes the entries it
-- takes itself, in its statement (a keyed claim writes `claimed` in place, which the update
-- trigger's WHEN steps over). Only keyed rows call the function: an unkeyed row fails the
-- first comparison of each WHEN.
--
-- Released with 0047, which stops the workers first: this transaction creates the triggers
-- (their SHARE ROW EXCLUSIVE lock on jobs_live keeps writers out until it commits) and fills
-- the table from the ready keyed rows in one statement.
CREATE TABLE {schema}.ready_keyed (
    queue             text        NOT NULL,
    kind              "char"      NOT NULL CHECK (kind IN ('p', 'c')),
    key               text        NOT NULL,
    priority          smallint    NOT NULL,
    run_at            timestamptz NOT NULL,
    id                bigint      NOT NULL,
    filed             integer     NOT NULL,
    task              text        NOT NULL,
    version           integer     NOT NULL,
    concurrency_limit integer,
    PRIMARY KEY (queue, kind, key, priority, run_at, id)
)
-- An entry per keyed ready job, deleted by its claim: vacuumed as early as job_due, and never
-- truncated (its ACCESS EXCLUSIVE lock would stall the claims: migration 0024).
WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
      autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02,
      autovacuum_vacuum_cost_delay = 1, vacuum_truncate = off);

-- The triggers write ready_keyed with the privileges of whoever writes the job rows (a
-- producer's enqueue of a keyed job files it, its cancel deletes it): its grants follow
-- job_rows_legacy's, as job_due's followed jobs's (migration 0044).
DO $$
DECLARE
    grant_row record;
BEGIN
    FOR grant_row IN
        SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                             ELSE quote_ident(pg_get_userbyid(a.grantee)) END AS grantee,
               a.privilege_type <> 'SELECT' AS writes
        FROM pg_class c, aclexplode(c.relacl) a
        WHERE c.oid = '{schema}.job_rows_legacy'::regclass AND a.grantee <> c.relowner
          AND a.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE')
    LOOP
        EXECUTE format('GRANT %s ON {schema}.ready_keyed TO %s',
                       CASE WHEN grant_row.writes THEN 'SELECT, INSERT, UPDATE, DELETE'
                            ELSE 'SELECT' END,
                       grant_row.grantee);
    END LOOP;
END
$$;

CREATE TRIGGER ready_keyed_filed_insert AFTER INSERT ON {schema}.jobs_live
    FOR EACH ROW WHEN ((new.partition_key IS NOT NULL OR new.concurrency_key IS NOT NULL)
                       AND new.phase = 'ready')
    EXECUTE FUNCTION {schema}.ready_keyed_file();
-- A keyed row entering ready, leaving it, or filed again while ready; a keyed claim (ready ->
-- claimed) deletes its entries in its own statement and calls nothing here.
CREATE TRIGGER ready_keyed_filed_update
    AFTER UPDATE OF phase, run_at, filed, priority ON {schema}.jobs_live
    FOR EACH ROW WHEN ((new.partition_key IS NOT NULL OR new.concurrency_key IS NOT NULL)
                       AND (new.phase = 'ready' OR old.phase = 'ready')
                       AND (new.phase <> 'claimed' OR old.phase <> 'ready')
                       AND (new.phase <> old.phase OR new.filed <> old.filed
                            OR new.run_at IS DISTINCT FROM old.run_at
                            OR new.priority <> old.priority))
    EXECUTE FUNCTION {schema}.ready_keyed_file();
-- A ready keyed row leaving jobs_live (a cancel or a deadline moves it to its day: PostgreSQL
-- fires AFTER DELETE on the partition it leaves, not AFTER UPDATE; a purge).
CREATE TRIGGER ready_keyed_left AFTER DELETE ON {schema}.jobs_live
    FOR EACH ROW WHEN ((old.partition_key IS NOT NULL OR old.concurrency_key IS NOT NULL)
                       AND old.phase = 'ready')
    EXECUTE FUNCTION {schema}.ready_keyed_file();

INSERT INTO {schema}.ready_keyed (queue, kind, key, priority, run_at, id, filed, task, version,
                                  concurrency_limit)
SELECT j.queue, CASE WHEN j.partition_key IS NOT NULL THEN 'p' ELSE 'c' END::"char",
       coalesce(j.partition_key, j.concurrency_key), j.priority, j.run_at, j.id, j.filed,
       j.task, j.version, j.concurrency_limit
FROM {schema}.jobs_live j
WHERE j.phase = 'ready' AND (j.partition_key IS NOT NULL OR j.concurrency_key IS NOT NULL)
ON CONFLICT DO NOTHING;

DROP INDEX {schema}.jobs_partition_ready_idx;
DROP INDEX {schema}.jobs_concurrency_ready_idx;

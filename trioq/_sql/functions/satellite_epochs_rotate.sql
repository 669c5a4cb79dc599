-- Retention of finished jobs, and of everything that belongs to a job, by the job's id (migrations
-- 0043 and 0049; docs/concepts.md, "Storage"): the only rotation. The records (job_rows), their
-- outcomes (job_outcomes), checkpoints, attempts and workflow values are RANGE-partitioned on
-- the job id into epochs of 2^32 ids (<table>_e<n>; satellite_epochs lists them), and a new
-- epoch starts each UTC day: the job id sequence jumps to the epoch's first id, so a day's new
-- jobs, and everything they write, are in that day's partitions. No record or outcome ever
-- moves: an epoch is emptied or dropped whole, never a DELETE per job (a DELETE of 500,000 jobs
-- of 3 checkpoints left 1,551,647 dead tuples and took 1.87 s; bench/RESULTS.md, "Satellites
-- by epoch"). For each ended epoch that began before the cutoff's UTC day (a later one holds no
-- job that can have expired: left unread and unlocked, below), with a `retention`:
--   * a job is expired once its finish day ended more than `retention` ago (the rule of
--     trioq/_core/retention.py, which the memory driver applies: gone at the first rotation
--     after that); the others, and every job without an outcome (a workflow sleeping for
--     weeks, a job delayed a month), survive;
--   * no survivor: its partitions holding rows are emptied by TRUNCATE (each partition's lock
--     only), and all five dropped at a later rotation once empty and a day after the epoch
--     ended, never in the pass that truncates (below: the DROP's lock undid it) (a transaction
--     that took an id before the jump, a day ago, has ended by then, so nothing can still be
--     filed into a dropped range; a DROP takes the parent's ACCESS EXCLUSIVE lock, which the
--     claims queue behind: refused under load within 50 ms, it left `trioq purge` to delete
--     1,000,000 jobs row by row, 44 s, bench.retention);
--   * survivors, at most 10,000 and at most half of its records: what belongs to its expired
--     jobs outside the epoch's partitions (dedup keys, messages, partition locks: TRUNCATE
--     fires no trigger) is deleted, then, under the partitions' ACCESS EXCLUSIVE locks, the
--     survivors' rows are copied aside, the partitions truncated and the rows written back
--     (~1 us a row), the records' with their triggers disabled (a survivor is filed in the
--     ring, ready_keyed or job_due already: written back, it must not be filed twice);
--   * more survivors than that (the copy would cost more than it saves): the expired jobs are
--     deleted row by row instead, at most 10,000 a call, their outcome and record together (an
--     outcome gone first would bring its job back as `ready`; the delete triggers take the rest),
--     so the per-job rule holds whatever the epoch keeps. Those deletes leave dead tuples: the
--     price of an epoch mostly kept (1,000,000 jobs delayed a month, enqueued on one day).
-- Its survivors are read with its outcomes locked in SHARE mode (no outcome of it written or
-- deleted until the truncation has committed) and the writers of its records waited out; the
-- claims, completions and settles go on meanwhile. ACCESS EXCLUSIVE is taken for the copies
-- of the survivors, the truncations and the write-back alone (below).
-- The ids are not the history: they never repeat and only grow; 2^32 ids a day is the most an
-- epoch holds before it runs into the next (more goes on working, filed one epoch early).
-- Called by the leader after its maintenance pass when the last call's `next_due` has come, by
-- `trioq purge` (with its cutoff) and by `trioq migrate` (NULL: epochs and partitions only; the
-- leader and `trioq purge` make that call first, in a transaction of its own, so that the
-- locks a partition's attach and a partition's ANALYZE take are not held through a prune).
-- Every lock waits at most 50 ms, the records' and the truncations' asked for five times (a
-- `pg_dump` holding a partition leaves that epoch to a later call, due in a minute). SECURITY DEFINER: creating, truncating and dropping partitions needs
-- the schema owner's rights, and a worker's role has none (docs/operations.md, "Roles"); every
-- name it builds is a table's name and an epoch number.
-- Returns the jobs removed and when to call again: the next UTC day (a new epoch), the next
-- moment a finish day expires, or a minute from now if something was left.
CREATE OR REPLACE FUNCTION {schema}.satellite_epochs_rotate(retention interval)
RETURNS TABLE (pruned bigint, next_due timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '50ms'
-- One core: the survivors' read ran as a parallel hash anti-join (two workers, spilling to
-- disk) that took both cores from the claims it no longer locks out (pickup p50 during the
-- prune 246-1430 ms against 16-172 clean; bench/RESULTS.md, "Retention's read before its
-- lock").
SET max_parallel_workers_per_gather = 0 AS $$
DECLARE
    now_at     timestamptz := {schema}.db_now();
    day_start  timestamptz := to_timestamp(floor(extract(epoch FROM now_at) / 86400) * 86400);
    cutoff     timestamptz := now_at - retention;
    due        timestamptz := day_start + interval '1 day';
    width      constant bigint := 4294967296;
    -- In the order their partitions are truncated: the claims' two last (below: the window
    -- they queue behind).
    tables     constant text[] := ARRAY['job_outcomes', 'attempts', 'workflow_values',
                                        'checkpoints', 'job_rows'];
    removed    bigint := 0;
    this_epoch record;
    next_epoch record;
    epoch_row  record;
    tab        text;
    part       text;
    parts      text[];
    survivors  bigint[];
    found      bigint[];
    unfinished bigint;
    kept       bigint;
    total      bigint;
    gone       bigint;
    low_id     bigint;
    filled     boolean;
    stale      boolean;
    unexpired  boolean;
    grown      boolean;
    expired_before timestamptz;
    attempt    int;
    filled_parts text[];
BEGIN
    IF retention IS NOT NULL THEN
        -- Finish days expire at a UTC midnight plus `retention`: the next such moment.
        due := least(due, to_timestamp(floor(extract(epoch FROM cutoff) / 86400) * 86400)
                          + interval '1 day' + retention);
    END IF;
    SELECT e.* INTO this_epoch FROM {schema}.satellite_epochs e
    WHERE e.started_at IS NOT NULL ORDER BY e.epoch DESC LIMIT 1;
    SELECT e.* INTO next_epoch FROM {schema}.satellite_epochs e WHERE e.epoch = this_epoch.epoch + 1;
    -- A new epoch, into partitions an earlier call made: setval() is not undone by a rollback,
    -- so the ids never run ahead of partitions this transaction could still take back.
    IF next_epoch.epoch IS NOT NULL AND this_epoch.started_at < day_start THEN
        UPDATE {schema}.satellite_epochs SET ended_at = now_at WHERE epoch = this_epoch.epoch;
        UPDATE {schema}.satellite_epochs SET started_at = now_at WHERE epoch = next_epoch.epoch;
        IF coalesce(pg_sequence_last_value('{schema}.jobs_id_seq'), 0) < next_epoch.low THEN
            PERFORM setval('{schema}.jobs_id_seq', next_epoch.low, false);
        END IF;
        this_epoch := next_epoch;
        this_epoch.started_at := now_at;
    END IF;
    -- The next epoch's partitions, made a call ahead (attached: no lock a claim waits for).
    IF NOT EXISTS (SELECT 1 FROM {schema}.satellite_epochs e WHERE e.epoch = this_epoch.epoch + 1)
    THEN
        BEGIN
            INSERT INTO {schema}.satellite_epochs (epoch, low, high)
            VALUES (this_epoch.epoch + 1, this_epoch.high, this_epoch.high + width);
            FOREACH tab IN ARRAY tables LOOP
                PERFORM {schema}.satellite_partition_add(
                    tab, tab || '_e' || (this_epoch.epoch + 1), this_epoch.high,
                    this_epoch.high + width);
            END LOOP;
        EXCEPTION WHEN lock_not_available THEN
            due := least(due, now_at + interval '1 minute');
        END;
    END IF;
    -- The current epoch's partitions were made a day ahead and stayed empty until its jump: a
    -- VACUUM or ANALYZE of the whole database meanwhile (a nightly `vacuumdb --analyze`,
    -- pg_upgrade's advice) recorded them as empty (reltuples 0; never analyzed, it is -1 and
    -- the planner takes a partition of under ten pages for ten), and a generic plan made while
    -- one holds a few pages reads a record by a sequential scan of it as it grows (4.0 ms a
    -- claim of 25 against 0.7, bench/RESULTS.md, "The prune's phase measured its own burst")
    -- until autovacuum analyzes it, a minute or more into the day. Such a partition is
    -- analyzed here once it holds ten pages (SHARE UPDATE EXCLUSIVE on it alone, which no
    -- claim, enqueue or completion waits for; the plans on its parent are made again). Until
    -- the records' partition is, the next call is due in 10 s, through the epoch's first hour
    -- (the records only: every claimed candidate's is read; a partition written rarely, the
    -- values' or the attempts', would keep the leader's rotation, the prune included, due
    -- every 10 s for the hour). It was made again at the jump instead: its DROP took the
    -- parent's ACCESS EXCLUSIVE lock, which every claim queued behind (after a nightly
    -- ANALYZE, the midnight prune's pickup p95 6.02x clean against 2.98x analyzed here;
    -- bench/RESULTS.md, "The day's partitions analyzed while empty"). A lock not granted (a
    -- size read waits behind an ACCESS EXCLUSIVE request): a minute later, the jump kept.
    FOREACH tab IN ARRAY tables LOOP
        part := tab || '_e' || this_epoch.epoch;
        BEGIN
            SELECT c.reltuples = 0 AND c.relpages = 0,
                   pg_relation_size(c.oid) >= 10 * current_setting('block_size')::bigint
            INTO stale, grown
            FROM pg_class c WHERE c.oid = to_regclass(format('{schema}.%I', part));
            IF stale AND grown THEN
                EXECUTE format('ANALYZE {schema}.%I', part);
            ELSIF stale AND tab = 'job_rows'
                  AND this_epoch.started_at > now_at - interval '1 hour' THEN
                due := least(due, now_at + interval '10 seconds');
            END IF;
        EXCEPTION WHEN lock_not_available THEN
            due := least(due, now_at + interval '1 minute');
        END;
    END LOOP;
    IF retention IS NULL THEN
        RETURN QUERY SELECT removed, due;
        RETURN;
    END IF;
    -- The rule (finish day ended by the cutoff) as a bound on `finished_at`, which its index
    -- serves: a job finished before the cutoff's UTC day began is expired.
    expired_before := to_timestamp(floor(extract(epoch FROM cutoff) / 86400) * 86400);
    FOR epoch_row IN
        SELECT e.* FROM {schema}.satellite_epochs e WHERE e.ended_at IS NOT NULL ORDER BY e.epoch
    LOOP
        BEGIN
            gone := 0;
            low_id := coalesce(epoch_row.low, -9223372036854775808);
            -- The epoch's partitions still there (a DROP a day after it was emptied).
            SELECT coalesce(array_agg(t || '_e' || epoch_row.epoch ORDER BY o), '{}') INTO parts
            FROM unnest(tables) WITH ORDINALITY AS u(t, o)
            WHERE to_regclass(format('{schema}.%I', t || '_e' || epoch_row.epoch)) IS NOT NULL;
            IF cardinality(parts) = 0 THEN
                DELETE FROM {schema}.satellite_epochs WHERE epoch = epoch_row.epoch;
                CONTINUE;
            END IF;
            -- Nothing of it can be expired yet: every id of an epoch after the first was taken
            -- after the jump that started it (setval, in the call that set `started_at`), so
            -- each of its jobs finished after `started_at`. Left unread and unlocked: read, an
            -- epoch of 1,000,000 jobs none of which had expired took 232 ms of every call (1.9
            -- left alone), its outcomes held in SHARE mode to the commit, which every
            -- completion of its jobs waited for (at a midnight, the epoch just ended: its last
            -- running jobs, its backlog), and so for each epoch within a retention of days
            -- (bench/RESULTS.md, "The rotation's epochs that cannot expire yet"). A job kept
            -- too long is the worst this can do, by a day: ids run into the next epoch's range
            -- only past 2^32 a day, and a job finished in a transaction that began before the
            -- jump (`finished_at` is its start) and took its id after it. Once no partition of
            -- it holds a row and a day has passed since it ended, it goes on below and is
            -- dropped, as an empty epoch always was.
            unexpired := epoch_row.low IS NOT NULL AND epoch_row.started_at >= expired_before;
            CONTINUE WHEN unexpired AND epoch_row.ended_at >= now_at - interval '1 day';
            -- The partitions holding rows, the only ones truncated. The empty ones are dropped
            -- once all five are, a day after the epoch ended, at a later call (below). Read
            -- before the survivors: a partition empty here can gain only a survivor's rows
            -- (an id taken before the jump, a checkpoint of a job kept), which no truncation
            -- must take, and none once a day has passed since the epoch ended.
            filled_parts := '{}';
            FOREACH part IN ARRAY parts LOOP
                EXECUTE format('SELECT EXISTS (SELECT FROM {schema}.%I)', part) INTO filled;
                IF filled THEN
                    filled_parts := filled_parts || part;
                END IF;
            END LOOP;
            CONTINUE WHEN unexpired AND cardinality(filled_parts) > 0;
            survivors := NULL;
            total := 0;
            IF ('job_rows_e' || epoch_row.epoch) = ANY(parts) THEN
                -- Who survives is read before the truncations' ACCESS EXCLUSIVE locks, which
                -- every claim queues behind (its generic plan locks every partition of
                -- job_rows): read under them, the prune of 1,000,000 jobs held the workers'
                -- pickup for its 1.13 s (p95 1197 ms against 777 clean; bench/RESULTS.md,
                -- "Retention's read before its lock"). What the read must not miss:
                --   * a record inserted into the epoch by a transaction that took its id
                --     before the jump: waited out here, by a SHARE lock on the records
                --     taken and given back (a subtransaction rolled back); a new id is never
                --     in an ended epoch;
                --   * an expired job made a survivor again (a redrive deletes its outcome):
                --     the outcomes are locked in SHARE mode until the commit. Holding the
                --     records in SHARE mode instead deadlocked with the full claim and the
                --     settle (a row lock on a partition, then RowExclusive on it: 2 prunes
                --     of 4 under load failed with 40P01 at the lock's upgrade);
                --   * a survivor written meanwhile (a settle, a wake-up, a checkpoint): its
                --     rows are copied aside only under ACCESS EXCLUSIVE (by primary key,
                --     at most 10,000).
                -- A job that survives may finish or be deleted meanwhile; it is still kept,
                -- or not copied. An expired job stops being expired only by its outcome (a
                -- write to its record, a result watch's flag, goes with the truncation).
                -- (A settle in flight holds the records too: asked for up to five times.)
                FOR attempt IN 1 .. 5 LOOP
                    BEGIN
                        EXECUTE format('LOCK TABLE {schema}.%I IN SHARE MODE',
                                       'job_rows_e' || epoch_row.epoch);
                        RAISE SQLSTATE 'TQ001';
                    EXCEPTION
                        WHEN SQLSTATE 'TQ001' THEN
                            EXIT;  -- the lock given back: no writer of a late id is left
                        WHEN lock_not_available THEN
                            IF attempt = 5 THEN
                                RAISE;
                            END IF;
                    END;
                END LOOP;
                EXECUTE format('LOCK TABLE {schema}.%I IN SHARE MODE',
                               'job_outcomes_e' || epoch_row.epoch);
                -- The survivors, in two exact parts (a job has at most one outcome, its
                -- primary key): those whose outcome is not expired (`finished_at`'s index: an
                -- outcome is expired when its finish day ended by the cutoff, that is when it
                -- finished before the cutoff's day began), and the records with no outcome,
                -- the unfinished jobs. The anti-join with the rule written on each outcome
                -- (floor and extract per row, no index) took 2.21 s for 1,000,000 finished
                -- jobs.
                EXECUTE format('SELECT coalesce(array_agg(o.job_id), ''{}'') FROM {schema}.%I o '
                               'WHERE o.finished_at >= $1 LIMIT 10001',
                               'job_outcomes_e' || epoch_row.epoch)
                    INTO survivors USING expired_before;
                -- The unfinished jobs where the claims and the leader find them by id
                -- (ready_keyed, job_due, job_runs: what the epoch still holds, not the epoch),
                -- trusted only when there are as many as the two partitions' counts say. No
                -- statement deletes a record and keeps its outcome (a purge and this rotation
                -- delete both, a discarding completion a record that has none), so the
                -- records are the outcomes plus the records without one; each job found is
                -- one of those (a record, no outcome), and as many as that is all of them.
                -- One statement, one snapshot: the counts and the tables agree (a claim moves
                -- a job from one to another in one statement). OFFSET 0: pulled up, the
                -- subquery counted again at each use (five scans of 1,000,000 rows). The two
                -- counts took 123-150 ms for 1,000,000 finished jobs against 305 for the
                -- anti-join of the two primary keys and the count (bench/RESULTS.md, "The
                -- prune's read through the claims' tables"). Not the ring: a relation read
                -- here stays locked until the commit, and the leader's sweep truncates the
                -- ring's drained slots with a 10 ms lock timeout the claims queue behind;
                -- a plain job still ready a day after its epoch ended (a paused queue, a
                -- backlog a day deep) is read by the anti-join instead, as is any job the
                -- tables miss, more than 10,000 unfinished, or fewer records than outcomes.
                EXECUTE format(
                    'SELECT c.total, c.total - c.finished, CASE WHEN c.total > c.finished '
                    'AND c.total - c.finished <= 10000 THEN (SELECT coalesce(array_agg('
                    'DISTINCT n.id), ''{}'') FROM (SELECT k.id '
                    'FROM {schema}.ready_keyed k WHERE k.id >= $1 AND k.id < $2 '
                    'UNION ALL SELECT d.job_id FROM {schema}.job_due d '
                    'WHERE d.job_id >= $1 AND d.job_id < $2 UNION ALL SELECT u.job_id '
                    'FROM {schema}.job_runs u WHERE u.job_id >= $1 AND u.job_id < $2) AS n '
                    'WHERE EXISTS (SELECT FROM {schema}.%1$I j WHERE j.id = n.id) '
                    'AND NOT EXISTS (SELECT FROM {schema}.%2$I o WHERE o.job_id = n.id)) END '
                    'FROM (SELECT (SELECT count(*) FROM {schema}.%1$I) AS total, '
                    '(SELECT count(*) FROM {schema}.%2$I) AS finished OFFSET 0) AS c',
                    'job_rows_e' || epoch_row.epoch, 'job_outcomes_e' || epoch_row.epoch)
                    INTO total, unfinished, found USING low_id, epoch_row.high;
                IF unfinished <> 0 AND cardinality(found) IS DISTINCT FROM unfinished THEN
                    RAISE DEBUG 'satellite_epochs_rotate: epoch %: % unfinished, % found by '
                                'the claims'' tables: read by the anti-join', epoch_row.epoch,
                                unfinished, cardinality(found);
                    EXECUTE format(
                        'SELECT coalesce(array_agg(r.id), ''{}'') FROM (SELECT r.id '
                        'FROM {schema}.%I r WHERE NOT EXISTS (SELECT FROM {schema}.%I o '
                        'WHERE o.job_id = r.id) LIMIT 10001) AS r',
                        'job_rows_e' || epoch_row.epoch, 'job_outcomes_e' || epoch_row.epoch)
                        INTO found;
                ELSIF unfinished > 0 THEN
                    RAISE DEBUG 'satellite_epochs_rotate: epoch %: % unfinished, found by the '
                                'claims'' tables', epoch_row.epoch, unfinished;
                END IF;
                survivors := survivors || coalesce(found, '{}');
            END IF;
            kept := coalesce(cardinality(survivors), 0);
            IF kept > 10000 OR (kept > 0 AND total <= 2 * kept) THEN
                -- Too many kept to copy: the expired jobs row by row (see above).
                EXECUTE format(
                    'WITH doomed AS MATERIALIZED (SELECT o.job_id AS id FROM {schema}.%I o '
                    'WHERE o.finished_at < $1 LIMIT 10000), '
                    'outcomes AS (DELETE FROM {schema}.%I o USING doomed d '
                    'WHERE o.job_id = d.id), '
                    'records AS (DELETE FROM {schema}.job_rows r USING doomed d '
                    'WHERE r.id = d.id RETURNING 1) '
                    'SELECT count(*) FROM records',
                    'job_outcomes_e' || epoch_row.epoch, 'job_outcomes_e' || epoch_row.epoch)
                    INTO gone USING expired_before;
                -- Counted once done (a PL/pgSQL variable is not rolled back with the block).
                removed := removed + gone;
                IF gone = 10000 THEN
                    due := least(due, now_at + interval '1 minute');
                END IF;
                CONTINUE;
            END IF;
            IF kept = 0 THEN
                survivors := NULL;  -- none: truncated, or dropped once empty (below)
            END IF;
            gone := total - kept;
            -- What belongs to the expired jobs outside these partitions (job_keys read by its
            -- holders' ids: it holds only keyed jobs, a scan of the epoch's records reads all).
            DELETE FROM {schema}.job_keys k
            WHERE k.job_id >= low_id AND k.job_id < epoch_row.high
              AND k.job_id <> ALL(coalesce(survivors, '{}'));
            DELETE FROM {schema}.messages m
            WHERE m.job_id >= low_id AND m.job_id < epoch_row.high
              AND m.job_id <> ALL(coalesce(survivors, '{}'));
            DELETE FROM {schema}.partition_locks l
            WHERE l.job_id >= low_id AND l.job_id < epoch_row.high
              AND l.job_id <> ALL(coalesce(survivors, '{}'));
            -- An empty epoch is dropped whole at a later call than the one that emptied it: a
            -- DROP takes its parent's ACCESS EXCLUSIVE lock, which a claim's plan holds a lock
            -- against (the full claim's names `checkpoints`). Dropped in the pass that
            -- truncated the records, the epoch's empty checkpoints partition was refused its
            -- parent's lock under load, or deadlocked with a claim, and undid the truncation:
            -- `trioq purge` then deleted the 1,000,000 jobs row by row (130 s;
            -- bench/RESULTS.md, "Retention's read before its lock").
            IF cardinality(filled_parts) = 0 THEN
                IF epoch_row.ended_at < now_at - interval '1 day' THEN
                    FOREACH part IN ARRAY parts LOOP
                        EXECUTE format('DROP TABLE {schema}.%I', part);
                    END LOOP;
                END IF;
                CONTINUE;
            END IF;
            -- Each partition holding rows, in the order of `tables`: locked (ACCESS EXCLUSIVE),
            -- its survivors copied aside (`trioq_epoch_kept`), truncated, and the copy
            -- written back. Only those: a temporary table made and dropped for each of the
            -- five is catalog work under these locks (a prune with 1,000 survivors took 1.18 s
            -- by median against 0.94 s with none). Each lock is taken as its partition's turn
            -- comes, so the claims, which read the records and the checkpoints (their generic
            -- plans lock every partition of both), queue behind those two only, after the
            -- outcomes, attempts and values are done: a truncation rebuilds each index empty
            -- with an fsync (the outcomes' 3.7 ms of the 10 for 1,000,000 finished jobs here;
            -- bench/RESULTS.md, "The prune's read through the claims' tables"). A claim in
            -- flight holds the partitions it locked until its commit, and a settle that
            -- locked the records may wait for a satellite's partition behind this request (a
            -- deadlock that the lock's 50 ms or the detector ends on this side): so the whole
            -- sequence is tried again, up to five times, each failure undoing what it did and
            -- releasing what it got (the outcomes' SHARE lock is kept), before the epoch is
            -- left to a later call.
            FOR attempt IN 1 .. 5 LOOP
                BEGIN
                    FOREACH part IN ARRAY filled_parts LOOP
                        EXECUTE format('LOCK TABLE {schema}.%I IN ACCESS EXCLUSIVE MODE', part);
                        IF survivors IS NOT NULL THEN
                            EXECUTE format('CREATE TEMPORARY TABLE trioq_epoch_kept ON COMMIT '
                                           'DROP AS SELECT * FROM {schema}.%I WHERE %I = ANY($1)',
                                           part, CASE WHEN part LIKE 'job\_rows\_e%' THEN 'id'
                                                      ELSE 'job_id' END)
                                USING survivors;
                        END IF;
                        EXECUTE format('TRUNCATE {schema}.%I', part);
                        CONTINUE WHEN survivors IS NULL;
                        IF part LIKE 'job\_rows\_e%' THEN
                            EXECUTE format('ALTER TABLE {schema}.%I DISABLE TRIGGER USER', part);
                        END IF;
                        EXECUTE format('INSERT INTO {schema}.%I SELECT * FROM trioq_epoch_kept',
                                       part);
                        IF part LIKE 'job\_rows\_e%' THEN
                            EXECUTE format('ALTER TABLE {schema}.%I ENABLE TRIGGER USER', part);
                        END IF;
                        DROP TABLE trioq_epoch_kept;
                    END LOOP;
                    EXIT;
                EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
                    IF attempt = 5 THEN
                        RAISE;
                    END IF;
                END;
            END LOOP;
            -- Counted once done (a PL/pgSQL variable is not rolled back with the block).
            removed := removed + coalesce(gone, 0);
        EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
            due := least(due, now_at + interval '1 minute');
        END;
    END LOOP;
    RETURN QUERY SELECT removed, due;
END
$$;

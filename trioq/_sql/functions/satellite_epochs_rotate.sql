-- What belongs to a job and can grow with it (checkpoints, attempts, workflow values) by the
-- job's id, so that retention removes it whole (migration 0043; docs/concepts.md, "Storage").
-- Each of the three tables is RANGE-partitioned on job_id into epochs of 2^32 ids
-- (<table>_e<n>; satellite_epochs lists them), and a new epoch starts each UTC day: the job id
-- sequence jumps to the epoch's first id, so a day's new jobs, and everything they write, are
-- in that day's partitions. A finished job's day is dropped whole by job_history_rotate(); its
-- satellite rows go with their epoch, never a DELETE each (which left 1,551,647 dead tuples and
-- took 1.87 s for 500,000 jobs of 3 checkpoints; bench/RESULTS.md, "Satellites by epoch"):
--   * an epoch ended, and with none of its jobs kept (no row of `jobs` in its id range, every
--     partition of `jobs` read by its id index): its partitions are emptied by TRUNCATE, and
--     dropped a day after the epoch ended (a transaction that took an id before the jump, a day
--     ago, has ended by then, so nothing can still be filed into a dropped range);
--   * some of its jobs kept (a job that ran across midnight, a workflow sleeping for weeks):
--     their rows are copied aside, the partition is truncated and they are written back, when
--     that keeps at most half of its rows and at most 50,000 of them (the copy is made under
--     the partition's ACCESS EXCLUSIVE lock: ~1 us a row); else the epoch waits for a later
--     call (its rows are storage, not dead tuples).
-- The lock on a partition is taken before the epoch's kept jobs are read: a job committed after
-- that read cannot write into the partition (every writer of these rows updates its job's row
-- first, and then waits for this lock) until the truncation has committed.
-- The ids are not the history: they never repeat and only grow; 2^32 ids a day is the most an
-- epoch holds before it runs into the next (more goes on working, filed one epoch early).
-- Called by job_history_rotate() when it has a retention, under its lock_timeout (50 ms): a lock
-- not granted (a `pg_dump` holding a partition) leaves that partition to a later call.
-- Returns false if something was left for a later call.
CREATE OR REPLACE FUNCTION {schema}.satellite_epochs_rotate()
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    now_at     timestamptz := {schema}.db_now();
    day_start  timestamptz := to_timestamp({schema}.job_lane(now_at)::float8 * 86400);
    width      constant bigint := 4294967296;
    satellites constant text[] := ARRAY['checkpoints', 'attempts', 'workflow_values'];
    this_epoch record;
    next_epoch record;
    epoch_row  record;
    satellite  text;
    part       text;
    parts      text[];
    survivors  bigint[];
    kept       bigint;
    total      bigint;
    complete   boolean := true;
BEGIN
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
    END IF;
    -- The next epoch's partitions, made a call ahead.
    IF NOT EXISTS (SELECT 1 FROM {schema}.satellite_epochs e WHERE e.epoch = this_epoch.epoch + 1)
    THEN
        BEGIN
            INSERT INTO {schema}.satellite_epochs (epoch, low, high)
            VALUES (this_epoch.epoch + 1, this_epoch.high, this_epoch.high + width);
            FOREACH satellite IN ARRAY satellites LOOP
                EXECUTE format('CREATE TABLE {schema}.%I PARTITION OF {schema}.%I '
                               'FOR VALUES FROM (%s) TO (%s) '
                               'WITH (vacuum_truncate = off, toast.vacuum_truncate = off)',
                               satellite || '_e' || (this_epoch.epoch + 1), satellite,
                               this_epoch.high, this_epoch.high + width);
            END LOOP;
        EXCEPTION WHEN lock_not_available THEN
            complete := false;
        END;
    END IF;
    FOR epoch_row IN
        SELECT e.* FROM {schema}.satellite_epochs e WHERE e.ended_at IS NOT NULL ORDER BY e.epoch
    LOOP
        BEGIN
            -- The epoch's partitions still there (a DROP a day after it was emptied).
            SELECT coalesce(array_agg(t || '_e' || epoch_row.epoch), '{}') INTO parts
            FROM unnest(satellites) AS t
            WHERE to_regclass(format('{schema}.%I', t || '_e' || epoch_row.epoch)) IS NOT NULL;
            FOREACH part IN ARRAY parts LOOP
                EXECUTE format('LOCK TABLE {schema}.%I IN ACCESS EXCLUSIVE MODE', part);
            END LOOP;
            IF cardinality(parts) = 0 THEN
                DELETE FROM {schema}.satellite_epochs WHERE epoch = epoch_row.epoch;
                CONTINUE;
            END IF;
            -- Read once the partitions are locked (above); more than 10,000 kept is too many
            -- to copy aside: a later call.
            SELECT array_agg(j.id) INTO survivors FROM (
                SELECT k.id FROM {schema}.job_rows_legacy k
                WHERE k.id >= coalesce(epoch_row.low, -9223372036854775808)
                  AND k.id < epoch_row.high
                LIMIT 10001) AS j;
            CONTINUE WHEN cardinality(survivors) > 10000;
            FOREACH part IN ARRAY parts LOOP
                IF survivors IS NULL AND epoch_row.ended_at < now_at - interval '1 day' THEN
                    EXECUTE format('DROP TABLE {schema}.%I', part);
                    CONTINUE;
                END IF;
                kept := 0;
                IF survivors IS NOT NULL THEN
                    EXECUTE format('SELECT count(*) FROM {schema}.%I WHERE job_id = ANY($1)', part)
                        INTO kept USING survivors;
                END IF;
                EXECUTE format('SELECT count(*) FROM (SELECT FROM {schema}.%I LIMIT $1) AS r',
                               part)
                    INTO total USING 2 * kept + 1;
                CONTINUE WHEN total <= 2 * kept OR kept > 50000;
                IF kept = 0 THEN
                    EXECUTE format('TRUNCATE {schema}.%I', part);
                ELSE
                    EXECUTE format('CREATE TEMPORARY TABLE trioq_satellites_kept ON COMMIT DROP '
                                   'AS SELECT * FROM {schema}.%I WHERE job_id = ANY($1)', part)
                        USING survivors;
                    EXECUTE format('TRUNCATE {schema}.%I', part);
                    EXECUTE format('INSERT INTO {schema}.%I SELECT * FROM trioq_satellites_kept',
                                   part);
                    DROP TABLE trioq_satellites_kept;
                END IF;
            END LOOP;
        EXCEPTION WHEN lock_not_available THEN
            complete := false;
        END;
    END LOOP;
    RETURN complete;
END
$$;

-- The day partitions of finished jobs (migration 0038): creates today's and the next three
-- days' (job_history_add(): so a completion always finds its day's partition, even if no
-- leader runs for three days), and with a `retention`, removes every day that ended more than
-- `retention` ago whole: what belongs to its jobs and is left over only now and then (messages
-- never received: a received one becomes a checkpoint; partition locks; held dedup keys) is
-- deleted, then the partition is detached; checkpoints, attempts and workflow values go whole
-- with their epoch (satellite_epochs_rotate(), called last). job_history_drop() drops it in a
-- transaction of its own, sent right after (the detach's lock on `jobs` lasts until this
-- transaction ends: 2 ms without the drop, 66-84 ms with it). No DELETE of a job row,
-- so no dead tuples and no vacuum debt: 1,000,000 finished jobs go in well under a second
-- (bench/RESULTS.md, "Finished jobs by day"). jobs_before (the jobs finished before migration
-- 0038) goes whole once its newest is older than `retention`; jobs_unfiled (finished on a day
-- with no partition: a database clock set far ahead) is pruned row by row.
-- Returns the jobs removed and when to call again (the next day to create ahead, or the next
-- day to expire, whichever comes first). The elected leader calls it after its maintenance
-- pass when that time has come; `trioq purge` too; `trioq migrate` with NULL.
-- SECURITY DEFINER: creating, attaching and dropping partitions needs the schema owner's
-- rights, and a worker's role has none (docs/operations.md, "Roles"). Its only inputs are an
-- interval and the database clock; every name it builds is `jobs_d` and a date.
-- Detaching takes ACCESS EXCLUSIVE on `jobs` for a moment, so every lock here waits at most
-- 50 ms (a `pg_dump` holding `jobs` postpones the detach to a later call instead of queueing
-- every claim behind it). It first drops what an earlier call detached and no
-- job_history_drop() followed (a process stopped between the two, or one of a release that
-- dropped in this transaction): no lock on `jobs` is held yet.
CREATE OR REPLACE FUNCTION {schema}.job_history_rotate(retention interval)
RETURNS TABLE (pruned bigint, next_due timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '50ms' AS $$
DECLARE
    now_at    timestamptz := {schema}.db_now();
    today     integer := {schema}.job_lane(now_at);
    cutoff    timestamptz := now_at - retention;
    due       timestamptz := to_timestamp((today + 1)::float8 * 86400);
    removed   bigint := 0;
    d         integer;
    part      record;
    held      bigint;
    counted   bigint;
    last_id   bigint;
    attempt   integer;
    before_end timestamptz;
BEGIN
    PERFORM {schema}.job_history_drop();
    FOR d IN today .. today + 3 LOOP
        BEGIN
            PERFORM {schema}.job_history_add(d);
        EXCEPTION
            -- Locked (a long reader of jobs_unfiled): try again in a minute. Rows of that day
            -- already in jobs_unfiled (a clock moved ahead): the day stays there.
            WHEN lock_not_available THEN
                due := least(due, now_at + interval '1 minute');
            WHEN check_violation THEN
                NULL;
        END;
    END LOOP;
    IF retention IS NULL THEN
        RETURN QUERY SELECT removed, due;
        RETURN;
    END IF;
    -- jobs_before's end is its newest job's finish: it goes whole once that is past.
    IF to_regclass('{schema}.jobs_before') IS NOT NULL THEN
        EXECUTE 'SELECT coalesce(max(finished_at), ''-infinity'') FROM {schema}.jobs_before'
            INTO before_end;
    END IF;
    FOR part IN
        SELECT p.relname, p.ends
        FROM (SELECT c.relname,
                     to_timestamp(((to_date(substr(c.relname, 7), 'YYYYMMDD')
                                    - date '1970-01-01') + 1)::float8 * 86400) AS ends
              FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
              WHERE i.inhparent = coalesce(to_regclass('{schema}.job_rows_legacy'),
                                           to_regclass('{schema}.jobs'))
                AND c.relname ~ '^jobs_d[0-9]{8}$'
              UNION ALL
              SELECT 'jobs_before', before_end WHERE before_end IS NOT NULL) AS p
        ORDER BY p.ends
    LOOP
        IF part.ends > cutoff THEN
            due := least(due, part.ends + retention);
            EXIT;
        END IF;
        BEGIN
            -- What belongs to its jobs first (no foreign key does it: migration 0038), then
            -- the partition detached (and dropped by job_history_drop()).
            -- Its jobs counted (what the call returns) in chunks of 50,000 in id order, 10 ms
            -- apart: one count(*) of a 1,000,000-job day is a parallel scan that held both
            -- cores for 50-80 ms, and the claims, the enqueues and the worker waited for CPU
            -- (pickup p95 during a purge 2.8-3.4x the clean phase's; bench/RESULTS.md, "The
            -- prune's window"). A chunk is an index-only scan of a few ms on one core.
            held := 0;
            last_id := 0;
            LOOP
                EXECUTE format('SELECT count(*), max(id) FROM (SELECT id FROM {schema}.%I '
                               'WHERE id > $1 ORDER BY id LIMIT 50000) AS chunk',
                               part.relname)
                    INTO counted, last_id USING last_id;
                held := held + counted;
                EXIT WHEN counted < 50000;
                PERFORM pg_sleep(0.01);
            END LOOP;
            EXECUTE format('DELETE FROM {schema}.messages m USING {schema}.%I j '
                           'WHERE m.job_id = j.id', part.relname);
            EXECUTE format('DELETE FROM {schema}.partition_locks l USING {schema}.%I j '
                           'WHERE l.job_id = j.id', part.relname);
            EXECUTE format('DELETE FROM {schema}.job_keys k USING {schema}.%I j '
                           'WHERE j.dedup_key IS NOT NULL AND k.key = j.dedup_key '
                           'AND k.job_id = j.id', part.relname);
            -- ACCESS EXCLUSIVE on jobs and the partition: a reader of the day (a report, a
            -- count over every partition) holds it off, so up to ten tries of 50 ms, 50 ms
            -- apart, in which the claims go on.
            FOR attempt IN 1 .. 10 LOOP
                BEGIN
                    -- `jobs` before migration 0047 renamed it (0038 calls this).
                    EXECUTE format('ALTER TABLE %s DETACH PARTITION {schema}.%I',
                                   coalesce(to_regclass('{schema}.job_rows_legacy'),
                                            to_regclass('{schema}.jobs')),
                                   part.relname);
                    EXIT;
                EXCEPTION WHEN lock_not_available THEN
                    IF attempt = 10 THEN
                        RAISE;
                    END IF;
                    PERFORM pg_sleep(0.05);
                END;
            END LOOP;
            removed := removed + held;
        EXCEPTION WHEN lock_not_available THEN
            due := least(due, now_at + interval '1 minute');
            EXIT;
        END;
    END LOOP;
    WITH gone AS (
        DELETE FROM {schema}.jobs_unfiled WHERE finished_at < cutoff RETURNING 1
    )
    SELECT removed + count(*) INTO removed FROM gone;
    IF NOT {schema}.satellite_epochs_rotate() THEN
        due := least(due, now_at + interval '1 minute');
    END IF;
    RETURN QUERY SELECT removed, due;
END
$$;

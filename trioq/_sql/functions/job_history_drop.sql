-- Drops the day partitions job_history_rotate() detached (`jobs_d` and a date, or
-- jobs_before, no longer a partition of `jobs`), in a transaction of its own. Detaching holds
-- ACCESS EXCLUSIVE on `jobs`, which every claim waits behind, until its transaction ends; a
-- detach committed alone holds it 2 ms, a detach and the drop of a 1,000,000-job day together
-- 66-84 ms (bench/RESULTS.md, "Retention's lock, the ring's readers, backlog depth and a
-- pg_dump's locks"), so the drop comes after, holding only the
-- detached table. A table a reader still holds (a `pg_dump`) waits 50 ms at most and is left
-- for the next call. Returns the tables dropped and the tables left. Sent right after
-- job_history_rotate() by the leader and by `trioq purge`; one left over by a process that
-- stopped between the two goes with the next call.
-- SECURITY DEFINER: a worker's role may not DROP (docs/operations.md, "Roles"). It takes no
-- input; it drops only tables of this schema named as job_history_add() names a day.
CREATE OR REPLACE FUNCTION {schema}.job_history_drop()
RETURNS TABLE (dropped integer, left_over integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '50ms' AS $$
DECLARE
    part text;
BEGIN
    dropped := 0;
    left_over := 0;
    FOR part IN
        SELECT c.relname FROM pg_catalog.pg_class c
        WHERE c.relnamespace = '{schema}'::regnamespace AND c.relkind = 'r'
          AND NOT c.relispartition AND c.relname ~ '^jobs_(d[0-9]{8}|before)$'
        ORDER BY c.relname
    LOOP
        BEGIN
            EXECUTE format('DROP TABLE {schema}.%I', part);
            dropped := dropped + 1;
        EXCEPTION WHEN lock_not_available THEN
            left_over := left_over + 1;
        END;
    END LOOP;
    RETURN NEXT;
END
$$;

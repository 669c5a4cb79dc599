-- Truncates the ready ring's drained slots (migration 0039), and moves the ring to a new bank of
-- slots when they cannot be truncated (migration 0041). The elected leader calls it every 2 s
-- from a maintenance pass that found work for it until there is none
-- (trioq/_runtime/services/maintenance.py). Returns the slots truncated and ready_pending().
--
-- 1. A slot of the bank being written (`base` .. `base` + 3) that is not being written
--    (ready_slot() of now and of the coming 5 s), holds no entry of a job that is still ready
--    (an entry that outlived its job's readiness, a cancelled job's, goes with its slot) and
--    has pages left is truncated. A TRUNCATE leaves no dead tuple, whatever snapshot is open:
--    what vacuum cannot remove while a long transaction pins the horizon is gone here. Every
--    lock waits 10 ms at most (the claims queued behind the request wait no longer; with
--    NOWAIT the claims, which read every slot, refused most tries): a slot a claim or an
--    enqueue's open transaction holds is left for the next call (an enqueue that filed a row
--    there holds its lock until it commits, so no entry is lost: and a claim reads every slot
--    from `low` on, so a row filed late in an old slot is found).
-- 2. A `pg_dump` holds ACCESS SHARE on every slot for the whole dump, so no slot can be
--    truncated and every claim steps over every entry taken since the dump began (7.0x pickup
--    p95 in 150 s: bench/RESULTS.md, "Retention's lock, the ring's readers, backlog depth and
--    a pg_dump's locks"). When a drained
--    slot of the written bank has not been truncated for 10 s (`blocked_since`), the next four
--    slots are created and attached (tables newer than the dump are not in it; attaching takes
--    SHARE UPDATE EXCLUSIVE on `ready_ring`, which the dump's lock allows) and `base` moves
--    there: from the next enqueue on, jobs are filed in the new bank.
-- 3. 5 s after a move, the old bank (`low` .. `base` - 1) is left: under SHARE locks on its
--    slots (no enqueue that filed there is still open, none can file there meanwhile; a dump's
--    lock allows them), the entries of its jobs still ready are moved to the slot being
--    written (their claim order is in the entries), and `low` moves to `base`. The claims read no slot below `low`
--    (pruned when they run), so what the old bank holds no longer costs them anything.
-- 4. A slot below `low`, at most every 20 s (each try waits on the claims, which lock every
--    slot of the ring): the entries of jobs still ready that were filed there late (an enqueue
--    whose transaction read the ring's state before the move: a REPEATABLE READ one) are moved
--    to the slot being written, while the dump may still hold the slot (a DELETE's lock is one
--    a dump's allows: such a job waited for the dump's end, minutes or hours, before), and the
--    slot is dropped once it can be locked (the dump has ended), what was filed since moved
--    first.
-- SECURITY DEFINER: a worker's role may not TRUNCATE, CREATE or DROP (docs/operations.md,
-- "Roles"). It takes no input; every name it builds is `ready_ring_` and a number.
CREATE OR REPLACE FUNCTION {schema}.ready_sweep()
RETURNS TABLE (truncated integer, pending integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '10ms' AS $$
DECLARE
    st        {schema}.ready_ring_state;
    writing   smallint;
    next_slot smallint;
    slot      smallint;
    filled    boolean;
    blocked   boolean := false;
    kept      boolean := false;
    part      record;
    -- A retired slot's entries of jobs still ready, to the slot being written (step 4).
    late      constant text := 'WITH moved AS (DELETE FROM {schema}.%I r'
                               ' USING {schema}.job_rows j WHERE j.id = r.id AND j.phase = ''ready'''
                               ' AND j.filed = r.filed'
                               ' RETURNING r.queue, r.task, r.version, r.priority, r.run_at, r.id,'
                               ' r.filed)'
                               ' INSERT INTO {schema}.ready_ring'
                               ' (slot, queue, task, version, priority, run_at, id, filed)'
                               ' SELECT DISTINCT ON (m.id) $1, m.queue, m.task, m.version,'
                               ' m.priority, m.run_at, m.id, m.filed FROM moved m ORDER BY m.id';
BEGIN
    truncated := 0;
    BEGIN
        -- One sweep at a time (a leader elected while the last one's sweep still runs).
        SELECT * INTO st FROM {schema}.ready_ring_state FOR UPDATE;
        IF NOT FOUND THEN
            -- Emptied by hand (a test suite truncating every table): bank 0 again, as the
            -- filing and the claims read a missing row.
            INSERT INTO {schema}.ready_ring_state DEFAULT VALUES ON CONFLICT DO NOTHING;
            SELECT * INTO st FROM {schema}.ready_ring_state FOR UPDATE;
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        pending := {schema}.ready_pending();
        RETURN NEXT;
        RETURN;
    END;
    writing := st.base + {schema}.ready_slot(now());
    next_slot := st.base + {schema}.ready_slot(now() + interval '5 seconds');
    -- 4. The banks left behind, once they can be locked.
    IF st.retired_tried_at IS NULL OR st.retired_tried_at <= now() - interval '20 seconds' THEN
        FOR part IN
            SELECT c.relname
            FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = '{schema}.ready_ring'::regclass
              AND c.relname ~ '^ready_ring_[0-9]+$'
              AND substr(c.relname, 12)::integer < st.low
            ORDER BY substr(c.relname, 12)::integer
        LOOP
            BEGIN
                EXECUTE format(late, part.relname) USING writing;
            EXCEPTION WHEN lock_not_available THEN
                NULL;  -- a lock it would wait on past lock_timeout: the next try
            END;
            BEGIN
                EXECUTE format('LOCK TABLE {schema}.%I IN ACCESS EXCLUSIVE MODE', part.relname);
                EXECUTE format(late, part.relname) USING writing;  -- filed since the move above
                EXECUTE format('DROP TABLE {schema}.%I', part.relname);
            EXCEPTION WHEN lock_not_available THEN
                kept := true;
            END;
        END LOOP;
        IF kept THEN
            UPDATE {schema}.ready_ring_state SET retired_tried_at = now();
        END IF;
    END IF;
    -- 1. The written bank's drained slots.
    FOR slot IN st.base .. st.base + 3 LOOP
        CONTINUE WHEN slot IN (writing, next_slot);
        CONTINUE WHEN pg_relation_size(format('{schema}.ready_ring_%s', slot)::regclass) = 0;
        BEGIN
            EXECUTE format('LOCK TABLE {schema}.ready_ring_%s IN ACCESS EXCLUSIVE MODE', slot);
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM {schema}.ready_ring_%s r'
                           ' JOIN {schema}.job_rows j ON j.id = r.id AND j.phase = ''ready'''
                           ' AND j.filed = r.filed)',
                           slot)
                INTO filled;
            IF NOT filled THEN
                EXECUTE format('TRUNCATE {schema}.ready_ring_%s', slot);
                truncated := truncated + 1;
            END IF;
        EXCEPTION WHEN lock_not_available THEN
            blocked := true;
        END;
    END LOOP;
    IF truncated > 0 OR NOT blocked THEN
        st.blocked_since := NULL;
    ELSIF st.blocked_since IS NULL THEN
        st.blocked_since := now();
    END IF;
    -- 2. A new bank, when the written one has been held for 10 s (one move at a time: the
    -- bank left behind by the last move has been left, step 3).
    IF st.blocked_since <= now() - interval '10 seconds' AND st.low = st.base
       AND st.base <= 32767 - 8 THEN
        BEGIN
            FOR slot IN st.base + 4 .. st.base + 7 LOOP
                EXECUTE format('CREATE TABLE {schema}.ready_ring_%s'
                               ' (LIKE {schema}.ready_ring INCLUDING DEFAULTS)'
                               ' WITH (vacuum_truncate = off)', slot);
                EXECUTE format('ALTER TABLE {schema}.ready_ring ATTACH PARTITION'
                               ' {schema}.ready_ring_%s FOR VALUES IN (%s)', slot, slot);
            END LOOP;
            st.base := st.base + 4;
            st.moved_at := now();
            st.blocked_since := NULL;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END IF;
    -- 3. The bank left behind, 5 s after the move.
    IF st.low < st.base AND st.moved_at <= now() - interval '5 seconds' THEN
        BEGIN
            FOR slot IN st.low .. st.base - 1 LOOP
                EXECUTE format('LOCK TABLE {schema}.ready_ring_%s IN SHARE MODE', slot);
            END LOOP;
            -- Moved, not copied: what is left there of a ready job afterwards was filed late
            -- (step 4 moves it). The deleted entries' dead versions are in a bank no claim
            -- reads, and go with its tables.
            WITH moved AS (
                DELETE FROM {schema}.ready_ring r
                USING {schema}.job_rows j
                WHERE r.slot >= st.low AND r.slot < st.base
                  AND j.id = r.id AND j.phase = 'ready' AND j.filed = r.filed
                RETURNING r.queue, r.task, r.version, r.priority, r.run_at, r.id, r.filed
            )
            INSERT INTO {schema}.ready_ring (slot, queue, task, version, priority, run_at, id,
                                             filed)
            SELECT DISTINCT ON (m.id) st.base + {schema}.ready_slot(now()), m.queue, m.task,
                   m.version, m.priority, m.run_at, m.id, m.filed
            FROM moved m
            ORDER BY m.id;
            st.low := st.base;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END IF;
    -- Written only when it changed: the claims and every filing read this row, and each
    -- version of it is one more they step over while a snapshot pins the horizon.
    UPDATE {schema}.ready_ring_state s
    SET base = st.base, low = st.low, blocked_since = st.blocked_since, moved_at = st.moved_at
    WHERE (s.base, s.low, s.blocked_since, s.moved_at)
          IS DISTINCT FROM (st.base, st.low, st.blocked_since, st.moved_at);
    pending := {schema}.ready_pending();
    RETURN NEXT;
END
$$;

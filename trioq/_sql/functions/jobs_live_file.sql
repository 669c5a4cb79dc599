-- Since migration 0050 only job_due_filed_insert calls this (a record inserted due): the
-- statements that move a record write job_due themselves, and ready_ring_filed_update files
-- the ring. The UPDATE branch below serves a schema between migrations 0044 and 0050.
-- Files a jobs_live row where the claims look for it (migrations 0044, 0047): a row entering
-- or moving within the due phases (scheduled, sleeping, waiting) in job_due, a row leaving
-- them out of it, and a row turning ready with no key in the ready ring (migration 0039; the
-- rest of ready_ring_file()'s comment holds here too). The triggers job_due_filed_insert (a
-- row inserted due) and jobs_live_filed (an UPDATE OF phase, run_at or filed) call it; their
-- WHEN clauses are checked per row without calling it, so a keyed claim pays two comparisons,
-- a claim from the ring nothing (it writes no row) and a completion none here (it leaves
-- jobs_live: jobs_live_left()). One statement per table fills every writer's rows, so no
-- writer can forget its jobs (a due row job_due lacks is a job never promoted). The upsert
-- keeps a row's copy when it moves from one due phase or time to another (a wait's timeout
-- set by a receive), and files a row migration 0045 has not copied yet.
CREATE OR REPLACE FUNCTION {schema}.jobs_live_file() RETURNS trigger
-- (Its qualified names: see db_now; a trigger of every delay, sleep, wait and wake-up.)
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.phase OPERATOR(pg_catalog.=) ANY ('{scheduled,sleeping,waiting}'::pg_catalog.text[])
    THEN
        IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' OR OLD.phase OPERATOR(pg_catalog.<>) ALL
           ('{scheduled,sleeping,waiting}'::pg_catalog.text[]) THEN
            -- A row entering the due states has no copy (it left with the row's last due
            -- state; migration 0045 copies a row only while it is due, under its lock), so a
            -- plain insert: with ON CONFLICT, 20,000 rows turning sleeping in one UPDATE
            -- cost 17.4 us a row against 15.2 (3.8 with no trigger; bench/RESULTS.md,
            -- "job_due").
            INSERT INTO {schema}.job_due (job_id, queue, state, run_at)
            VALUES (NEW.id, NEW.queue, NEW.phase, NEW.run_at);
        ELSE
            INSERT INTO {schema}.job_due (job_id, queue, state, run_at)
            VALUES (NEW.id, NEW.queue, NEW.phase, NEW.run_at)
            ON CONFLICT (job_id) DO UPDATE SET state = excluded.state, run_at = excluded.run_at;
        END IF;
        RETURN NULL;
    END IF;
    -- An UPDATE from here on: job_due_filed_insert calls this only for due rows.
    IF OLD.phase OPERATOR(pg_catalog.=) ANY ('{scheduled,sleeping,waiting}'::pg_catalog.text[])
    THEN
        DELETE FROM {schema}.job_due d WHERE d.job_id OPERATOR(pg_catalog.=) OLD.id;
    END IF;
    -- `filed` (migration 0047): a run of a job claimed from the ring (its row read ready
    -- throughout) that ends in ready again bumps it; the entry carries it for the claim's
    -- recheck.
    IF NEW.phase OPERATOR(pg_catalog.=) 'ready'
       AND (OLD.phase OPERATOR(pg_catalog.<>) 'ready'
            OR OLD.filed OPERATOR(pg_catalog.<>) NEW.filed)
       AND NEW.partition_key IS NULL AND NEW.concurrency_key IS NULL THEN
        INSERT INTO {schema}.ready_ring (slot, queue, task, version, priority, run_at, id,
                                         filed)
        VALUES (coalesce((SELECT s.base FROM {schema}.ready_ring_state s), 0::smallint)
                OPERATOR(pg_catalog.+) {schema}.ready_slot(pg_catalog.now()), NEW.queue,
                NEW.task, NEW.version, NEW.priority, NEW.run_at, NEW.id, NEW.filed);
    END IF;
    RETURN NULL;
END
$$;

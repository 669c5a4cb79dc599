-- Files a job that became ready and has no key in the ready ring (migration 0039), where the
-- claims find it: the trigger of every row of jobs_live that is inserted ready (an enqueue, a
-- spawn, a redrive moving a finished job back), and of every record turning ready unkeyed (a
-- promotion, a retry, a wake-up, a cancel of a suspended job: ready_ring_filed_update,
-- migration 0050; jobs_live_file() did it from 0044 to 0049). The trigger's WHEN clause is checked per row without calling
-- this, so an enqueue of a keyed job pays a comparison. One statement
-- fills every writer's rows, so no writer can forget its jobs (an entry a claim never finds
-- is a job that never runs). An entry can outlive its job's readiness (a cancel, a deadline):
-- the claim takes a job only if its row is still ready and steps over the others, which go
-- with their slot (ready_sweep()). The slot is the bank's first (`base`, migration 0041: it
-- moves when a `pg_dump` holds the slots) plus the 5 s phase of now; the state's one row is
-- read with the insert, in the same statement, and a state emptied by hand (a test suite
-- truncating every table) reads as bank 0, so a job is never left unfiled.
CREATE OR REPLACE FUNCTION {schema}.ready_ring_file() RETURNS trigger
-- (Its qualified names: see db_now; a trigger of every ready job.)
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.ready_ring (slot, queue, task, version, priority, run_at, id, filed)
    VALUES (coalesce((SELECT s.base FROM {schema}.ready_ring_state s), 0::smallint)
            OPERATOR(pg_catalog.+) {schema}.ready_slot(pg_catalog.now()), NEW.queue,
            NEW.task, NEW.version, NEW.priority, NEW.run_at, NEW.id, NEW.filed);
    RETURN NULL;
END
$$;

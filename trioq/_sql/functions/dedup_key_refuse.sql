-- Refuses an enqueue whose dedup key is held by a job of another task (docs/uniqueness.md,
-- "Keys are global"): dedup keys are global across tasks and queues, and handing the enqueue
-- that job (and, later, its result) would cross tasks, or tenants, silently. Raised inside the
-- enqueue's statement, so the statement writes nothing (job_insert_many and enqueue() call it
-- only for a row whose key an existing job of another task holds). The text is
-- trioq/_core/errors.py's dedup_key_conflict_message; the constraint name is how the drivers
-- tell it from any other unique violation. Returns nothing: it always raises.
CREATE OR REPLACE FUNCTION {schema}.dedup_key_refuse(key text, task text, holder_id bigint,
                                                     holder_task text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION '%', format('dedup_key %L is held by job %s of task %L, not %L: dedup keys '
                                'are global across tasks and queues (put the task in the key)',
                                key, holder_id, holder_task, task)
        USING ERRCODE = '23505', CONSTRAINT = 'dedup_key_held_by_another_task';
END
$$;

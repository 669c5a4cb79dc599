-- Releases a key's slot when its job stops running: the trigger of a deleted run (job_runs,
-- migration 0047). The WHEN clause is checked per updated
-- row without calling the function, so a job without a concurrency key pays one comparison.
CREATE OR REPLACE FUNCTION {schema}.concurrency_release() RETURNS trigger
-- (Its qualified names: see db_now; a trigger of every keyed job's end.)
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {schema}.concurrency_holds h
    WHERE h.concurrency_key OPERATOR(pg_catalog.=) OLD.concurrency_key
      AND h.job_id OPERATOR(pg_catalog.=) OLD.job_id;
    RETURN NULL;
END
$$;

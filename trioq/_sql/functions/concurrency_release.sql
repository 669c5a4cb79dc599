-- Releases a key's slot when its job stops running. The WHEN clause is checked per updated
-- row without calling the function, so a job without a concurrency key pays one comparison.
CREATE OR REPLACE FUNCTION {schema}.concurrency_release() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {schema}.concurrency_holds h
    WHERE h.concurrency_key = OLD.concurrency_key AND h.job_id = OLD.id;
    RETURN NULL;
END
$$;

-- The trigger of jobs_keys_delete (migration 0037): a statement that deletes jobs (purge,
-- retention, `keep=False`'s discard) deletes the key rows they hold, once per statement, so a
-- key row always names a job that exists (or one not yet visible) and a deleted holder's key is
-- free for the next enqueue at once. A key row that names another job (the key was handed
-- over) is left alone. Lock order: the deleter holds the job rows, then takes their key rows;
-- an enqueue takes a finished holder's row (FOR SHARE) before its key row, the same order.
CREATE OR REPLACE FUNCTION {schema}.job_keys_delete_of_jobs() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM {schema}.job_keys k USING deleted_jobs d
    WHERE d.dedup_key IS NOT NULL AND k.key = d.dedup_key AND k.job_id = d.id;
    RETURN NULL;
END
$$;

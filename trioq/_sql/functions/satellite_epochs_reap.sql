-- Drops the tables satellite_epochs_rotate() retired (`trioq_retired_<oid>`: an epoch's
-- partition detached, its rows expired but its files not yet deleted), in a transaction of its
-- own: a table no claim, completion or reader can name any more, so the deletion of its files at
-- this commit (120-150 ms for the 330 MB of 1,000,000 finished jobs) holds no lock anyone waits
-- for. Called right after the rotation, by the same caller (the leader, `trioq purge`); what a
-- lock keeps (a `pg_dump` that listed the table before it was retired) is left to the next call.
-- SECURITY DEFINER: dropping the schema owner's tables needs its rights; every name it drops is
-- read from the catalog and matches the retired tables' pattern.
CREATE OR REPLACE FUNCTION {schema}.satellite_epochs_reap() RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '50ms' AS $$
DECLARE
    retired record;
    dropped bigint := 0;
BEGIN
    FOR retired IN
        SELECT c.relname FROM pg_class c
        WHERE c.relnamespace = '{schema}'::regnamespace AND c.relkind = 'r'
          AND NOT c.relispartition AND c.relname ~ '^trioq_retired_[0-9]+$'
        ORDER BY c.oid
    LOOP
        BEGIN
            EXECUTE format('DROP TABLE {schema}.%I', retired.relname);
            dropped := dropped + 1;
        EXCEPTION WHEN lock_not_available THEN
            NULL;  -- held by a reader: the next call's
        END;
    END LOOP;
    RETURN dropped;
END
$$;

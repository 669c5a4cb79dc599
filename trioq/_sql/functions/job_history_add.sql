-- The partition of the jobs that finished on UTC day `d` (days since 1970-01-01, as job_lane()
-- counts them), created and attached unless it exists; true when it was created. Called by
-- job_history_rotate() for today and the days ahead (as the schema owner), and by a benchmark
-- that files old jobs under their day. Three indexes (id, parent, finished_at): what readers of
-- finished jobs look them up by; none of the claim path's.
-- The lane CHECK lets ATTACH skip its scan of the new table; the state CHECK keeps the
-- partition out of every plan that reads unfinished jobs. ATTACH takes SHARE UPDATE EXCLUSIVE
-- on `jobs` (enqueues, claims and completions go on) and scans jobs_unfiled, which is empty
-- unless a database clock ran ahead: then a row of that day there stops it (check_violation,
-- left to the caller). The parent is `job_rows_legacy` since migration 0047 and `jobs` before
-- it (migration 0038 calls this on a fresh schema, before 0047 renames the table and `state`).
CREATE OR REPLACE FUNCTION {schema}.job_history_add(d integer) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    part text := 'jobs_d' || to_char(to_timestamp(d::float8 * 86400) AT TIME ZONE 'UTC',
                                     'YYYYMMDD');
    parent regclass := coalesce(to_regclass('{schema}.job_rows_legacy'),
                                to_regclass('{schema}.jobs'));
    state_column text := CASE WHEN to_regclass('{schema}.job_rows_legacy') IS NULL
                              THEN 'state' ELSE 'phase' END;
BEGIN
    IF to_regclass(format('{schema}.%I', part)) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE {schema}.%I (LIKE %s INCLUDING DEFAULTS '
                   'INCLUDING CONSTRAINTS) WITH (vacuum_truncate = off, '
                   'toast.vacuum_truncate = off)', part, parent);
    EXECUTE format('ALTER TABLE {schema}.%I ALTER COLUMN id DROP IDENTITY IF EXISTS', part);
    EXECUTE format('ALTER TABLE {schema}.%I ADD CONSTRAINT %I CHECK (lane = %s), '
                   'ADD CONSTRAINT %I CHECK (%I IN (''completed'', ''failed'', '
                   '''cancelled''))', part, part || '_lane', d, part || '_finished',
                   state_column);
    EXECUTE format('CREATE INDEX %I ON {schema}.%I (id)', part || '_id_idx', part);
    EXECUTE format('CREATE INDEX %I ON {schema}.%I (parent_id, parent_position) '
                   'WHERE parent_id IS NOT NULL', part || '_parent_idx', part);
    EXECUTE format('CREATE INDEX %I ON {schema}.%I (finished_at)', part || '_finished_idx', part);
    EXECUTE format('ALTER TABLE %s ATTACH PARTITION {schema}.%I FOR VALUES IN (%s)',
                   parent, part, d);
    RETURN true;
END
$$;

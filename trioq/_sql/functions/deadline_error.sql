-- The stored error of a job whose deadline passed (the settle of its cancelled attempt writes
-- it, and so does the pass for a job it cancels without running it again).
CREATE OR REPLACE FUNCTION {schema}.deadline_error(deadline_at timestamptz, deadline_source text)
RETURNS jsonb
-- (Its qualified names: see db_now. AT TIME ZONE is pg_catalog.timezone whatever the path.)
LANGUAGE sql IMMUTABLE AS $$
    SELECT pg_catalog.jsonb_build_object(
        'type', 'DeadlineExceeded',
        'message', 'deadline passed at '
                   OPERATOR(pg_catalog.||)
                   pg_catalog.to_char(deadline_at AT TIME ZONE 'UTC',
                                      'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
                   OPERATOR(pg_catalog.||) ' ('
                   OPERATOR(pg_catalog.||) coalesce(deadline_source, 'set at enqueue')
                   OPERATOR(pg_catalog.||) ')');
$$;

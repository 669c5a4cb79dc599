-- The stored error of a job whose deadline passed (the settle of its cancelled attempt writes
-- it, and so does the pass for a job it cancels without running it again).
CREATE OR REPLACE FUNCTION {schema}.deadline_error(deadline_at timestamptz, deadline_source text)
RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object(
        'type', 'DeadlineExceeded',
        'message', 'deadline passed at '
                   || to_char(deadline_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
                   || ' (' || coalesce(deadline_source, 'set at enqueue') || ')');
$$;

-- Time comes from the database. Tests may pin it per session or role with
-- `SET trioq.fake_now = '2030-01-01 00:00+00'`; production never sets it.
-- (In every file of trioq/_sql, `{schema}` is the validated, quoted schema name and
-- `{schema_name}` the same name unquoted: validated as [a-z_][a-z0-9_]*, so safe in a literal.)
CREATE OR REPLACE FUNCTION {schema}.db_now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(nullif(current_setting('trioq.fake_now', true), '')::timestamptz, now())
$$;

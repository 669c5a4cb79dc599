-- Time comes from the database. Tests may pin it per session or role with
-- `SET trioq.fake_now = '2030-01-01 00:00+00'`; production never sets it.
-- (In every file of trioq/_sql, `{schema}` is the validated, quoted schema name and
-- `{schema_name}` the same name unquoted: validated as [a-z_][a-z0-9_]*, so safe in a literal.)
-- Not pinned (no SET search_path: that would stop PostgreSQL inlining it and cost ~2.5 us a
-- call, per row of the hot statements): every function, operator and type it names is
-- schema-qualified instead, so a caller's search_path cannot swap in another's
-- (tests/test_search_path.py).
-- (NULLIF and a simple CASE look `=` up on the search_path: hence the CASE WHEN.)
CREATE OR REPLACE FUNCTION {schema}.db_now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN pg_catalog.current_setting('trioq.fake_now', true) OPERATOR(pg_catalog.<>) ''
                THEN pg_catalog.current_setting('trioq.fake_now', true)::pg_catalog.timestamptz
                ELSE pg_catalog.now() END
$$;

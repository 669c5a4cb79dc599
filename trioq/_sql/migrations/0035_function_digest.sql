-- trioq schema, version 35: `migrate` applies the SQL functions' bodies (trioq/_sql/functions/)
-- only when they differ from what the last migrate applied, told by the digest of their text
-- kept here (one row). Applying unchanged bodies at every migrate would replace each function
-- under its running callers and invalidate every session's cached plans that call one (each
-- worker's claim statement), for nothing. A new, empty table: no lock on anything in use.
CREATE TABLE {schema}.function_digest (
    digest     text        NOT NULL,
    applied_at timestamptz NOT NULL
);

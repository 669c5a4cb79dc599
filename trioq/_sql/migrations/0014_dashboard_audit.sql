-- trioq schema, version 14: the dashboard's audit table.
--
-- Every action taken through `trioq dashboard --admin` (retry, cancel, pause, resume, emit,
-- purge) is recorded here before it runs, then given its outcome: who (the authenticated user,
-- or "local" on an unauthenticated loopback dashboard), from which address, what, on which
-- target. Rows are never updated after their outcome is set, and nothing in trioq deletes them.
CREATE TABLE {schema}.dashboard_audit (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL,
    actor      text        NOT NULL CHECK (length(actor) BETWEEN 1 AND 256),
    address    text        NOT NULL CHECK (length(address) <= 256),
    action     text        NOT NULL CHECK (length(action) BETWEEN 1 AND 64),
    target     text        NOT NULL CHECK (length(target) <= 1024),
    detail     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    outcome    text        CHECK (length(outcome) <= 4096)
);

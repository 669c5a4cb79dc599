-- trioq schema, version 22: a lost attempt carries its execution's trace id.
--
-- A worker that traces (the otel extra, configured) starts each execution's span with the lease
-- token as its trace id (trioq/_tracing.py), and its claim sets `traced`. Lease recovery, which
-- never saw the span, then writes the token (32 hex digits) as the lost attempt's trace_id;
-- rows claimed by a worker without tracing keep NULL. No write is added to the claim: the flag
-- is one more column of the row update the claim makes anyway.
-- Adding a column with a constant default rewrites nothing (PostgreSQL 11+); running jobs read
-- as untraced until their next claim.
ALTER TABLE {schema}.jobs ADD COLUMN traced boolean NOT NULL DEFAULT false;

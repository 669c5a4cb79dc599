-- trioq: no-transaction
-- trioq schema, version 46: jobs_live's partial indexes of the due rows are dropped; this
-- release's claims, probes and pages read job_due (migration 0044) instead.
--
-- Why: each delay, sleep and wait wrote an entry in both (three for a sleeping or waiting
-- row), and vacuum removed them later; the records' epochs to come cannot use them.
--
-- Online: each DROP INDEX CONCURRENTLY waits for the transactions that use the index and
-- holds up no enqueue or claim. A worker of the previous release still promotes and claims
-- its due jobs correctly, but by reading jobs_live whole for its due rows at every full claim
-- (docs/operations.md, "Upgrading"): roll the workers right after `migrate`.
DROP PROCEDURE IF EXISTS {schema}.job_due_fill(integer);
DROP INDEX CONCURRENTLY IF EXISTS {schema}.jobs_due_idx;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.jobs_suspended_idx;

-- trioq: no-transaction
-- trioq schema, version 42: what migration 0043 needs so that it scans nothing under its locks.
--
-- 0043 makes checkpoints, attempts and workflow_values partitioned tables with each old table
-- as their first partition (job ids below 2^40). Attaching a table scans it for a row outside
-- the partition's range unless a valid CHECK already rules them out; the CHECK is validated
-- here, with writes going on (VALIDATE holds SHARE UPDATE EXCLUSIVE). attempts' primary key
-- (id) becomes (job_id, id) (a partitioned table's key holds its partition key): its index is
-- built here concurrently, and 0043 only swaps the constraint onto it.
ALTER TABLE {schema}.checkpoints DROP CONSTRAINT IF EXISTS checkpoints_e0_bound,
    ADD CONSTRAINT checkpoints_e0_bound CHECK (job_id < 1099511627776) NOT VALID;
ALTER TABLE {schema}.checkpoints VALIDATE CONSTRAINT checkpoints_e0_bound;
ALTER TABLE {schema}.attempts DROP CONSTRAINT IF EXISTS attempts_e0_bound,
    ADD CONSTRAINT attempts_e0_bound CHECK (job_id < 1099511627776) NOT VALID;
ALTER TABLE {schema}.attempts VALIDATE CONSTRAINT attempts_e0_bound;
ALTER TABLE {schema}.workflow_values DROP CONSTRAINT IF EXISTS workflow_values_e0_bound,
    ADD CONSTRAINT workflow_values_e0_bound CHECK (job_id < 1099511627776) NOT VALID;
ALTER TABLE {schema}.workflow_values VALIDATE CONSTRAINT workflow_values_e0_bound;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.attempts_e0_key;
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS attempts_e0_key ON {schema}.attempts (job_id, id);

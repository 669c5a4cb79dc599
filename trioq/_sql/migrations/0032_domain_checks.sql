-- trioq schema, version 32: the jobs table's one-column CHECKs become domains, so a claim or a
-- settle no longer evaluates the rules of columns it does not write.
--
-- PostgreSQL evaluates every CHECK of a table for every row an UPDATE writes, and compiles
-- them all (read from the catalog, constant-folded, prepared) once per statement, whatever the
-- statement changes. A domain's CHECK is evaluated where a value is assigned to a column of
-- that type: by INSERT, and by an UPDATE only for the columns it sets. Of the table's 18
-- CHECKs, 14 were on one column each, and the hot path writes one of those (attempt, at the
-- claim). Measured by replaying a drain's claim and flush statements (the plain ones) on one
-- session, durable cluster, CPU of that backend, 12 interleaved repeats of 10,000 jobs: 52.1
-- us per job with the 18 CHECKs, 46.7 us with these domains (0.87x; with no CHECK at all,
-- 0.81-0.87x in other runs). 4 table CHECKs are left (state, the lease pair, run_at, one
-- kind of key): over columns the state changes write anyway, or two IS NULL tests.
-- The rules are the same (tests/test_enqueue_fast_path.py and tests/test_identifiers.py run
-- raw INSERTs against them); each domain's constraint keeps the old constraint's name, so a
-- refused raw INSERT names the same constraint (the message now says "value for domain").
--
-- DOWNTIME: changing a column to a domain with a CHECK rewrites the table and rebuilds its
-- indexes, under an ACCESS EXCLUSIVE lock: claims, enqueues and readers of jobs wait for
-- this migration (0.8 s for 100,000 rows on the bench machine, durable cluster). Stop the
-- workers, or expect them to wait, while `trioq migrate` runs. Values and column names do
-- not change: clients are sent the base type (docs/api.md names the two places that see the
-- domain).
CREATE DOMAIN {schema}.job_queue AS text
    CONSTRAINT jobs_queue_check CHECK (length(VALUE) <= 128
                                       AND VALUE ~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]*$');
CREATE DOMAIN {schema}.job_task AS text
    CONSTRAINT jobs_task_check CHECK (length(VALUE) <= 128
                                      AND VALUE ~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]*$');
CREATE DOMAIN {schema}.job_payload AS jsonb
    CONSTRAINT jobs_payload_check CHECK (pg_column_size(VALUE) <= 6000064);
CREATE DOMAIN {schema}.job_partition_key AS text
    CONSTRAINT jobs_partition_key_check CHECK (length(VALUE) BETWEEN 1 AND 512);
CREATE DOMAIN {schema}.job_dedup_key AS text
    CONSTRAINT jobs_dedup_key_check CHECK (length(VALUE) BETWEEN 1 AND 512);
CREATE DOMAIN {schema}.job_concurrency_key AS text
    CONSTRAINT jobs_concurrency_key_check CHECK (length(VALUE) BETWEEN 1 AND 512);
CREATE DOMAIN {schema}.job_concurrency_limit AS integer
    CONSTRAINT jobs_concurrency_limit_check CHECK (VALUE BETWEEN 1 AND 10000);
CREATE DOMAIN {schema}.job_attempt AS integer
    CONSTRAINT jobs_attempt_check CHECK (VALUE >= 0);
CREATE DOMAIN {schema}.job_max_attempts AS integer
    CONSTRAINT jobs_max_attempts_check CHECK (VALUE >= 1);
CREATE DOMAIN {schema}.job_checkpoint_count AS integer
    CONSTRAINT jobs_checkpoint_count_check CHECK (VALUE >= 0);
CREATE DOMAIN {schema}.job_version AS integer
    CONSTRAINT jobs_version_check CHECK (VALUE >= 1);
CREATE DOMAIN {schema}.job_trace_context AS text
    CONSTRAINT jobs_trace_context_check CHECK (length(VALUE) <= 512);
CREATE DOMAIN {schema}.job_unique_states AS text[]
    CONSTRAINT jobs_unique_states_check CHECK (VALUE <@ '{completed,failed,cancelled}'::text[]);
CREATE DOMAIN {schema}.job_on_parent_cancel AS text
    CONSTRAINT jobs_on_parent_cancel_check
        CHECK (VALUE = ANY ('{cancel,abandon,wait}'::text[]));

-- The concurrency key's release triggers read the column in their WHEN clause: PostgreSQL
-- refuses to change the type of a column a trigger depends on, so they are dropped and created
-- again as migration 0027 made them, in this transaction (no statement runs without them).
DROP TRIGGER jobs_concurrency_release_update ON {schema}.jobs;
DROP TRIGGER jobs_concurrency_release_delete ON {schema}.jobs;

-- One statement: one rewrite of the table and one rebuild of each index.
ALTER TABLE {schema}.jobs
    DROP CONSTRAINT jobs_queue_check,
    DROP CONSTRAINT jobs_task_check,
    DROP CONSTRAINT jobs_payload_check,
    DROP CONSTRAINT jobs_partition_key_check,
    DROP CONSTRAINT jobs_dedup_key_check,
    DROP CONSTRAINT jobs_concurrency_key_check,
    DROP CONSTRAINT jobs_concurrency_limit_check,
    DROP CONSTRAINT jobs_attempt_check,
    DROP CONSTRAINT jobs_max_attempts_check,
    DROP CONSTRAINT jobs_checkpoint_count_check,
    DROP CONSTRAINT jobs_version_check,
    DROP CONSTRAINT jobs_trace_context_check,
    DROP CONSTRAINT jobs_unique_states_check,
    DROP CONSTRAINT jobs_on_parent_cancel_check,
    ALTER COLUMN queue TYPE {schema}.job_queue,
    ALTER COLUMN task TYPE {schema}.job_task,
    ALTER COLUMN payload TYPE {schema}.job_payload,
    ALTER COLUMN partition_key TYPE {schema}.job_partition_key,
    ALTER COLUMN dedup_key TYPE {schema}.job_dedup_key,
    ALTER COLUMN concurrency_key TYPE {schema}.job_concurrency_key,
    ALTER COLUMN concurrency_limit TYPE {schema}.job_concurrency_limit,
    ALTER COLUMN attempt TYPE {schema}.job_attempt,
    ALTER COLUMN max_attempts TYPE {schema}.job_max_attempts,
    ALTER COLUMN checkpoint_count TYPE {schema}.job_checkpoint_count,
    ALTER COLUMN version TYPE {schema}.job_version,
    ALTER COLUMN trace_context TYPE {schema}.job_trace_context,
    ALTER COLUMN unique_states TYPE {schema}.job_unique_states,
    ALTER COLUMN on_parent_cancel TYPE {schema}.job_on_parent_cancel;

CREATE TRIGGER jobs_concurrency_release_update AFTER UPDATE OF state ON {schema}.jobs
    FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL AND OLD.state = 'running' AND NEW.state <> 'running')
    EXECUTE FUNCTION {schema}.concurrency_release();
CREATE TRIGGER jobs_concurrency_release_delete AFTER DELETE ON {schema}.jobs
    FOR EACH ROW WHEN (OLD.concurrency_key IS NOT NULL AND OLD.state = 'running')
    EXECUTE FUNCTION {schema}.concurrency_release();

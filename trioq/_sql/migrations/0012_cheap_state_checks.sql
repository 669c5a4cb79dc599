-- trioq schema, version 12: the jobs table's state, run_at and unique_states CHECKs, the same
-- rules written so PostgreSQL prepares them cheaply.
--
-- PostgreSQL rebuilds a table's CHECK expressions for every INSERT or UPDATE statement (read
-- from the catalog, constant-folded, compiled), before the first row. An `IN (...)` list or
-- an `ARRAY[...]` of literals is stored as one node per element and folded into an array at
-- each of those statements; a single array constant ('{...}'::text[]) is stored folded. The
-- jobs table's 14 CHECKs cost a single-row enqueue about 40 us of its ~80 us of server time
-- (measured against the same table without them, durable cluster); written this way, these
-- three cost about 10 us less (a copy of the table with the old and with the new three: 86 us
-- -> 76 us per single-row INSERT). Every claim, settle and cancel UPDATE of the table gains
-- the same per statement.
-- NOT VALID: the new rules accept exactly the rows the old ones did
-- (tests/test_enqueue_fast_path.py evaluates both on every case), so no table scan is needed;
-- new and updated rows are checked all the same.
ALTER TABLE {schema}.jobs
    DROP CONSTRAINT jobs_state_check,
    DROP CONSTRAINT jobs_run_at_check,
    DROP CONSTRAINT jobs_unique_states_check,
    ADD CONSTRAINT jobs_state_check
        CHECK (state = ANY ('{scheduled,ready,running,sleeping,waiting,completed,failed,cancelled}'::text[]))
        NOT VALID,
    ADD CONSTRAINT jobs_run_at_check
        CHECK (run_at IS NOT NULL OR state = ANY ('{waiting,completed,failed,cancelled}'::text[]))
        NOT VALID,
    ADD CONSTRAINT jobs_unique_states_check
        CHECK (unique_states <@ '{completed,failed,cancelled}'::text[]) NOT VALID;

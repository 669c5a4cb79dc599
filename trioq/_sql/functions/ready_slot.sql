-- The slot of the ready ring (`ready_ring`, migration 0039) that a job becoming ready at `at`
-- is filed in: four slots of 5 s each, in turn, so a slot is written for 5 s and then
-- drains for 15 s before it is written again. The leader truncates a slot once it is drained
-- (ready_sweep()), so what a claim steps over is bounded by a slot's few seconds of jobs,
-- not by how long a snapshot has held back vacuum (bench/RESULTS.md, "The ready ring").
-- From the transaction's real start (`now()`), never the test clock: a slot is a place to
-- write, not a time a job is due. Inlined (plain SQL, IMMUTABLE, no SET clause, every function
-- in it immutable: see job_lane()), so it names its functions and operators by schema
-- (tests/test_search_path.py). As a call it was 25 us of every enqueue's ring trigger.
CREATE OR REPLACE FUNCTION {schema}.ready_slot(at timestamptz) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (pg_catalog.floor(pg_catalog.date_part(
                'epoch', at OPERATOR(pg_catalog.-)
                         '1970-01-01 00:00:00+00'::pg_catalog.timestamptz)
            OPERATOR(pg_catalog./) 5)::bigint OPERATOR(pg_catalog.%) 4)::smallint
$$;

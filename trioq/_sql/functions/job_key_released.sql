-- Whether a finished job has let its dedup key go (docs/uniqueness.md): its final state is not
-- one of its unique_states, or its unique_until has passed. The one rule the enqueues hand a
-- key over by (job_insert_many, schedule_fire_many, enqueue()); each also asks for a final
-- state itself, which keeps jobs_live out of its plan (migration 0038). Inlined by the planner
-- (plain SQL, no SET clause), so it names its functions and operators by schema.
CREATE OR REPLACE FUNCTION {schema}.job_key_released(state text, unique_states text[],
                                                     unique_until timestamptz)
RETURNS boolean LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT NOT (state OPERATOR(pg_catalog.=) ANY(unique_states)
                AND (unique_until IS NULL
                     OR unique_until OPERATOR(pg_catalog.>) {schema}.db_now()))
$$;

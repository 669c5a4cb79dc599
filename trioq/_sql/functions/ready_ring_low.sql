-- The lowest slot of the ready ring that readers read: queries.sql's `ring_low` fragment, which
-- says what it is. This release's statements write the fragment in (a sub-select, read once: 2
-- us a claim against the call's 28); the previous release's claims call this function, so it
-- stays until a later release's migration drops it (docs/operations.md, "Upgrading").
-- PL/pgSQL, not SQL: its body holds a sub-select, so as SQL it was never inlined, and a called
-- SQL function parses and plans its body at every statement that calls it (94 us a claim in a
-- drain); PL/pgSQL keeps the plan for the session.
-- No SET clause, so it names its relation by schema (tests/test_search_path.py).
CREATE OR REPLACE FUNCTION {schema}.ready_ring_low() RETURNS smallint
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN
        -- include: ring_low
    ;
END
$$;

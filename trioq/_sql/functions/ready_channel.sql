-- Ready notifications shard by queue, result notifications by job id (64 channels each).
CREATE OR REPLACE FUNCTION {schema}.ready_channel(queue text) RETURNS text
-- (Its qualified names: see db_now.)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT '{schema_name}_ready_'
           OPERATOR(pg_catalog.||)
           (pg_catalog.hashtext(queue) OPERATOR(pg_catalog.&) 63)::pg_catalog.text
$$;

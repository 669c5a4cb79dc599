-- Result notifications shard by job id (64 channels), as ready notifications shard by queue.
CREATE OR REPLACE FUNCTION {schema}.result_channel(job_id bigint) RETURNS text
-- (Its qualified names: see db_now.)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT '{schema_name}_result_'
           OPERATOR(pg_catalog.||)
           (job_id OPERATOR(pg_catalog.&) 63::pg_catalog.int8)::pg_catalog.text
$$;

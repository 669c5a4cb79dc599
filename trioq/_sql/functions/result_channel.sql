-- Result notifications shard by job id (64 channels), as ready notifications shard by queue.
CREATE OR REPLACE FUNCTION {schema}.result_channel(job_id bigint) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT '{schema_name}_result_' || (job_id & 63)::text
$$;

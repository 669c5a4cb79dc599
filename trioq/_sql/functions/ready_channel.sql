-- Ready notifications shard by queue, result notifications by job id (64 channels each).
CREATE OR REPLACE FUNCTION {schema}.ready_channel(queue text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT '{schema_name}_ready_' || (hashtext(queue) & 63)::text
$$;

-- Makes `part`, the partition of `tab` (one of the tables partitioned by job id epoch) for the
-- ids from `low` to `high` (satellite_epochs_rotate(), which runs it with the schema owner's
-- rights). Made apart, with the parent's columns, constraints, defaults and indexes, then
-- attached: ATTACH PARTITION takes the parent's SHARE UPDATE EXCLUSIVE lock, which no claim,
-- enqueue, completion or settle conflicts with; `CREATE TABLE ... PARTITION OF` took its
-- ACCESS EXCLUSIVE lock, which every one of them queued behind until the rotation's
-- transaction ended (a midnight prune in the same pass: pickup p95 33x clean,
-- bench/RESULTS.md, "The midnight prune"). The empty table's bound is checked without a scan
-- worth the name; its indexes are attached to the parent's.
CREATE OR REPLACE FUNCTION {schema}.satellite_partition_add(tab text, part text, low bigint,
                                                         high bigint) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    EXECUTE format('CREATE TABLE {schema}.%I (LIKE {schema}.%I INCLUDING ALL) '
                   'WITH (vacuum_truncate = off, toast.vacuum_truncate = off)', part, tab);
    EXECUTE format('ALTER TABLE {schema}.%I ATTACH PARTITION {schema}.%I '
                   'FOR VALUES FROM (%s) TO (%s)', tab, part, low, high);
END
$$;

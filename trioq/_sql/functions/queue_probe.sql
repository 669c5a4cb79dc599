-- What a claim poll of `queue` would find, without claiming (the maintenance pass stands in
-- for idle queues' polls): a ready row, or a promotable due one, through the claim's sources
-- (unkeyed rows in the ready ring, migration 0039, an entry counting only while its job is
-- ready; partition-keyed and concurrency-keyed rows in ready_keyed, migration 0048), and the first
-- future due time (job_due, migration 0044). From the migrate that brings job_due until its
-- rows are all filed (migration 0045, seconds) a worker may probe a due time late and skip one
-- poll of that queue: it looks again within its poll interval.
CREATE OR REPLACE FUNCTION {schema}.queue_probe(queues text[])
RETURNS TABLE (queue text, work_due boolean, next_due timestamptz)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT q.queue,
           EXISTS (SELECT 1 FROM {schema}.ready_ring r
                   CROSS JOIN LATERAL (SELECT 1 FROM {schema}.job_rows j
                                       WHERE j.id = r.id AND j.phase = 'ready'
                                         AND j.filed = r.filed
                                       LIMIT 1) AS job
                   WHERE r.queue = q.queue
                     AND r.slot >=
                         -- include: ring_low
                  )
           -- The first entry in key order (as job_claim_plain's probe: an EXISTS may be
           -- planned as a scan of the whole table).
           OR (SELECT e.queue FROM {schema}.ready_keyed e WHERE e.queue = q.queue
               ORDER BY e.queue, e.kind, e.key LIMIT 1) IS NOT NULL
           OR coalesce(d.run_at <= {schema}.db_now(), false),
           CASE WHEN d.run_at > {schema}.db_now() THEN d.run_at END
    FROM unnest(queues) WITH ORDINALITY AS q(queue, ord)
    LEFT JOIN LATERAL (
        SELECT d.run_at FROM {schema}.job_due d
        WHERE d.queue = q.queue AND d.run_at IS NOT NULL
        ORDER BY d.run_at LIMIT 1
    ) AS d ON true
    ORDER BY q.ord
$$;

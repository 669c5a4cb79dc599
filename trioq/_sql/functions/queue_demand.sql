-- Queue demand: the signal a replica autoscaler (KEDA's PostgreSQL scaler, docs/deploy/) reads.
-- Per queue: due work (`ready`), how long the oldest has waited, what runs, and the future work
-- by kind. `due_now` is what a worker could start right now: ready rows plus scheduled,
-- sleeping and waiting rows whose run_at has passed but that are not promoted yet.
-- Planner: the narrow tables only (migration 0049: the records hold the history, which a pass
-- over them would read): the ready ring's valid entries (their record ready and filed as the
-- entry says, a primary-key probe each) and ready_keyed for the ready jobs, job_due for the
-- future-dated ones, job_runs for the running. Each holds only unfinished work, so the cost
-- follows the backlog, not the history. Meant for a scaler polling every 15-60 s.
CREATE OR REPLACE FUNCTION {schema}.queue_demand()
RETURNS TABLE (
    queue                text,
    ready                bigint,
    oldest_ready_seconds float8,
    running              bigint,
    scheduled            bigint,
    sleeping             bigint,
    waiting              bigint,
    due_now              bigint
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT j.queue,
           count(*) FILTER (WHERE j.state = 'ready' AND j.run_at <= t.now),
           extract(epoch FROM t.now - min(j.run_at) FILTER (
               WHERE j.state = 'ready' AND j.run_at <= t.now))::float8,
           count(*) FILTER (WHERE j.state = 'running'),
           count(*) FILTER (WHERE j.state = 'scheduled'
                               OR (j.state = 'ready' AND j.run_at > t.now)),
           count(*) FILTER (WHERE j.state = 'sleeping'),
           count(*) FILTER (WHERE j.state = 'waiting'),
           count(*) FILTER (WHERE j.run_at <= t.now
                              AND j.state IN ('ready', 'scheduled', 'sleeping', 'waiting'))
    FROM (SELECT DISTINCT ON (r.id) r.queue, r.run_at, 'ready' AS state
          FROM {schema}.ready_ring r
          JOIN {schema}.job_rows j ON j.id = r.id AND j.phase = 'ready' AND j.filed = r.filed
          WHERE r.slot >=
                -- include: ring_low
          UNION ALL
          SELECT e.queue, e.run_at, 'ready' FROM {schema}.ready_keyed e
          UNION ALL
          SELECT d.queue, d.run_at, d.state FROM {schema}.job_due d
          UNION ALL
          SELECT u.queue, NULL, 'running' FROM {schema}.job_runs u) AS j,
         (SELECT {schema}.db_now() AS now) AS t
    GROUP BY j.queue, t.now
$$;

-- The hot path's statements exactly as PgDriver sends them (schema `trioq`):
-- queries.sql's blocks with their includes expanded, comments and indentation dropped,
-- parameters as $n. Generated: `python -m tests.schema_snapshot`;
-- tests/test_schema_snapshot.py checks it. queries.sql says why each is as it is.

-- name: job_insert_one (1893 bytes; $1 payload_json, $2 queue, $3 task, $4 priority, $5 run_at, $6 delay_seconds, $7 partition_key, $8 max_attempts, $9 version, $10 trace_context, $11 deadline_at, $12 deadline_seconds, $13 deadline_source, $14 task_deadline)
WITH new_jobs AS (
SELECT $1::jsonb AS payload, o.*
FROM (
SELECT NULL::bigint AS id, $2::text AS queue, $3::text AS task,
$4::smallint AS priority, d.now,
coalesce($5::timestamptz,
d.now + coalesce($6::float8, 0) * interval '1 second')
AS due_at,
$7::text AS partition_key, NULL::text AS dedup_key,
$8::int AS max_attempts, NULL::text[] AS unique_states,
NULL::timestamptz AS unique_until, $9::int AS version,
$10::text AS trace_context, NULL::text AS concurrency_key,
NULL::int AS concurrency_limit,
$11::timestamptz AS deadline_at,
$12::float8 AS deadline,
$13::text AS deadline_source,
CASE WHEN $14::boolean AND $11::timestamptz IS NULL
AND $12::float8 IS NULL
THEN "trioq".task_deadline_seconds($3::text, $9::int)
END AS task_seconds,
NULL::bigint AS parent_id, NULL::int AS parent_position,
NULL::text AS on_parent_cancel
FROM (SELECT "trioq".db_now() AS now) AS d OFFSET 0
) AS o
)
INSERT INTO "trioq".job_rows AS j (id, queue, task, payload, phase, priority, run_at,
partition_key, dedup_key, max_attempts, created_at,
unique_states, unique_until, version, trace_context,
concurrency_key, concurrency_limit, deadline_at,
deadline_source, parent_id, parent_position,
on_parent_cancel)
SELECT coalesce(n.id, nextval('"trioq".jobs_id_seq')), n.queue, n.task, n.payload,
CASE WHEN n.due_at > n.now THEN 'scheduled' ELSE 'ready' END,
n.priority, n.due_at, n.partition_key, n.dedup_key, n.max_attempts, n.now,
coalesce(n.unique_states, '{}'), n.unique_until, n.version, n.trace_context,
n.concurrency_key, n.concurrency_limit,
coalesce(n.deadline_at,
n.now + coalesce(n.deadline, n.task_seconds) * interval '1 second'),
coalesce(n.deadline_source,
CASE WHEN n.task_seconds IS NOT NULL THEN 'set by task ' || n.task END),
n.parent_id, n.parent_position, coalesce(n.on_parent_cancel, 'cancel')
FROM new_jobs AS n
RETURNING j.id, pg_notify("trioq".ready_channel(j.queue), j.queue) AS notified;

-- name: job_insert_batch (2144 bytes; $1 queue, $2 task, $3 priority, $4 run_at, $5 delay_seconds, $6 partition_key, $7 max_attempts, $8 version, $9 trace_context, $10 deadline_at, $11 deadline_seconds, $12 deadline_source, $13 task_deadline, $14 payloads)
WITH new_jobs AS (
SELECT p.payload::jsonb AS payload, o.*
FROM (
SELECT NULL::bigint AS id, $1::text AS queue, $2::text AS task,
$3::smallint AS priority, d.now,
coalesce($4::timestamptz,
d.now + coalesce($5::float8, 0) * interval '1 second')
AS due_at,
$6::text AS partition_key, NULL::text AS dedup_key,
$7::int AS max_attempts, NULL::text[] AS unique_states,
NULL::timestamptz AS unique_until, $8::int AS version,
$9::text AS trace_context, NULL::text AS concurrency_key,
NULL::int AS concurrency_limit,
$10::timestamptz AS deadline_at,
$11::float8 AS deadline,
$12::text AS deadline_source,
CASE WHEN $13::boolean AND $10::timestamptz IS NULL
AND $11::float8 IS NULL
THEN "trioq".task_deadline_seconds($2::text, $8::int)
END AS task_seconds,
NULL::bigint AS parent_id, NULL::int AS parent_position,
NULL::text AS on_parent_cancel
FROM (SELECT "trioq".db_now() AS now) AS d OFFSET 0
) AS o,
unnest($14::text[]) WITH ORDINALITY AS p(payload, ord)
ORDER BY p.ord
),
inserted AS (
INSERT INTO "trioq".job_rows AS j (id, queue, task, payload, phase, priority, run_at,
partition_key, dedup_key, max_attempts, created_at,
unique_states, unique_until, version, trace_context,
concurrency_key, concurrency_limit, deadline_at,
deadline_source, parent_id, parent_position,
on_parent_cancel)
SELECT coalesce(n.id, nextval('"trioq".jobs_id_seq')), n.queue, n.task, n.payload,
CASE WHEN n.due_at > n.now THEN 'scheduled' ELSE 'ready' END,
n.priority, n.due_at, n.partition_key, n.dedup_key, n.max_attempts, n.now,
coalesce(n.unique_states, '{}'), n.unique_until, n.version, n.trace_context,
n.concurrency_key, n.concurrency_limit,
coalesce(n.deadline_at,
n.now + coalesce(n.deadline, n.task_seconds) * interval '1 second'),
coalesce(n.deadline_source,
CASE WHEN n.task_seconds IS NOT NULL THEN 'set by task ' || n.task END),
n.parent_id, n.parent_position, coalesce(n.on_parent_cancel, 'cancel')
FROM new_jobs AS n
RETURNING j.id, j.phase AS state
)
SELECT coalesce(array_agg(i.id ORDER BY i.id), '{}') AS ids,
(SELECT count(pg_notify("trioq".ready_channel($1::text), $1::text))
FROM (SELECT 1 FROM inserted LIMIT 1) AS any_row) AS sent
FROM inserted i;

-- name: job_insert_many (3883 bytes; $1 queue, $2 task, $3 payload_json, $4 priority, $5 run_at, $6 delay_seconds, $7 partition_key, $8 dedup_key, $9 max_attempts, $10 unique_for_seconds, $11 unique_states, $12 version, $13 trace_context, $14 concurrency_key, $15 concurrency_limit, $16 deadline_at, $17 deadline_seconds, $18 deadline_source, $19 task_deadline)
WITH input AS MATERIALIZED (
SELECT nextval('"trioq".jobs_id_seq') AS new_id, t.*
FROM unnest($1::text[], $2::text[], $3::text[],
$4::smallint[], $5::timestamptz[],
$6::float8[], $7::text[], $8::text[],
$9::int[], $10::float8[],
$11::text[], $12::int[], $13::text[],
$14::text[], $15::int[],
$16::timestamptz[], $17::float8[],
$18::text[], $19::boolean[])
WITH ORDINALITY AS t(queue, task, payload, priority, run_at, delay, partition_key,
dedup_key, max_attempts, unique_for, unique_states, version,
trace_context, concurrency_key, concurrency_limit, deadline_at,
deadline, deadline_source, task_deadline, ord)
),
released AS (
SELECT h.id
FROM (SELECT DISTINCT dedup_key FROM input WHERE dedup_key IS NOT NULL) AS i
JOIN "trioq".job_keys k ON k.key = i.dedup_key
JOIN "trioq".job_outcomes o ON o.job_id = k.job_id
JOIN "trioq".job_rows h ON h.id = k.job_id
WHERE "trioq".job_key_released(o.state, h.unique_states, h.unique_until)
FOR SHARE OF o
),
keys AS (
INSERT INTO "trioq".job_keys AS k (key, job_id, task)
SELECT DISTINCT ON (dedup_key) dedup_key, new_id, task FROM input
WHERE dedup_key IS NOT NULL AND (SELECT count(*) FROM released) >= 0
ORDER BY dedup_key, ord
ON CONFLICT (key) DO UPDATE
SET job_id = CASE WHEN k.job_id IN (SELECT id FROM released) THEN excluded.job_id
ELSE k.job_id END,
task = CASE WHEN k.job_id IN (SELECT id FROM released) THEN excluded.task
ELSE k.task END
RETURNING k.key, k.job_id, k.task
),
new_jobs AS (
SELECT i.new_id AS id, i.queue, i.task, i.payload::jsonb AS payload, i.priority, n.now,
coalesce(i.run_at, n.now + coalesce(i.delay, 0) * interval '1 second') AS due_at,
i.partition_key, i.dedup_key, i.max_attempts,
string_to_array(coalesce(i.unique_states, ''), ',') AS unique_states,
n.now + i.unique_for * interval '1 second' AS unique_until,
coalesce(i.version, 1) AS version, i.trace_context, i.concurrency_key,
i.concurrency_limit, i.deadline_at, i.deadline, i.deadline_source,
t.deadline_seconds AS task_seconds, NULL::bigint AS parent_id,
NULL::int AS parent_position, NULL::text AS on_parent_cancel
FROM input i
CROSS JOIN (SELECT "trioq".db_now() AS now) AS n
LEFT JOIN "trioq".task_defaults t
ON i.task_deadline AND i.deadline_at IS NULL AND i.deadline IS NULL
AND t.task = i.task AND t.version = coalesce(i.version, 1)
AND t.deadline_seconds IS NOT NULL
WHERE i.dedup_key IS NULL OR i.new_id IN (SELECT job_id FROM keys)
ORDER BY i.ord
),
inserted AS (
INSERT INTO "trioq".job_rows AS j (id, queue, task, payload, phase, priority, run_at,
partition_key, dedup_key, max_attempts, created_at,
unique_states, unique_until, version, trace_context,
concurrency_key, concurrency_limit, deadline_at,
deadline_source, parent_id, parent_position,
on_parent_cancel)
SELECT coalesce(n.id, nextval('"trioq".jobs_id_seq')), n.queue, n.task, n.payload,
CASE WHEN n.due_at > n.now THEN 'scheduled' ELSE 'ready' END,
n.priority, n.due_at, n.partition_key, n.dedup_key, n.max_attempts, n.now,
coalesce(n.unique_states, '{}'), n.unique_until, n.version, n.trace_context,
n.concurrency_key, n.concurrency_limit,
coalesce(n.deadline_at,
n.now + coalesce(n.deadline, n.task_seconds) * interval '1 second'),
coalesce(n.deadline_source,
CASE WHEN n.task_seconds IS NOT NULL THEN 'set by task ' || n.task END),
n.parent_id, n.parent_position, coalesce(n.on_parent_cancel, 'cancel')
FROM new_jobs AS n
RETURNING j.id, j.queue
),
notified AS (
SELECT count(pg_notify("trioq".ready_channel(due.queue), due.queue)) AS n
FROM (SELECT DISTINCT queue FROM inserted) AS due
)
SELECT i.ord, coalesce(fresh.id, holder.job_id) AS id, fresh.id IS NOT NULL AS created
FROM input i
LEFT JOIN inserted fresh ON fresh.id = i.new_id
LEFT JOIN keys holder ON holder.key = i.dedup_key
CROSS JOIN notified
WHERE CASE WHEN fresh.id IS NULL AND holder.task <> i.task
THEN "trioq".dedup_key_refuse(i.dedup_key, i.task, holder.job_id, holder.task)
ELSE true END
ORDER BY i.ord;

-- name: job_claim_plain (3601 bytes; $1 lookahead, $2 queue, $3 tasks, $4 task_versions, $5 limit, $6 lease_seconds, $7 worker_id, $8 traced)
WITH probe AS MATERIALIZED (
SELECT keyed.ready AS keyed_ready, due.run_at AS next_due,
keyed.ready OR coalesce(due.run_at <= "trioq".db_now()
+ (SELECT $1::float8) * interval '1 second',
false) AS blocked
FROM (SELECT (SELECT e.queue FROM "trioq".ready_keyed e
WHERE e.queue = (SELECT $2::text)
ORDER BY e.queue, e.kind, e.key LIMIT 1) IS NOT NULL AS ready
OFFSET 0) AS keyed
LEFT JOIN LATERAL (SELECT d.run_at FROM "trioq".job_due d
WHERE d.queue = (SELECT $2::text) AND d.run_at IS NOT NULL
ORDER BY d.run_at LIMIT 1) AS due ON true
),
unkeyed AS MATERIALIZED (
SELECT per_task.*
FROM unnest((SELECT $3::text[])) AS served(task)
CROSS JOIN LATERAL (
SELECT r.id, r.priority, r.run_at, r.slot AS ring_slot, r.ctid AS ring_row, r.queue,
job.*
FROM "trioq".ready_ring r
CROSS JOIN LATERAL (
SELECT j.attempt, j.executions, j.parent_id, j.result_watched, j.task, j.payload,
j.max_attempts, j.created_at, j.cancel_requested, j.version,
j.checkpoint_count
FROM "trioq".job_rows j
WHERE j.id = r.id AND j.phase = 'ready' AND j.filed = r.filed
LIMIT 1
FOR UPDATE OF j SKIP LOCKED
) AS job
WHERE r.queue = (SELECT $2::text)
AND r.task = served.task
AND r.slot >=
(SELECT coalesce((SELECT s.low FROM "trioq".ready_ring_state s), 0::smallint))
AND r.run_at <= "trioq".db_now()
AND ((SELECT $4::text[]) IS NULL
OR r.task || '@' || r.version = ANY((SELECT $4::text[])::text[]))
ORDER BY r.priority, r.run_at, r.id
LIMIT (SELECT $5::int)
FOR UPDATE OF r SKIP LOCKED
) AS per_task
WHERE NOT (SELECT blocked FROM probe)  -- a one-time filter: no row is scanned or locked
),
candidates AS MATERIALIZED (
SELECT id, ring_slot, ring_row, run_at, queue, NULL::text AS partition_key,
NULL::text AS concurrency_key, attempt, executions, parent_id, result_watched, task,
payload, max_attempts, created_at, cancel_requested, version, checkpoint_count,
priority
FROM unkeyed
WHERE NOT EXISTS (SELECT 1 FROM "trioq".queue_pauses p
WHERE p.queue = (SELECT $2::text))
ORDER BY priority, run_at, id
LIMIT (SELECT $5::int)
),
ring_taken AS MATERIALIZED (
SELECT CASE WHEN EXISTS (SELECT 1 FROM candidates WHERE ring_slot IS NOT NULL)
THEN "trioq".ready_ring_take(
ARRAY(SELECT ring_row FROM candidates WHERE ring_slot IS NOT NULL),
ARRAY(SELECT id FROM candidates WHERE ring_slot IS NOT NULL))
ELSE 0 END AS n
),
run AS (
INSERT INTO "trioq".job_runs (job_id, attempt, lease_token, lease_expires_at, worker_id,
traced, started_at, executions, queue, partition_key,
concurrency_key, parent_id, result_watched)
SELECT c.id, c.attempt + 1, gen_random_uuid(),
(SELECT "trioq".db_now()) + $6 * interval '1 second',
$7, $8,
greatest((SELECT "trioq".db_now()), c.run_at),
c.executions + 1, c.queue, c.partition_key, c.concurrency_key, c.parent_id,
c.result_watched
FROM candidates c
RETURNING job_id, attempt, lease_token
),
claimed AS MATERIALIZED (
SELECT c.id, c.queue, c.task, c.payload, u.attempt, c.max_attempts, u.lease_token,
c.partition_key, c.priority, c.run_at, c.created_at, c.cancel_requested, c.version,
CASE WHEN c.checkpoint_count > 0 THEN
(SELECT jsonb_agg(jsonb_build_array(h.position, h.kind, h.name, h.value)
ORDER BY h.position)
FROM "trioq".checkpoints h WHERE h.job_id = c.id) END AS history,
c.parent_id, c.concurrency_key
FROM run u JOIN candidates c ON c.id = u.job_id
)
SELECT (SELECT blocked FROM probe) AS blocked,
(SELECT keyed_ready FROM probe) AS keyed_ready,
0 AS promoted,
"trioq".db_now() + (clock_timestamp() - now()) AS now,
(SELECT next_due FROM probe) AS next_due,
NULL::text AS concurrency_cursor,
claimed.*
FROM (SELECT 1) AS one
LEFT JOIN claimed ON true
WHERE (SELECT n FROM ring_taken) >= 0;

-- name: job_claim (14441 bytes; $1 lookahead, $2 queue, $3 promote_limit, $4 limit, $5 tasks, $6 task_versions, $7 key_cursor, $8 key_window, $9 concurrency_cursor, $10 lease_seconds, $11 worker_id, $12 traced)
WITH RECURSIVE
due AS MATERIALIZED (
(SELECT locked.*
FROM "trioq".job_due d
CROSS JOIN LATERAL (
SELECT j.id, j.priority, j.run_at, j.queue, j.partition_key, j.task, j.version,
j.phase AS state, j.concurrency_key, j.attempt, j.executions, j.parent_id,
j.result_watched
FROM "trioq".job_rows j
WHERE j.id = d.job_id AND j.phase IN ('scheduled', 'sleeping', 'waiting')
AND j.run_at <= "trioq".db_now()
+ (SELECT $1::float8) * interval '1 second'
FOR UPDATE SKIP LOCKED
) AS locked
WHERE d.queue = (SELECT $2::text) AND d.run_at <= "trioq".db_now()
ORDER BY d.run_at
LIMIT (SELECT $3::int))
UNION ALL
(SELECT locked.*
FROM "trioq".job_due d
CROSS JOIN LATERAL (
SELECT j.id, j.priority, j.run_at, j.queue, j.partition_key, j.task, j.version,
j.phase AS state, j.concurrency_key, j.attempt, j.executions, j.parent_id,
j.result_watched
FROM "trioq".job_rows j
WHERE j.id = d.job_id AND j.phase IN ('scheduled', 'sleeping', 'waiting')
AND j.run_at <= "trioq".db_now()
+ (SELECT $1::float8) * interval '1 second'
FOR UPDATE SKIP LOCKED
) AS locked
WHERE d.queue = (SELECT $2::text) AND d.state IN ('sleeping', 'scheduled')
AND d.run_at > "trioq".db_now()
AND d.run_at <= "trioq".db_now() + (SELECT $1::float8) * interval '1 second'
ORDER BY d.run_at
LIMIT (SELECT $4::int))
),
due_unkeyed AS MATERIALIZED (
SELECT d.id, d.priority, d.run_at, d.queue, NULL::text AS partition_key, true AS held,
NULL::text AS concurrency_key, NULL::int AS slot, NULL::smallint AS ring_slot,
NULL::tid AS ring_row, d.attempt, d.executions, d.parent_id, d.result_watched
FROM due d
WHERE (SELECT $4::int) > 0 AND d.partition_key IS NULL
AND d.concurrency_key IS NULL
AND (d.run_at <= "trioq".db_now() OR d.state IN ('sleeping', 'scheduled'))
AND d.task = ANY((SELECT $5::text[])::text[])
AND ((SELECT $6::text[]) IS NULL
OR d.task || '@' || d.version = ANY((SELECT $6::text[])::text[]))
ORDER BY d.priority, d.run_at, d.id
LIMIT (SELECT $4::int)
),
ready_keys AS (
SELECT first_key.partition_key, 1 AS n, first_key.wrapped
FROM (
SELECT after_cursor.partition_key, false AS wrapped
FROM (SELECT e.key AS partition_key FROM "trioq".ready_keyed e
WHERE e.queue = (SELECT $2::text) AND e.kind = 'p'
AND e.key > (SELECT $7::text)
ORDER BY e.key LIMIT 1) AS after_cursor
UNION ALL
SELECT from_start.partition_key, true
FROM (SELECT e.key AS partition_key FROM "trioq".ready_keyed e
WHERE e.queue = (SELECT $2::text) AND e.kind = 'p'
ORDER BY e.key LIMIT 1) AS from_start
LIMIT 1
) AS first_key
WHERE (SELECT $4::int) > 0
UNION ALL
SELECT next_key.partition_key, k.n + 1, next_key.wrapped
FROM ready_keys k
CROSS JOIN LATERAL (
SELECT following.partition_key, k.wrapped AS wrapped
FROM (SELECT e.key AS partition_key FROM "trioq".ready_keyed e
WHERE e.queue = (SELECT $2::text) AND e.kind = 'p'
AND e.key > k.partition_key
ORDER BY e.key LIMIT 1) AS following
UNION ALL
SELECT from_start.partition_key, true
FROM (SELECT e.key AS partition_key FROM "trioq".ready_keyed e
WHERE e.queue = (SELECT $2::text) AND e.kind = 'p'
ORDER BY e.key LIMIT 1) AS from_start
WHERE NOT k.wrapped
LIMIT 1
) AS next_key
WHERE k.n < (SELECT $8::int)
AND NOT (next_key.wrapped AND next_key.partition_key > (SELECT $7::text))
AND NOT (next_key.wrapped AND k.wrapped AND next_key.partition_key <= k.partition_key)
),
heads AS MATERIALIZED (
SELECT head.id, head.filed, head.priority, head.run_at, head.entry_row, head.held
FROM ready_keys k
LEFT JOIN "trioq".partition_locks l
ON l.queue = (SELECT $2::text) AND l.partition_key = k.partition_key
CROSS JOIN LATERAL (
(SELECT e.id, e.filed, e.priority, e.run_at, e.task, e.version, e.ctid AS entry_row,
false AS held
FROM "trioq".ready_keyed e
WHERE l.job_id IS NULL
AND e.queue = (SELECT $2::text) AND e.kind = 'p'
AND e.key = k.partition_key
AND e.run_at <= "trioq".db_now()
ORDER BY e.priority, e.run_at, e.id
LIMIT 1)
UNION ALL
(SELECT e.id, e.filed, e.priority, e.run_at, e.task, e.version, e.ctid, true AS held
FROM "trioq".job_rows j
JOIN "trioq".ready_keyed e
ON e.queue = j.queue AND e.kind = 'p' AND e.key = j.partition_key
AND e.priority = j.priority AND e.run_at = j.run_at AND e.id = j.id
WHERE j.id = l.job_id AND j.phase = 'ready')
) AS head
WHERE head.task = ANY((SELECT $5::text[])::text[])
AND ((SELECT $6::text[]) IS NULL
OR head.task || '@' || head.version = ANY((SELECT $6::text[])::text[]))
ORDER BY head.priority, head.run_at, head.id
LIMIT 2 * (SELECT $4::int)
),
keyed AS MATERIALIZED (
SELECT locked.id, locked.priority, locked.run_at, locked.queue, locked.partition_key, h.held,
NULL::text AS concurrency_key, NULL::int AS slot, NULL::smallint AS ring_slot,
h.entry_row AS ring_row, locked.attempt, locked.executions, locked.parent_id,
locked.result_watched
FROM heads h
CROSS JOIN LATERAL (
SELECT j.id, j.priority, j.run_at, j.queue, j.partition_key, j.attempt, j.executions,
j.parent_id, j.result_watched
FROM "trioq".job_rows j
WHERE j.id = h.id AND j.filed = h.filed AND j.priority = h.priority
AND j.run_at = h.run_at AND j.phase = 'ready' AND j.run_at <= "trioq".db_now()
FOR UPDATE SKIP LOCKED
) AS locked
),
ready_concurrency_keys AS (
SELECT first_key.concurrency_key, 1 AS n, first_key.wrapped
FROM (
SELECT after_cursor.concurrency_key, false AS wrapped
FROM (SELECT e.key AS concurrency_key FROM "trioq".ready_keyed e
WHERE e.queue = (SELECT $2::text) AND e.kind = 'c'
AND e.key > (SELECT $9::text)
ORDER BY e.key LIMIT 1) AS after_cursor
UNION ALL
SELECT from_start.concurrency_key, true
FROM (SELECT e.key AS concurrency_key FROM "trioq".ready_keyed e
WHERE e.queue = (SELECT $2::text) AND e.kind = 'c'
ORDER BY e.key LIMIT 1) AS from_start
LIMIT 1
) AS first_key
WHERE (SELECT $4::int) > 0
UNION ALL
SELECT next_key.concurrency_key, k.n + 1, next_key.wrapped
FROM ready_concurrency_keys k
CROSS JOIN LATERAL (
SELECT following.concurrency_key, k.wrapped AS wrapped
FROM (SELECT e.key AS concurrency_key FROM "trioq".ready_keyed e
WHERE e.queue = (SELECT $2::text) AND e.kind = 'c'
AND e.key > k.concurrency_key
ORDER BY e.key LIMIT 1) AS following
UNION ALL
SELECT from_start.concurrency_key, true
FROM (SELECT e.key AS concurrency_key FROM "trioq".ready_keyed e
WHERE e.queue = (SELECT $2::text) AND e.kind = 'c'
ORDER BY e.key LIMIT 1) AS from_start
WHERE NOT k.wrapped
LIMIT 1
) AS next_key
WHERE k.n < (SELECT $8::int)
AND NOT (next_key.wrapped AND next_key.concurrency_key > (SELECT $9::text))
AND NOT (next_key.wrapped AND k.wrapped AND next_key.concurrency_key <= k.concurrency_key)
),
concurrency_room AS MATERIALIZED (
SELECT k.concurrency_key, lim.max_running,
least(greatest(lim.max_running - held.n, 0), (SELECT $4::int)) AS room
FROM ready_concurrency_keys k
CROSS JOIN LATERAL (
SELECT "trioq".concurrency_limit_of(k.concurrency_key, f.concurrency_limit)
AS max_running
FROM "trioq".ready_keyed f
WHERE f.queue = (SELECT $2::text) AND f.kind = 'c'
AND f.key = k.concurrency_key
ORDER BY f.priority, f.run_at, f.id LIMIT 1
) AS lim
CROSS JOIN LATERAL (
SELECT count(*) AS n FROM "trioq".concurrency_holds h
WHERE h.concurrency_key = k.concurrency_key
) AS held
),
concurrency_heads AS MATERIALIZED (
SELECT head.id, head.filed, head.priority, head.run_at, head.entry_row, r.concurrency_key,
free.slot
FROM concurrency_room r
CROSS JOIN LATERAL (
SELECT e.id, e.filed, e.priority, e.run_at, e.ctid AS entry_row,
row_number() OVER (ORDER BY e.priority, e.run_at, e.id) AS rank
FROM "trioq".ready_keyed e
WHERE e.queue = (SELECT $2::text) AND e.kind = 'c'
AND e.key = r.concurrency_key AND e.run_at <= "trioq".db_now()
AND e.task = ANY((SELECT $5::text[])::text[])
AND ((SELECT $6::text[]) IS NULL
OR e.task || '@' || e.version = ANY((SELECT $6::text[])::text[]))
ORDER BY e.priority, e.run_at, e.id
LIMIT r.room
) AS head
JOIN LATERAL (
SELECT s.slot, row_number() OVER (ORDER BY s.slot) AS rank
FROM generate_series(0, r.max_running - 1) AS s(slot)
WHERE NOT EXISTS (SELECT 1 FROM "trioq".concurrency_holds h
WHERE h.concurrency_key = r.concurrency_key AND h.slot = s.slot)
ORDER BY s.slot
LIMIT r.room
) AS free ON free.rank = head.rank
WHERE r.room > 0
ORDER BY head.priority, head.run_at, head.id
LIMIT 2 * (SELECT $4::int)
),
concurrency_keyed AS MATERIALIZED (
SELECT locked.id, locked.priority, locked.run_at, locked.queue, NULL::text AS partition_key,
true AS held, h.concurrency_key, h.slot, NULL::smallint AS ring_slot,
h.entry_row AS ring_row, locked.attempt, locked.executions, locked.parent_id,
locked.result_watched
FROM concurrency_heads h
CROSS JOIN LATERAL (
SELECT j.id, j.priority, j.run_at, j.queue, j.attempt, j.executions, j.parent_id,
j.result_watched
FROM "trioq".job_rows j
WHERE j.id = h.id AND j.filed = h.filed AND j.priority = h.priority
AND j.run_at = h.run_at AND j.phase = 'ready' AND j.run_at <= "trioq".db_now()
FOR UPDATE SKIP LOCKED
) AS locked
),
unkeyed AS MATERIALIZED (
SELECT per_task.*
FROM unnest((SELECT $5::text[])) AS served(task)
CROSS JOIN LATERAL (
SELECT r.id, r.priority, r.run_at, r.queue, NULL::text AS partition_key, true AS held,
NULL::text AS concurrency_key, NULL::int AS slot, r.slot AS ring_slot,
r.ctid AS ring_row, job.attempt, job.executions, job.parent_id,
job.result_watched
FROM "trioq".ready_ring r
CROSS JOIN LATERAL (
SELECT j.attempt, j.executions, j.parent_id, j.result_watched, j.task, j.payload,
j.max_attempts, j.created_at, j.cancel_requested, j.version,
j.checkpoint_count
FROM "trioq".job_rows j
WHERE j.id = r.id AND j.phase = 'ready' AND j.filed = r.filed
LIMIT 1
FOR UPDATE OF j SKIP LOCKED
) AS job
WHERE r.queue = (SELECT $2::text)
AND r.task = served.task
AND r.slot >=
(SELECT coalesce((SELECT s.low FROM "trioq".ready_ring_state s), 0::smallint))
AND r.run_at <= "trioq".db_now()
AND ((SELECT $6::text[]) IS NULL
OR r.task || '@' || r.version = ANY((SELECT $6::text[])::text[]))
ORDER BY r.priority, r.run_at, r.id
LIMIT (SELECT $4::int)
FOR UPDATE OF r SKIP LOCKED
) AS per_task
),
candidates AS MATERIALIZED (
SELECT * FROM (SELECT * FROM unkeyed UNION ALL SELECT * FROM keyed
UNION ALL SELECT * FROM concurrency_keyed
UNION ALL SELECT * FROM due_unkeyed) AS all_sources
WHERE NOT EXISTS (SELECT 1 FROM "trioq".queue_pauses p
WHERE p.queue = (SELECT $2::text))
ORDER BY priority, run_at, id
LIMIT (SELECT $4::int)
),
ring_taken AS MATERIALIZED (
SELECT CASE WHEN EXISTS (SELECT 1 FROM candidates WHERE ring_slot IS NOT NULL)
THEN "trioq".ready_ring_take(
ARRAY(SELECT ring_row FROM candidates WHERE ring_slot IS NOT NULL),
ARRAY(SELECT id FROM candidates WHERE ring_slot IS NOT NULL))
ELSE 0 END AS n
),
key_taken AS (
INSERT INTO "trioq".partition_locks (queue, partition_key, job_id)
SELECT queue, partition_key, id FROM candidates WHERE NOT held
ORDER BY queue, partition_key  -- one lock order for every claimer: no deadlock cycles
ON CONFLICT (queue, partition_key) DO NOTHING
RETURNING job_id
),
concurrency_taken AS (
INSERT INTO "trioq".concurrency_holds (concurrency_key, slot, job_id)
SELECT concurrency_key, slot, id FROM candidates
WHERE slot IS NOT NULL AND (SELECT count(*) FROM key_taken) >= 0
ORDER BY concurrency_key, slot
ON CONFLICT (concurrency_key, slot) DO NOTHING
RETURNING job_id
),
promoted AS (
UPDATE "trioq".job_rows j SET phase = 'ready', filed = j.filed + 1
FROM due d
WHERE j.id = d.id AND d.id NOT IN (SELECT id FROM candidates)
AND j.phase IN ('scheduled', 'sleeping', 'waiting')
AND j.run_at <= "trioq".db_now()
RETURNING j.id
),
ready_notified AS (
SELECT count(pg_notify("trioq".ready_channel(q.queue), q.queue)) AS n
FROM (SELECT (SELECT $2::text) AS queue WHERE EXISTS (SELECT 1 FROM promoted)) AS q
),
run AS (
INSERT INTO "trioq".job_runs (job_id, attempt, lease_token, lease_expires_at, worker_id,
traced, started_at, executions, queue, partition_key,
concurrency_key, parent_id, result_watched)
SELECT c.id, c.attempt + 1, gen_random_uuid(),
(SELECT "trioq".db_now()) + $10 * interval '1 second',
$11, $12,
CASE WHEN c.slot IS NULL AND c.partition_key IS NULL
THEN greatest("trioq".db_now(), c.run_at)
ELSE greatest("trioq".db_now() + (clock_timestamp() - now()), c.run_at) END
,
c.executions + 1, c.queue, c.partition_key, c.concurrency_key, c.parent_id,
c.result_watched
FROM candidates c
WHERE (c.held AND c.slot IS NULL) OR c.id IN (SELECT job_id FROM key_taken)
OR c.id IN (SELECT job_id FROM concurrency_taken)
RETURNING job_id, attempt, lease_token
),
keyed_taken AS MATERIALIZED (
SELECT CASE WHEN EXISTS (SELECT 1 FROM candidates c JOIN run u ON u.job_id = c.id
WHERE c.ring_slot IS NULL AND c.ring_row IS NOT NULL)
THEN "trioq".ready_keyed_take(
ARRAY(SELECT c.ring_row FROM candidates c JOIN run u ON u.job_id = c.id
WHERE c.ring_slot IS NULL AND c.ring_row IS NOT NULL),
ARRAY(SELECT c.id FROM candidates c JOIN run u ON u.job_id = c.id
WHERE c.ring_slot IS NULL AND c.ring_row IS NOT NULL))
ELSE 0 END AS n
),
claimed_in_place AS (
UPDATE "trioq".job_rows j SET phase = 'claimed'
FROM run u, candidates c
WHERE j.id = u.job_id AND c.id = u.job_id AND c.ring_slot IS NULL
AND j.phase IN ('ready', 'scheduled', 'sleeping', 'waiting')
RETURNING j.id
),
due_left AS MATERIALIZED (
SELECT CASE WHEN EXISTS (SELECT 1 FROM due)
THEN "trioq".job_due_leave(
ARRAY(SELECT id FROM promoted
UNION ALL
SELECT u.job_id FROM run u JOIN due d ON d.id = u.job_id))
ELSE 0 END AS n
),
claimed AS (
SELECT j.id, j.queue, j.task, j.payload, u.attempt, j.max_attempts, u.lease_token,
j.partition_key, j.priority, j.run_at, j.created_at, j.cancel_requested,
j.version,
CASE WHEN j.checkpoint_count > 0 THEN
(SELECT jsonb_agg(jsonb_build_array(c.position, c.kind, c.name, c.value)
ORDER BY c.position)
FROM "trioq".checkpoints c WHERE c.job_id = j.id) END AS history,
j.parent_id, j.concurrency_key
FROM run u JOIN "trioq".job_rows j ON j.id = u.job_id
)
SELECT (SELECT partition_key FROM ready_keys ORDER BY n DESC LIMIT 1) AS key_cursor,
greatest((SELECT count(*) FROM ready_keys),
(SELECT count(*) FROM ready_concurrency_keys)) AS keys_visited,
(SELECT count(*) FROM promoted) AS promoted,
"trioq".db_now() + (clock_timestamp() - now()) AS now,
(SELECT d.run_at FROM "trioq".job_due d
WHERE d.queue = (SELECT $2::text)
AND d.run_at > "trioq".db_now()
AND d.job_id NOT IN (SELECT id FROM candidates)  -- claimed early, here
ORDER BY d.run_at LIMIT 1) AS next_due,
(SELECT concurrency_key FROM ready_concurrency_keys ORDER BY n DESC LIMIT 1)
AS concurrency_cursor,
claimed.*
FROM (SELECT 1) AS one
LEFT JOIN claimed ON true
WHERE (SELECT n FROM ready_notified) >= 0 AND (SELECT n FROM ring_taken) >= 0
AND (SELECT n FROM keyed_taken) >= 0 AND (SELECT n FROM due_left) >= 0;

-- name: job_claim_rated (17245 bytes; $1 lookahead, $2 queue, $3 promote_limit, $4 limit, $5 tasks, $6 task_versions, $7 key_cursor, $8 key_window, $9 concurrency_cursor, $10 lease_seconds, $11 worker_id, $12 traced)
WITH RECURSIVE
due AS MATERIALIZED (
(SELECT locked.*
FROM "trioq".job_due d
CROSS JOIN LATERAL (
SELECT j.id, j.priority, j.run_at, j.queue, j.partition_key, j.task, j.version,
j.phase AS state, j.concurrency_key, j.attempt, j.executions, j.parent_id,
j.result_watched
FROM "trioq".job_rows j
WHERE j.id = d.job_id AND j.phase IN ('scheduled', 'sleeping', 'waiting')
AND j.run_at <= "trioq".db_now()
+ (SELECT $1::float8) * interval '1 second'
FOR UPDATE SKIP LOCKED
) AS locked
WHERE d.queue = (SELECT $2::text) AND d.run_at <= "trioq".db_now()
ORDER BY d.run_at
LIMIT (SELECT $3::int))
UNION ALL
(SELECT locked.*
FROM "trioq".job_due d
CROSS JOIN LATERAL (
SELECT j.id, j.priority, j.run_at, j.queue, j.partition_key, j.task, j.version,
j.phase AS state, j.concurrency_key, j.attempt, j.executions, j.parent_id,
j.result_watched
FROM "trioq".job_rows j
WHERE j.id = d.job_id AND j.phase IN ('scheduled', 'sleeping', 'waiting')
AND j.run_at <= "trioq".db_now()
+ (SELECT $1::float8) * interval '1 second'
FOR UPDATE SKIP LOCKED
) AS locked
WHERE d.queue = (SELECT $2::text) AND d.state IN ('sleeping', 'scheduled')
AND d.run_at > "trioq".db_now()
AND d.run_at <= "trioq".db_now() + (SELECT $1::float8) * interval '1 second'
ORDER BY d.run_at
LIMIT (SELECT $4::int))
),
due_unkeyed AS MATERIALIZED (
SELECT d.id, d.priority, d.run_at, d.queue, NULL::text AS partition_key, true AS held,
NULL::text AS concurrency_key, NULL::int AS slot, NULL::smallint AS ring_slot,
NULL::tid AS ring_row, d.attempt, d.executions, d.parent_id, d.result_watched
FROM due d
WHERE (SELECT $4::int) > 0 AND d.partition_key IS NULL
AND d.concurrency_key IS NULL
AND (d.run_at <= "trioq".db_now() OR d.state IN ('sleeping', 'scheduled'))
AND d.task = ANY((SELECT $5::text[])::text[])
AND ((SELECT $6::text[]) IS NULL
OR d.task || '@' || d.version = ANY((SELECT $6::text[])::text[]))
ORDER BY d.priority, d.run_at, d.id
LIMIT (SELECT $4::int)
),
ready_keys AS (
SELECT first_key.partition_key, 1 AS n, first_key.wrapped
FROM (
SELECT after_cursor.partition_key, false AS wrapped
FROM (SELECT e.key AS partition_key FROM "trioq".ready_keyed e
WHERE e.queue = (SELECT $2::text) AND e.kind = 'p'
AND e.key > (SELECT $7::text)
ORDER BY e.key LIMIT 1) AS after_cursor
UNION ALL
SELECT from_start.partition_key, true
FROM (SELECT e.key AS partition_key FROM "trioq".ready_keyed e
WHERE e.queue = (SELECT $2::text) AND e.kind = 'p'
ORDER BY e.key LIMIT 1) AS from_start
LIMIT 1
) AS first_key
WHERE (SELECT $4::int) > 0
UNION ALL
SELECT next_key.partition_key, k.n + 1, next_key.wrapped
FROM ready_keys k
CROSS JOIN LATERAL (
SELECT following.partition_key, k.wrapped AS wrapped
FROM (SELECT e.key AS partition_key FROM "trioq".ready_keyed e
WHERE e.queue = (SELECT $2::text) AND e.kind = 'p'
AND e.key > k.partition_key
ORDER BY e.key LIMIT 1) AS following
UNION ALL
SELECT from_start.partition_key, true
FROM (SELECT e.key AS partition_key FROM "trioq".ready_keyed e
WHERE e.queue = (SELECT $2::text) AND e.kind = 'p'
ORDER BY e.key LIMIT 1) AS from_start
WHERE NOT k.wrapped
LIMIT 1
) AS next_key
WHERE k.n < (SELECT $8::int)
AND NOT (next_key.wrapped AND next_key.partition_key > (SELECT $7::text))
AND NOT (next_key.wrapped AND k.wrapped AND next_key.partition_key <= k.partition_key)
),
heads AS MATERIALIZED (
SELECT head.id, head.filed, head.priority, head.run_at, head.entry_row, head.held
FROM ready_keys k
LEFT JOIN "trioq".partition_locks l
ON l.queue = (SELECT $2::text) AND l.partition_key = k.partition_key
CROSS JOIN LATERAL (
(SELECT e.id, e.filed, e.priority, e.run_at, e.task, e.version, e.ctid AS entry_row,
false AS held
FROM "trioq".ready_keyed e
WHERE l.job_id IS NULL
AND e.queue = (SELECT $2::text) AND e.kind = 'p'
AND e.key = k.partition_key
AND e.run_at <= "trioq".db_now()
ORDER BY e.priority, e.run_at, e.id
LIMIT 1)
UNION ALL
(SELECT e.id, e.filed, e.priority, e.run_at, e.task, e.version, e.ctid, true AS held
FROM "trioq".job_rows j
JOIN "trioq".ready_keyed e
ON e.queue = j.queue AND e.kind = 'p' AND e.key = j.partition_key
AND e.priority = j.priority AND e.run_at = j.run_at AND e.id = j.id
WHERE j.id = l.job_id AND j.phase = 'ready')
) AS head
WHERE head.task = ANY((SELECT $5::text[])::text[])
AND ((SELECT $6::text[]) IS NULL
OR head.task || '@' || head.version = ANY((SELECT $6::text[])::text[]))
ORDER BY head.priority, head.run_at, head.id
LIMIT 2 * (SELECT $4::int)
),
keyed AS MATERIALIZED (
SELECT locked.id, locked.priority, locked.run_at, locked.queue, locked.partition_key, h.held,
NULL::text AS concurrency_key, NULL::int AS slot, NULL::smallint AS ring_slot,
h.entry_row AS ring_row, locked.attempt, locked.executions, locked.parent_id,
locked.result_watched
FROM heads h
CROSS JOIN LATERAL (
SELECT j.id, j.priority, j.run_at, j.queue, j.partition_key, j.attempt, j.executions,
j.parent_id, j.result_watched
FROM "trioq".job_rows j
WHERE j.id = h.id AND j.filed = h.filed AND j.priority = h.priority
AND j.run_at = h.run_at AND j.phase = 'ready' AND j.run_at <= "trioq".db_now()
FOR UPDATE SKIP LOCKED
) AS locked
),
ready_concurrency_keys AS (
SELECT first_key.concurrency_key, 1 AS n, first_key.wrapped
FROM (
SELECT after_cursor.concurrency_key, false AS wrapped
FROM (SELECT e.key AS concurrency_key FROM "trioq".ready_keyed e
WHERE e.queue = (SELECT $2::text) AND e.kind = 'c'
AND e.key > (SELECT $9::text)
ORDER BY e.key LIMIT 1) AS after_cursor
UNION ALL
SELECT from_start.concurrency_key, true
FROM (SELECT e.key AS concurrency_key FROM "trioq".ready_keyed e
WHERE e.queue = (SELECT $2::text) AND e.kind = 'c'
ORDER BY e.key LIMIT 1) AS from_start
LIMIT 1
) AS first_key
WHERE (SELECT $4::int) > 0
UNION ALL
SELECT next_key.concurrency_key, k.n + 1, next_key.wrapped
FROM ready_concurrency_keys k
CROSS JOIN LATERAL (
SELECT following.concurrency_key, k.wrapped AS wrapped
FROM (SELECT e.key AS concurrency_key FROM "trioq".ready_keyed e
WHERE e.queue = (SELECT $2::text) AND e.kind = 'c'
AND e.key > k.concurrency_key
ORDER BY e.key LIMIT 1) AS following
UNION ALL
SELECT from_start.concurrency_key, true
FROM (SELECT e.key AS concurrency_key FROM "trioq".ready_keyed e
WHERE e.queue = (SELECT $2::text) AND e.kind = 'c'
ORDER BY e.key LIMIT 1) AS from_start
WHERE NOT k.wrapped
LIMIT 1
) AS next_key
WHERE k.n < (SELECT $8::int)
AND NOT (next_key.wrapped AND next_key.concurrency_key > (SELECT $9::text))
AND NOT (next_key.wrapped AND k.wrapped AND next_key.concurrency_key <= k.concurrency_key)
),
concurrency_room AS MATERIALIZED (
SELECT k.concurrency_key, lim.max_running, rate.rate_allowed, rate.rate_period,
recent.stale, recent.next_slot, recent.oldest,
CASE WHEN rate.rate_allowed IS NOT NULL
THEN greatest(rate.rate_allowed - recent.n, 0) END AS rate_room,
least(greatest(lim.max_running - held.n, 0), (SELECT $4::int)) AS other_room,
least(greatest(lim.max_running - held.n, 0), (SELECT $4::int),
CASE WHEN rate.rate_allowed IS NOT NULL
THEN greatest(rate.rate_allowed - recent.n, 0) END) AS room
FROM ready_concurrency_keys k
CROSS JOIN LATERAL (
SELECT "trioq".concurrency_limit_of(k.concurrency_key, f.concurrency_limit)
AS max_running
FROM "trioq".ready_keyed f
WHERE f.queue = (SELECT $2::text) AND f.kind = 'c'
AND f.key = k.concurrency_key
ORDER BY f.priority, f.run_at, f.id LIMIT 1
) AS lim
CROSS JOIN LATERAL (
SELECT count(*) AS n FROM "trioq".concurrency_holds h
WHERE h.concurrency_key = k.concurrency_key
) AS held
LEFT JOIN LATERAL "trioq".concurrency_rate_of(k.concurrency_key) AS rate ON true
LEFT JOIN LATERAL (
SELECT count(*) FILTER (WHERE s.started_at > w.start) AS n,
min(s.started_at) FILTER (WHERE s.started_at > w.start) AS oldest,
coalesce(array_agg(s.slot ORDER BY s.slot)
FILTER (WHERE s.started_at <= w.start
AND s.slot < rate.rate_allowed), '{}') AS stale,
coalesce(max(s.slot) + 1, 0) AS next_slot
FROM (SELECT "trioq".db_now() - rate.rate_period * interval '1 second' AS start) AS w
LEFT JOIN "trioq".concurrency_rate_starts s ON s.concurrency_key = k.concurrency_key
) AS recent ON rate.rate_allowed IS NOT NULL
),
concurrency_heads AS MATERIALIZED (
SELECT head.id, head.filed, head.priority, head.run_at, head.entry_row, r.concurrency_key,
free.slot, rate_free.slot AS rate_slot, r.rate_period
FROM concurrency_room r
CROSS JOIN LATERAL (
SELECT e.id, e.filed, e.priority, e.run_at, e.ctid AS entry_row,
row_number() OVER (ORDER BY e.priority, e.run_at, e.id) AS rank
FROM "trioq".ready_keyed e
WHERE e.queue = (SELECT $2::text) AND e.kind = 'c'
AND e.key = r.concurrency_key AND e.run_at <= "trioq".db_now()
AND e.task = ANY((SELECT $5::text[])::text[])
AND ((SELECT $6::text[]) IS NULL
OR e.task || '@' || e.version = ANY((SELECT $6::text[])::text[]))
ORDER BY e.priority, e.run_at, e.id
LIMIT r.room
) AS head
JOIN LATERAL (
SELECT s.slot, row_number() OVER (ORDER BY s.slot) AS rank
FROM generate_series(0, r.max_running - 1) AS s(slot)
WHERE NOT EXISTS (SELECT 1 FROM "trioq".concurrency_holds h
WHERE h.concurrency_key = r.concurrency_key AND h.slot = s.slot)
ORDER BY s.slot
LIMIT r.room
) AS free ON free.rank = head.rank
LEFT JOIN LATERAL (
SELECT f.slot, row_number() OVER (ORDER BY f.slot) AS rank
FROM (SELECT unnest(r.stale) AS slot
UNION ALL
SELECT generate_series(r.next_slot,
least(r.rate_allowed, r.next_slot + r.room) - 1)) AS f
WHERE r.rate_allowed IS NOT NULL  -- least() skips a NULL: no slots for unrated keys
ORDER BY f.slot
LIMIT r.room
) AS rate_free ON rate_free.rank = head.rank
WHERE r.room > 0 AND (r.rate_allowed IS NULL OR rate_free.slot IS NOT NULL)
ORDER BY head.priority, head.run_at, head.id
LIMIT 2 * (SELECT $4::int)
),
concurrency_keyed AS MATERIALIZED (
SELECT locked.id, locked.priority, locked.run_at, locked.queue, NULL::text AS partition_key,
true AS held, h.concurrency_key, h.slot, NULL::smallint AS ring_slot,
h.entry_row AS ring_row, locked.attempt, locked.executions, locked.parent_id,
locked.result_watched
FROM concurrency_heads h
CROSS JOIN LATERAL (
SELECT j.id, j.priority, j.run_at, j.queue, j.attempt, j.executions, j.parent_id,
j.result_watched
FROM "trioq".job_rows j
WHERE j.id = h.id AND j.filed = h.filed AND j.priority = h.priority
AND j.run_at = h.run_at AND j.phase = 'ready' AND j.run_at <= "trioq".db_now()
FOR UPDATE SKIP LOCKED
) AS locked
),
unkeyed AS MATERIALIZED (
SELECT per_task.*
FROM unnest((SELECT $5::text[])) AS served(task)
CROSS JOIN LATERAL (
SELECT r.id, r.priority, r.run_at, r.queue, NULL::text AS partition_key, true AS held,
NULL::text AS concurrency_key, NULL::int AS slot, r.slot AS ring_slot,
r.ctid AS ring_row, job.attempt, job.executions, job.parent_id,
job.result_watched
FROM "trioq".ready_ring r
CROSS JOIN LATERAL (
SELECT j.attempt, j.executions, j.parent_id, j.result_watched, j.task, j.payload,
j.max_attempts, j.created_at, j.cancel_requested, j.version,
j.checkpoint_count
FROM "trioq".job_rows j
WHERE j.id = r.id AND j.phase = 'ready' AND j.filed = r.filed
LIMIT 1
FOR UPDATE OF j SKIP LOCKED
) AS job
WHERE r.queue = (SELECT $2::text)
AND r.task = served.task
AND r.slot >=
(SELECT coalesce((SELECT s.low FROM "trioq".ready_ring_state s), 0::smallint))
AND r.run_at <= "trioq".db_now()
AND ((SELECT $6::text[]) IS NULL
OR r.task || '@' || r.version = ANY((SELECT $6::text[])::text[]))
ORDER BY r.priority, r.run_at, r.id
LIMIT (SELECT $4::int)
FOR UPDATE OF r SKIP LOCKED
) AS per_task
),
candidates AS MATERIALIZED (
SELECT * FROM (SELECT * FROM unkeyed UNION ALL SELECT * FROM keyed
UNION ALL SELECT * FROM concurrency_keyed
UNION ALL SELECT * FROM due_unkeyed) AS all_sources
WHERE NOT EXISTS (SELECT 1 FROM "trioq".queue_pauses p
WHERE p.queue = (SELECT $2::text))
ORDER BY priority, run_at, id
LIMIT (SELECT $4::int)
),
ring_taken AS MATERIALIZED (
SELECT CASE WHEN EXISTS (SELECT 1 FROM candidates WHERE ring_slot IS NOT NULL)
THEN "trioq".ready_ring_take(
ARRAY(SELECT ring_row FROM candidates WHERE ring_slot IS NOT NULL),
ARRAY(SELECT id FROM candidates WHERE ring_slot IS NOT NULL))
ELSE 0 END AS n
),
key_taken AS (
INSERT INTO "trioq".partition_locks (queue, partition_key, job_id)
SELECT queue, partition_key, id FROM candidates WHERE NOT held
ORDER BY queue, partition_key  -- one lock order for every claimer: no deadlock cycles
ON CONFLICT (queue, partition_key) DO NOTHING
RETURNING job_id
),
rate_taken AS (
INSERT INTO "trioq".concurrency_rate_starts AS s (concurrency_key, slot, started_at,
rate_period, job_id)
SELECT DISTINCT ON (h.concurrency_key, h.rate_slot)
h.concurrency_key, h.rate_slot,
"trioq".db_now() + (clock_timestamp() - now()), h.rate_period, h.id
FROM concurrency_heads h
WHERE h.rate_slot IS NOT NULL AND h.id IN (SELECT id FROM candidates)
AND (SELECT count(*) FROM key_taken) >= 0
ORDER BY h.concurrency_key, h.rate_slot
ON CONFLICT (concurrency_key, slot) DO UPDATE
SET started_at = "trioq".db_now() + (clock_timestamp() - now()),
rate_period = excluded.rate_period, job_id = excluded.job_id
WHERE s.started_at <= "trioq".db_now() + (clock_timestamp() - now())
- excluded.rate_period * interval '1 second'
RETURNING s.job_id, s.concurrency_key, s.started_at
),
concurrency_taken AS (
INSERT INTO "trioq".concurrency_holds (concurrency_key, slot, job_id)
SELECT c.concurrency_key, c.slot, c.id FROM candidates c
WHERE c.slot IS NOT NULL AND (SELECT count(*) FROM key_taken) >= 0
AND (c.id NOT IN (SELECT h.id FROM concurrency_heads h WHERE h.rate_slot IS NOT NULL)
OR c.id IN (SELECT t.job_id FROM rate_taken t))
ORDER BY c.concurrency_key, c.slot
ON CONFLICT (concurrency_key, slot) DO NOTHING
RETURNING job_id
),
promoted AS (
UPDATE "trioq".job_rows j SET phase = 'ready', filed = j.filed + 1
FROM due d
WHERE j.id = d.id AND d.id NOT IN (SELECT id FROM candidates)
AND j.phase IN ('scheduled', 'sleeping', 'waiting')
AND j.run_at <= "trioq".db_now()
RETURNING j.id
),
ready_notified AS (
SELECT count(pg_notify("trioq".ready_channel(q.queue), q.queue)) AS n
FROM (SELECT (SELECT $2::text) AS queue WHERE EXISTS (SELECT 1 FROM promoted)) AS q
),
run AS (
INSERT INTO "trioq".job_runs (job_id, attempt, lease_token, lease_expires_at, worker_id,
traced, started_at, executions, queue, partition_key,
concurrency_key, parent_id, result_watched)
SELECT c.id, c.attempt + 1, gen_random_uuid(),
(SELECT "trioq".db_now()) + $10 * interval '1 second',
$11, $12,
CASE WHEN c.slot IS NULL AND c.partition_key IS NULL
THEN greatest("trioq".db_now(), c.run_at)
ELSE greatest(coalesce((SELECT t.started_at FROM rate_taken t
WHERE t.job_id = c.id),
"trioq".db_now() + (clock_timestamp() - now())),
c.run_at) END
,
c.executions + 1, c.queue, c.partition_key, c.concurrency_key, c.parent_id,
c.result_watched
FROM candidates c
WHERE (c.held AND c.slot IS NULL) OR c.id IN (SELECT job_id FROM key_taken)
OR c.id IN (SELECT job_id FROM concurrency_taken)
RETURNING job_id, attempt, lease_token
),
keyed_taken AS MATERIALIZED (
SELECT CASE WHEN EXISTS (SELECT 1 FROM candidates c JOIN run u ON u.job_id = c.id
WHERE c.ring_slot IS NULL AND c.ring_row IS NOT NULL)
THEN "trioq".ready_keyed_take(
ARRAY(SELECT c.ring_row FROM candidates c JOIN run u ON u.job_id = c.id
WHERE c.ring_slot IS NULL AND c.ring_row IS NOT NULL),
ARRAY(SELECT c.id FROM candidates c JOIN run u ON u.job_id = c.id
WHERE c.ring_slot IS NULL AND c.ring_row IS NOT NULL))
ELSE 0 END AS n
),
claimed_in_place AS (
UPDATE "trioq".job_rows j SET phase = 'claimed'
FROM run u, candidates c
WHERE j.id = u.job_id AND c.id = u.job_id AND c.ring_slot IS NULL
AND j.phase IN ('ready', 'scheduled', 'sleeping', 'waiting')
RETURNING j.id
),
due_left AS MATERIALIZED (
SELECT CASE WHEN EXISTS (SELECT 1 FROM due)
THEN "trioq".job_due_leave(
ARRAY(SELECT id FROM promoted
UNION ALL
SELECT u.job_id FROM run u JOIN due d ON d.id = u.job_id))
ELSE 0 END AS n
),
claimed AS (
SELECT j.id, j.queue, j.task, j.payload, u.attempt, j.max_attempts, u.lease_token,
j.partition_key, j.priority, j.run_at, j.created_at, j.cancel_requested,
j.version,
CASE WHEN j.checkpoint_count > 0 THEN
(SELECT jsonb_agg(jsonb_build_array(c.position, c.kind, c.name, c.value)
ORDER BY c.position)
FROM "trioq".checkpoints c WHERE c.job_id = j.id) END AS history,
j.parent_id, j.concurrency_key
FROM run u JOIN "trioq".job_rows j ON j.id = u.job_id
)
SELECT (SELECT partition_key FROM ready_keys ORDER BY n DESC LIMIT 1) AS key_cursor,
greatest((SELECT count(*) FROM ready_keys),
(SELECT count(*) FROM ready_concurrency_keys)) AS keys_visited,
(SELECT count(*) FROM promoted) AS promoted,
"trioq".db_now() + (clock_timestamp() - now()) AS now,
(SELECT d.run_at FROM "trioq".job_due d
WHERE d.queue = (SELECT $2::text)
AND d.run_at > "trioq".db_now()
AND d.job_id NOT IN (SELECT id FROM candidates)  -- claimed early, here
ORDER BY d.run_at LIMIT 1) AS next_due,
(SELECT concurrency_key FROM ready_concurrency_keys ORDER BY n DESC LIMIT 1)
AS concurrency_cursor,
claimed.*
, (SELECT min(coalesce(r.oldest, taken.first) + r.rate_period * interval '1 second')
FROM concurrency_room r
CROSS JOIN LATERAL (SELECT count(*) AS n, min(t.started_at) AS first FROM rate_taken t
WHERE t.concurrency_key = r.concurrency_key) AS taken
WHERE r.rate_room < r.other_room AND r.rate_room <= taken.n)
AS key_rate_limited_until
FROM (SELECT 1) AS one
LEFT JOIN claimed ON true
WHERE (SELECT n FROM ready_notified) >= 0 AND (SELECT n FROM ring_taken) >= 0
AND (SELECT n FROM keyed_taken) >= 0 AND (SELECT n FROM due_left) >= 0;

-- name: job_complete_plain (1430 bytes; $1 ids, $2 attempts, $3 lease_tokens, $4 results)
WITH input AS MATERIALIZED (
SELECT t.*
FROM unnest((SELECT $1::bigint[]), (SELECT $2::int[]),
(SELECT $3::uuid[]), (SELECT $4::text[]))
AS t(id, attempt, lease_token, result)
),
gone AS MATERIALIZED (
SELECT u.run_job_id AS job_id, u.run_attempt AS attempt, u.run_executions AS executions,
u.run_worker_id AS worker_id, u.run_started_at AS started_at,
u.run_result_watched AS result_watched, u.run_queue AS queue, i.result
FROM "trioq".job_runs_finish_fenced((SELECT $1::bigint[]),
(SELECT $2::int[]),
(SELECT $3::uuid[])) AS u
JOIN input i
ON i.id = u.run_job_id AND i.attempt = u.run_attempt
AND i.lease_token = u.run_lease_token
),
settled AS (
INSERT INTO "trioq".job_outcomes (job_id, state, result, error, attempt, executions,
worker_id, started_at, finished_at, queue)
SELECT g.job_id, 'completed', g.result::jsonb, NULL, g.attempt, g.executions, g.worker_id,
g.started_at, "trioq".db_now(), g.queue
FROM gone g
RETURNING job_id AS id, state
),
results_notified AS (
SELECT count(pg_notify(channel, ids)) AS n
FROM (SELECT "trioq".result_channel(job_id) AS channel,
string_agg(job_id::text, ',') AS ids
FROM gone WHERE result_watched GROUP BY 1) AS per_channel
)
SELECT coalesce(array_agg(id ORDER BY id), '{}') AS ids,
coalesce(array_agg(state ORDER BY id), '{}') AS states,
(SELECT n FROM results_notified) AS notified,  -- read here, so it always runs
"trioq".db_now() + (clock_timestamp() - now()) AS now
FROM settled;

-- name: job_settle_many (5230 bytes; $1 ids, $2 attempts, $3 lease_tokens, $4 states, $5 ready_when_due, $6 moves_run_at, $7 attempt_changes, $8 releases_key, $9 histories, $10 finals, $11 clears_worker, $12 results, $13 errors, $14 delays, $15 wake_ats)
WITH input AS MATERIALIZED (
SELECT t.*,
CASE WHEN t.moves_run_at
THEN coalesce(t.wake_at, "trioq".db_now() + t.delay * interval '1 second')
END AS next_run_at
FROM unnest((SELECT $1::bigint[]), (SELECT $2::int[]),
(SELECT $3::uuid[]), (SELECT $4::text[]),
(SELECT $5::bool[]), (SELECT $6::bool[]),
(SELECT $7::int[]), (SELECT $8::bool[]),
(SELECT $9::text[]), (SELECT $10::bool[]),
(SELECT $11::bool[]), (SELECT $12::text[]),
(SELECT $13::text[]), (SELECT $14::float8[]),
(SELECT $15::timestamptz[]))
AS t(id, attempt, lease_token, state, ready_when_due, moves_run_at, attempt_change,
releases_key, history, final, clears_worker, result, error, delay, wake_at)
),
gone AS MATERIALIZED (
SELECT u.run_job_id AS job_id, u.run_attempt AS attempt, u.run_executions AS executions,
u.run_worker_id AS worker_id, u.run_traced AS traced,
u.run_started_at AS started_at, u.run_result_watched AS result_watched,
u.run_lease_token AS lease_token
FROM "trioq".job_runs_settle_fenced((SELECT $1::bigint[]),
(SELECT $2::int[]),
(SELECT $3::uuid[]),
(SELECT $4::text[])) AS u
),
moved AS (
UPDATE "trioq".job_rows j
SET phase = CASE WHEN i.ready_when_due AND i.next_run_at <= "trioq".db_now() THEN 'ready'
ELSE i.state END,
filed = j.filed + CASE WHEN i.state = 'ready'
OR (i.ready_when_due AND i.next_run_at <= "trioq".db_now())
THEN 1 ELSE 0 END,
run_at = CASE WHEN i.moves_run_at THEN i.next_run_at ELSE j.run_at END,
attempt = g.attempt + i.attempt_change,
executions = g.executions,
traced = g.traced,
error = i.error::jsonb,
worker_id = CASE WHEN i.clears_worker THEN NULL ELSE g.worker_id END,
started_at = CASE WHEN i.clears_worker THEN NULL ELSE g.started_at END
FROM gone g
JOIN input i
ON i.id = g.job_id AND i.attempt = g.attempt AND i.lease_token = g.lease_token
WHERE j.id = g.job_id AND NOT i.final
AND j.id = ANY((SELECT $1::bigint[])::bigint[])
AND j.phase IN ('ready', 'claimed')
RETURNING j.id, g.attempt, j.phase AS state, j.queue, j.partition_key,
g.worker_id, g.started_at, j.error, j.run_at, i.releases_key, i.history,
i.final, j.parent_id, j.result_watched OR g.result_watched AS result_watched
),
due_filed AS (
INSERT INTO "trioq".job_due (job_id, queue, state, run_at)
SELECT m.id, m.queue, m.state, m.run_at
FROM moved m
WHERE m.state IN ('scheduled', 'sleeping', 'waiting')
),
ended AS MATERIALIZED (
SELECT g.job_id AS id, g.attempt, g.executions, g.worker_id, g.started_at,
g.result_watched, i.state, i.result, i.error, i.attempt_change, i.clears_worker,
i.releases_key, i.history, j.queue, j.partition_key, j.run_at, j.parent_id,
j.result_watched AS row_watched, j.deadline_at, j.deadline_source
FROM gone g
JOIN input i
ON i.id = g.job_id AND i.attempt = g.attempt AND i.lease_token = g.lease_token
JOIN "trioq".job_rows j ON j.id = g.job_id
WHERE i.final
),
finished AS (
INSERT INTO "trioq".job_outcomes (job_id, state, result, error, attempt, executions,
worker_id, started_at, finished_at, queue)
SELECT e.id, e.state, e.result::jsonb,
CASE WHEN e.state = 'cancelled' AND e.deadline_at <= "trioq".db_now()
THEN "trioq".deadline_error(e.deadline_at, e.deadline_source)
ELSE e.error::jsonb END,
e.attempt + e.attempt_change, e.executions,
CASE WHEN e.clears_worker THEN NULL ELSE e.worker_id END,
CASE WHEN e.clears_worker THEN NULL ELSE e.started_at END,
"trioq".db_now(), e.queue
FROM ended e
RETURNING job_id, state, error
),
settled AS (
SELECT * FROM moved
UNION ALL
SELECT f.job_id, e.attempt, f.state, e.queue, e.partition_key, e.worker_id, e.started_at,
f.error, e.run_at, e.releases_key, e.history, true, e.parent_id,
e.row_watched OR e.result_watched
FROM finished f JOIN ended e ON e.id = f.job_id
),
unlocked AS (
DELETE FROM "trioq".partition_locks l
USING settled s
WHERE s.releases_key AND s.partition_key IS NOT NULL
AND l.queue = s.queue AND l.partition_key = s.partition_key AND l.job_id = s.id
RETURNING l.job_id
),
history AS (
INSERT INTO "trioq".attempts (job_id, attempt, outcome, error_type, error_message,
traceback, trace_id, worker_id, started_at, finished_at)
SELECT id, attempt, history,
error ->> 'type', error ->> 'message', error ->> 'traceback', error ->> 'trace_id',
worker_id, started_at, "trioq".db_now()
FROM settled WHERE history IS NOT NULL
),
results_notified AS (
SELECT count(pg_notify(channel, ids)) AS n
FROM (SELECT "trioq".result_channel(id) AS channel, string_agg(id::text, ',') AS ids
FROM settled WHERE final AND result_watched
GROUP BY 1) AS per_channel
),
ready_notified AS (
SELECT count(pg_notify("trioq".ready_channel(q.queue), q.queue)) AS n
FROM (SELECT DISTINCT queue FROM settled WHERE state = 'ready') AS q
),
parents_woken AS MATERIALIZED (
SELECT CASE WHEN EXISTS (SELECT 1 FROM settled WHERE final AND parent_id IS NOT NULL)
THEN "trioq".parents_notify(
ARRAY(SELECT id FROM settled WHERE final AND parent_id IS NOT NULL),
ARRAY(SELECT id FROM input))
ELSE 0 END AS n
)
SELECT coalesce(array_agg(id ORDER BY id), '{}') AS ids,
coalesce(array_agg(state ORDER BY id), '{}') AS states,
"trioq".db_now() + (clock_timestamp() - now()) AS now,
min(run_at) FILTER (WHERE state IN ('scheduled', 'sleeping', 'waiting')) AS next_due,
(SELECT n FROM results_notified) + (SELECT n FROM ready_notified)
+ (SELECT n FROM parents_woken) AS notified
FROM settled;

-- name: lease_renew_many (1770 bytes; $1 worker_state, $2 admission_queues, $3 admission_limits, $4 admission_concurrency, $5 admission_reasons, $6 admission_causes, $7 admission_reduced_for, $8 worker_id, $9 ids, $10 attempts, $11 lease_tokens, $12 lease_seconds)
WITH heartbeat AS (
UPDATE "trioq".workers SET heartbeat_at = "trioq".db_now(), state = $1,
admission = (
SELECT jsonb_object_agg(a.queue, jsonb_build_object(
'limit', a.lim, 'concurrency', a.concurrency, 'reason', a.reason,
'cause', a.cause,
'since', "trioq".db_now() - a.reduced_for * interval '1 second'))
FROM unnest($2::text[], $3::int[],
$4::int[], $5::text[],
$6::text[], $7::float8[])
AS a(queue, lim, concurrency, reason, cause, reduced_for))
WHERE id = $8
RETURNING id
),
requested AS MATERIALIZED (
SELECT u.job_id AS id, u.attempt, u.lease_token,
(SELECT j.cancel_requested FROM "trioq".job_rows j WHERE j.id = u.job_id)
AS cancel_requested
FROM unnest($9::bigint[], $10::int[], $11::uuid[])
AS o(id, attempt, lease_token)
JOIN "trioq".job_runs u ON u.job_id = o.id
WHERE u.attempt = o.attempt AND u.lease_token = o.lease_token
AND u.job_id = ANY((SELECT $9::bigint[])::bigint[])
),
lockable AS MATERIALIZED (
SELECT u.job_id AS id FROM "trioq".job_runs u
JOIN requested r ON r.id = u.job_id
WHERE r.attempt = u.attempt AND r.lease_token = u.lease_token
AND u.job_id = ANY((SELECT $9::bigint[])::bigint[])
FOR UPDATE OF u SKIP LOCKED
),
renewed AS (
UPDATE "trioq".job_runs u
SET lease_expires_at = "trioq".db_now() + $12 * interval '1 second'
FROM lockable l
WHERE u.job_id = l.id
AND u.job_id = ANY((SELECT $9::bigint[])::bigint[])
RETURNING u.job_id AS id,
(SELECT r.cancel_requested FROM requested r WHERE r.id = u.job_id)
AS cancel_requested
)
SELECT (SELECT count(*) FROM heartbeat) > 0 AS registered, r.id, r.cancel_requested, r.confirmed
FROM (SELECT 1) AS one
LEFT JOIN (
SELECT id, cancel_requested, true AS confirmed FROM renewed
UNION ALL
SELECT id, cancel_requested, false FROM requested
WHERE id NOT IN (SELECT id FROM lockable)
) AS r ON true;

-- name: checkpoint_insert_many_plain (1618 bytes; $1 ids, $2 attempts, $3 lease_tokens, $4 positions, $5 kinds, $6 names, $7 values, $8 wake_ins)
WITH input AS MATERIALIZED (
SELECT * FROM unnest($1::bigint[], $2::int[], $3::uuid[],
$4::int[], $5::text[], $6::text[],
$7::text[], $8::float8[])
AS t(id, attempt, lease_token, position, kind, name, value, wake_in)
),
fenced AS MATERIALIZED (
SELECT u.job_id AS id, u.attempt, u.lease_token, n.next_position
FROM (SELECT id, attempt, lease_token, max(position) + 1 AS next_position
FROM input GROUP BY id, attempt, lease_token) AS n
JOIN "trioq".job_runs u
ON u.job_id = n.id AND u.attempt = n.attempt AND u.lease_token = n.lease_token
ORDER BY u.job_id
FOR SHARE OF u
),
owner AS (
UPDATE "trioq".job_rows j
SET checkpoint_count = greatest(j.checkpoint_count, f.next_position)
FROM fenced f
WHERE j.id = f.id
RETURNING j.id
),
written AS (
INSERT INTO "trioq".checkpoints (job_id, position, kind, name, value, created_at)
SELECT i.id, i.position, i.kind, i.name,
CASE WHEN i.wake_in IS NULL THEN i.value::jsonb
ELSE coalesce(i.value::jsonb, '{}'::jsonb) || jsonb_build_object(
'wake_at', "trioq".db_now() + i.wake_in * interval '1 second') END,
"trioq".db_now()
FROM input i
JOIN fenced f
ON f.id = i.id AND f.attempt = i.attempt AND f.lease_token = i.lease_token
JOIN owner o ON o.id = i.id
ON CONFLICT (job_id, position) DO NOTHING
RETURNING job_id, position, value
)
SELECT i.id, i.position,
coalesce(w.value, (SELECT e.value FROM "trioq".checkpoints e
WHERE e.job_id = i.id AND e.position = i.position)) AS value
FROM input i
JOIN fenced f ON f.id = i.id AND f.attempt = i.attempt AND f.lease_token = i.lease_token
JOIN owner o ON o.id = i.id
LEFT JOIN written w ON w.job_id = i.id AND w.position = i.position
;

-- name: checkpoint_insert_many (2315 bytes; $1 ids, $2 attempts, $3 lease_tokens, $4 positions, $5 kinds, $6 names, $7 values, $8 wake_ins, $9 value_ids, $10 value_keys, $11 value_values)
WITH input AS MATERIALIZED (
SELECT * FROM unnest($1::bigint[], $2::int[], $3::uuid[],
$4::int[], $5::text[], $6::text[],
$7::text[], $8::float8[])
AS t(id, attempt, lease_token, position, kind, name, value, wake_in)
),
fenced AS MATERIALIZED (
SELECT u.job_id AS id, u.attempt, u.lease_token, n.next_position
FROM (SELECT id, attempt, lease_token, max(position) + 1 AS next_position
FROM input GROUP BY id, attempt, lease_token) AS n
JOIN "trioq".job_runs u
ON u.job_id = n.id AND u.attempt = n.attempt AND u.lease_token = n.lease_token
ORDER BY u.job_id
FOR SHARE OF u
),
owner AS (
UPDATE "trioq".job_rows j
SET checkpoint_count = greatest(j.checkpoint_count, f.next_position)
FROM fenced f
WHERE j.id = f.id
RETURNING j.id
),
written AS (
INSERT INTO "trioq".checkpoints (job_id, position, kind, name, value, created_at)
SELECT i.id, i.position, i.kind, i.name,
CASE WHEN i.wake_in IS NULL THEN i.value::jsonb
ELSE coalesce(i.value::jsonb, '{}'::jsonb) || jsonb_build_object(
'wake_at', "trioq".db_now() + i.wake_in * interval '1 second') END,
"trioq".db_now()
FROM input i
JOIN fenced f
ON f.id = i.id AND f.attempt = i.attempt AND f.lease_token = i.lease_token
JOIN owner o ON o.id = i.id
ON CONFLICT (job_id, position) DO NOTHING
RETURNING job_id, position, value
)
,
value_input AS (
SELECT DISTINCT ON (v.id, v.key) v.id, v.key, v.value
FROM unnest($9::bigint[], $10::text[], $11::text[])
WITH ORDINALITY AS v(id, key, value, n)
JOIN owner o ON o.id = v.id
ORDER BY v.id, v.key, v.n DESC
),
values_written AS (
INSERT INTO "trioq".workflow_values AS w (job_id, key, value, updated_at)
SELECT v.id, v.key, v.value::jsonb, "trioq".db_now() FROM value_input v
ON CONFLICT (job_id, key) DO UPDATE SET value = excluded.value,
updated_at = excluded.updated_at
RETURNING w.job_id
),
values_notified AS (
SELECT count(pg_notify("trioq".result_channel(job_id), job_id::text)) AS n
FROM (SELECT DISTINCT job_id FROM values_written) AS changed
)
SELECT i.id, i.position,
coalesce(w.value, (SELECT e.value FROM "trioq".checkpoints e
WHERE e.job_id = i.id AND e.position = i.position)) AS value
FROM input i
JOIN fenced f ON f.id = i.id AND f.attempt = i.attempt AND f.lease_token = i.lease_token
JOIN owner o ON o.id = i.id
LEFT JOIN written w ON w.job_id = i.id AND w.position = i.position
CROSS JOIN values_notified;

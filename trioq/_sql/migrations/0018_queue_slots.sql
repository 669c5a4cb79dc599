-- trioq schema, version 18: each worker's slots per queue (`--queue default=25 --queue mail=2`).

-- The slots of each queue in `queues`, in the same order, so `trioq status` and `trioq explain`
-- name each queue's limit; `concurrency` keeps the worker's total. NULL on rows written before
-- this version (their queues all had `concurrency` slots). Adding a nullable column rewrites
-- nothing; workers is a small table.
ALTER TABLE {schema}.workers ADD COLUMN queue_concurrency integer[];

-- trioq schema, version 8: each worker's admission-control snapshot on its row, so that
-- `trioq explain` can name "admission reduced to N because R" (the limit lives in the worker
-- process; the database knew nothing of it before).
-- {queue: {"limit": n, "concurrency": c, "reason": r, "cause": r0, "since": ts}} for the
-- queues whose effective limit is below the configured concurrency; NULL when every queue is
-- at full concurrency (or admission control is off or only observing). Written by the
-- worker's lease renewal (the heartbeat it already sends): no statement of its own. A stale
-- snapshot lasts at most one renewal interval, and a worker pruned as stale takes it along.
-- Adding a nullable column without a default rewrites nothing.
ALTER TABLE {schema}.workers ADD COLUMN admission jsonb;

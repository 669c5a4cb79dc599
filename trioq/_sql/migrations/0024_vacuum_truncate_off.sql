-- trioq schema, version 24: autovacuum never truncates the hot tables.
--
-- A drained queue leaves empty pages at the end of jobs (and of the tables every state change
-- writes). Vacuum's truncation of that tail takes an ACCESS EXCLUSIVE lock, which waits for every
-- claim and completion in flight and then blocks them all while it holds it: with many workers
-- on one backlog, one of the stalls the multi-worker scaling runs watch for (bench/scenarios/
-- scaling.py counts lock waits and vacuums during a drain). The space stays in the table's free
-- space map and the next enqueues reuse it. Only storage parameters change: no row moves.
ALTER TABLE {schema}.jobs SET (vacuum_truncate = off, toast.vacuum_truncate = off);
ALTER TABLE {schema}.partition_locks SET (vacuum_truncate = off);
ALTER TABLE {schema}.attempts SET (vacuum_truncate = off, toast.vacuum_truncate = off);
ALTER TABLE {schema}.checkpoints SET (vacuum_truncate = off, toast.vacuum_truncate = off);
ALTER TABLE {schema}.workers SET (vacuum_truncate = off);

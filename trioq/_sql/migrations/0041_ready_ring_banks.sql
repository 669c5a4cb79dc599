-- trioq schema, version 41: the ready ring moves to a new bank of slots when its slots cannot
-- be truncated (a `pg_dump` holds every table it dumps, the ring's included, for as long as it
-- runs), and the claims stop reading the bank it left.
--
-- Why: a TRUNCATE needs the slot's ACCESS EXCLUSIVE lock, which a `pg_dump` holding ACCESS
-- SHARE refuses for the whole dump; the slots were then written again and again, each claim
-- stepping over every entry taken since the dump began (800 jobs/s, 150 s: pickup p95 11.6 ->
-- 80.7 ms, 7.0x; bench/RESULTS.md, "Retention's lock, the ring's readers, backlog depth and
-- a pg_dump's locks"). Tables created
-- after a dump started are not in it: ready_sweep() creates the next four slots, attaches
-- them (which a dump's lock allows), files there, copies the entries of jobs still ready from
-- the old bank, and raises `low`, below which the claims read nothing. The old bank's tables
-- are dropped once the dump has let go of them.
--
-- ready_ring_state, one row: `base`, the first slot of the bank being written (slot = base +
-- ready_slot(now())); `low`, the first slot the claims read (below base while the old bank is
-- still read); `blocked_since`, when a drained slot of the written bank first could not be
-- truncated, with no truncation since; `moved_at`, when the bank last changed;
-- `retired_tried_at`, when the sweep last tried to drop a bank below `low`.
--
-- Online: this migration needs no stop. A worker of the previous release files into slots
-- 0-3 (its ready_ring_file() body is replaced here, in the same transaction, so it files
-- through `base` too) and claims from every slot, as before.
CREATE TABLE {schema}.ready_ring_state (
    one              boolean PRIMARY KEY DEFAULT true CHECK (one),
    base             smallint NOT NULL DEFAULT 0,
    low              smallint NOT NULL DEFAULT 0,
    blocked_since    timestamptz,
    moved_at         timestamptz,
    retired_tried_at timestamptz
);
INSERT INTO {schema}.ready_ring_state DEFAULT VALUES;

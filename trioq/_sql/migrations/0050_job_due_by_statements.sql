-- trioq schema, version 50: job_due is written by the statements that move a record into or
-- out of scheduled, sleeping and waiting, not by a row trigger on the records
-- (bench/plans/write_once_layout.md, stage 6; docs/concepts.md, "Storage").
--
-- Why: each durable sleep paid a PL/pgSQL trigger call for its copy and another for the copy's
-- delete at its due claim, where main paid two index entries: 20,000 rows turning sleeping in
-- one UPDATE cost 15.2 us a row with the trigger, 3.8 with neither trigger nor index
-- (bench/RESULTS.md, "job_due"). The trigger was needed only while a previous release's
-- workers wrote the records (migrations 0044-0046 ran online); 0047 is stop-first, so since
-- then only this release's statements write them.
--
-- Who writes job_due now:
--  * a run suspended into a due phase (job_settle_many's sleep, wait, retry with backoff;
--    job_wait_event, job_wait_children, job_receive()): a plain INSERT in the same statement,
--    from the record it wrote (a running job's record is ready or claimed and has no copy);
--  * the claim's promotion and due claim: job_due_leave(), once per statement;
--  * the wake-ups (event_emit(), send(), parents_notify()) and the tree cancel
--    (job_cancel_tree()): a statement of their own after the record's, fresh snapshot,
--    under the records' locks;
--  * an insert already due (a delayed enqueue or spawn, a schedule's fire) and a delete (a
--    purge, a retention fallback) keep their triggers, job_due_filed_insert and jobs_live_left:
--    their WHEN clauses cost the fast path's insert of a ready job a comparison, and an insert
--    has many writers (SQL enqueue() among them) that a missed copy would leave unpromoted.
-- What is left of jobs_live_filed is the ready ring's filing of a record turning ready
-- unkeyed, which migration 0044 had merged into it: ready_ring_file() again, as before 0044.
DROP TRIGGER jobs_live_filed ON {schema}.job_rows;
CREATE TRIGGER ready_ring_filed_update AFTER UPDATE OF phase, filed ON {schema}.job_rows
    FOR EACH ROW WHEN (new.phase = 'ready' AND (old.phase <> 'ready' OR old.filed <> new.filed)
                       AND new.partition_key IS NULL AND new.concurrency_key IS NULL)
    EXECUTE FUNCTION {schema}.ready_ring_file();

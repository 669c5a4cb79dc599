-- trioq: no-transaction
-- trioq schema, version 45: job_due gets the rows that were due before migration 0044's
-- triggers, in batches of 10,000 each committed on its own (the procedure's comment in 0044
-- says how a row promoted, woken or cancelled meanwhile is never copied stale). The readers of
-- this release start once it is done: `migrate` runs 0046 and returns only after it. Safe to
-- run again: it copies only the rows job_due lacks.
CALL {schema}.job_due_fill();

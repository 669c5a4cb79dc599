-- trioq schema, version 25: a send to a job waiting in ctx.receive for its topic writes the
-- message straight into that receive's checkpoint, so the woken handler replays the receive from
-- its history and runs no statement for it (docs/workflows.md, "Messages").
--
-- The position of the receive a waiting job is suspended in (NULL otherwise). Set by
-- job_receive when it suspends, cleared by the send that delivers into it or by the receive
-- that records a result. Rows suspended before this version have none: a send to them queues
-- the message and wakes them as version 20 did, and the woken receive takes it from the queue.
ALTER TABLE {schema}.jobs ADD COLUMN wait_position integer;

-- send(): its current body is trioq/_sql/functions/send.sql.

-- job_receive(): its current body is trioq/_sql/functions/job_receive.sql.

-- trioq schema, version 16: messages to a running workflow (`client.send`, `ctx.receive`) and
-- readable workflow state (`ctx.set_value`, `client.get_value`). docs/workflows.md, "Messages"
-- and "Readable state".

-- One row per message not yet received. `id` is the send order: senders to one job are
-- serialised by the job row lock (message_send), so id order is commit order for each job. A
-- receive deletes what it takes in the same statement that records it as the job's checkpoint,
-- so a message is either still here or in exactly one checkpoint (delivered once).
CREATE TABLE {schema}.messages (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     bigint      NOT NULL REFERENCES {schema}.jobs (id) ON DELETE CASCADE,
    topic      text        NOT NULL CHECK (length(topic) BETWEEN 1 AND 512),
    payload    jsonb       NOT NULL,
    created_at timestamptz NOT NULL
);
-- A receive takes the oldest messages of (job, topic) in order: one range scan.
CREATE INDEX messages_job_topic_idx ON {schema}.messages (job_id, topic, id);

-- The values a workflow published with ctx.set_value, newest per key; readable in any state of
-- the job and kept until the job is deleted.
CREATE TABLE {schema}.workflow_values (
    job_id     bigint      NOT NULL REFERENCES {schema}.jobs (id) ON DELETE CASCADE,
    key        text        NOT NULL CHECK (length(key) BETWEEN 1 AND 512),
    value      jsonb       NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (job_id, key)
);

-- The topic a waiting job waits for (NULL otherwise). Only message_send reads it, by job id,
-- so it needs no index. It can stay set on a job a timeout made ready: a wake-up needs state
-- 'waiting' too, and the next receive of the same position (replay is deterministic) resets it.
ALTER TABLE {schema}.jobs ADD COLUMN wait_topic text;

-- send(): its current body is trioq/_sql/functions/send.sql.

-- job_receive(): its current body is trioq/_sql/functions/job_receive.sql.

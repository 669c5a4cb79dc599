-- trioq schema, version 15: a job without an explicit max_attempts takes the declaration of the
-- worker that runs it, and `{schema}.enqueue(...)` takes the caller's trace context.

-- NULL max_attempts: the enqueuer gave none (a producer enqueuing by name, a declaration that
-- sets none, plain SQL), so the task's declaration on the worker decides (docs/producers.md,
-- "Which option wins"). Dropping NOT NULL and the default changes no row and scans nothing.
ALTER TABLE {schema}.jobs
    ALTER COLUMN max_attempts DROP NOT NULL,
    ALTER COLUMN max_attempts DROP DEFAULT;

-- Each worker writes the max_attempts its declarations give to every (task, version) it
-- serves when it registers (worker_register), so that statements without the worker's code
-- apply the same number to rows without one: lease recovery (a job whose worker died is
-- failed or retried by the leader), `trioq job` / `trioq jobs` / `explain`, and redrive. The
-- last worker to register a (task, version) wins; a task nobody declared counts 5. A small
-- table, read by primary key.
CREATE TABLE {schema}.task_defaults (
    task         text        NOT NULL,
    version      integer     NOT NULL,
    max_attempts integer     NOT NULL CHECK (max_attempts BETWEEN 1 AND 1000),
    declared_at  timestamptz NOT NULL,
    PRIMARY KEY (task, version)
);

-- The SQL enqueue gains `traceparent` (the caller's W3C trace context, stored in
-- jobs.trace_context so the handler's span links to it) and leaves max_attempts NULL unless
-- given. A new argument changes the signature, so the function is dropped and created again;
-- calls by name or by position from before keep working (the new argument is last).
DROP FUNCTION IF EXISTS {schema}.enqueue(text, jsonb, text, timestamptz, smallint, text, text, integer,
                               interval, text[]);

-- enqueue(): its current body is trioq/_sql/functions/enqueue.sql.

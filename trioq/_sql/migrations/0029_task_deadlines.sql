-- trioq schema, version 29: a task's `deadline=` reaches the jobs enqueued by name (a producer
-- that does not declare the task, the SQL `enqueue()`, another app's client, a schedule).
--
-- Each worker registers, beside max_attempts (migration 0015), the deadline its declaration
-- gives each (task, version) it serves, in seconds (NULL: none). Every insert statement gives
-- a job without a deadline of its own `enqueue time + that deadline`, with the source 'set by
-- task <name>' (queries.sql: job_insert_one, job_insert_batch, job_insert_many,
-- job_spawn_many, schedule_fire_many; the function below). It is read at insert, so the
-- deadline counts from the enqueue, as River's and Oban's insert-time options do, and the row
-- keeps it: a job enqueued before any worker registered the task keeps no deadline, and a
-- declaration changed later applies to the jobs enqueued after it. A nullable column without
-- a default rewrites no row; the CHECK reads the table's few rows once.
ALTER TABLE {schema}.task_defaults
    ADD COLUMN deadline_seconds double precision CHECK (deadline_seconds > 0);

-- task_deadline_seconds(): its current body is trioq/_sql/functions/task_deadline_seconds.sql.

-- enqueue(): its current body is trioq/_sql/functions/enqueue.sql.

-- trioq schema, version 36: one whole-row reader. Every read of a whole job (`job_get`,
-- `job_list`, the producers' `get_job`) selects from this view, so the record's column list
-- lives once: the fields of `JobRecord` (trioq/_seam/records.py), in its order, which both
-- drivers and the producers build positionally. A new field is a column appended here
-- (CREATE OR REPLACE VIEW only appends) and a field appended to the record.
-- max_attempts as the worker applies it: the row's, else its task's declaration (migration
-- 0015), else 5.
CREATE VIEW {schema}.job_records AS
SELECT j.id, j.queue, j.task, j.payload, j.state, j.priority, j.run_at, j.partition_key,
       j.dedup_key, j.attempt,
       coalesce(j.max_attempts, (SELECT d.max_attempts FROM {schema}.task_defaults d
                                 WHERE d.task = j.task AND d.version = j.version), 5)
           AS max_attempts,
       j.worker_id, j.result, j.error, j.created_at, j.started_at, j.finished_at, j.executions,
       j.deadline_at, j.deadline_source
FROM {schema}.jobs j;

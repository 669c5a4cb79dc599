-- Files a keyed jobs_live row in ready_keyed (migration 0048): the triggers
-- ready_keyed_filed_insert, ready_keyed_filed_update and ready_keyed_left call it for keyed
-- rows entering ready, leaving it (in place or out of jobs_live) or filed again while ready;
-- their WHEN clauses are checked per row without calling it, so an unkeyed row pays one
-- comparison each and never a call. An entry is found by its primary key, taken from the
-- row's old version (an exact probe, whatever the key's backlog). The upsert keeps one entry
-- per job when a row is filed again without leaving ready (a release of a keyed job whose
-- claim was taken back, a bumped `filed`).
CREATE OR REPLACE FUNCTION {schema}.ready_keyed_file() RETURNS trigger
-- (Its qualified names: see db_now; a trigger of every keyed enqueue and move into ready.)
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP OPERATOR(pg_catalog.<>) 'INSERT'
       AND OLD.phase OPERATOR(pg_catalog.=) 'ready' THEN
        DELETE FROM {schema}.ready_keyed e
        WHERE e.queue OPERATOR(pg_catalog.=) OLD.queue
          AND e.kind OPERATOR(pg_catalog.=)
              (CASE WHEN OLD.partition_key IS NOT NULL THEN 'p' ELSE 'c' END)::"char"
          AND e.key OPERATOR(pg_catalog.=) coalesce(OLD.partition_key, OLD.concurrency_key)
          AND e.priority OPERATOR(pg_catalog.=) OLD.priority
          AND e.run_at OPERATOR(pg_catalog.=) OLD.run_at
          AND e.id OPERATOR(pg_catalog.=) OLD.id;
    END IF;
    IF TG_OP OPERATOR(pg_catalog.<>) 'DELETE'
       AND NEW.phase OPERATOR(pg_catalog.=) 'ready' THEN
        INSERT INTO {schema}.ready_keyed (queue, kind, key, priority, run_at, id, filed, task,
                                          version, concurrency_limit)
        VALUES (NEW.queue,
                (CASE WHEN NEW.partition_key IS NOT NULL THEN 'p' ELSE 'c' END)::"char",
                coalesce(NEW.partition_key, NEW.concurrency_key), NEW.priority, NEW.run_at,
                NEW.id, NEW.filed, NEW.task, NEW.version, NEW.concurrency_limit)
        ON CONFLICT (queue, kind, key, priority, run_at, id)
        DO UPDATE SET filed = excluded.filed, task = excluded.task,
                      version = excluded.version,
                      concurrency_limit = excluded.concurrency_limit;
    END IF;
    RETURN NULL;
END
$$;

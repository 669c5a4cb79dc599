"""One list of a new job's fields and one insert: every writer of a job inserts it through
queries.sql's `job_insert` fragment, every writer's parameters are `NewJob`'s fields, and the
in-memory driver stores the same fields (docs/architecture.md, "Adding a job field")."""

from __future__ import annotations

import re
from importlib import resources

import attrs

from trioq import _sql
from trioq._memory.state import Row
from trioq._pg.inserts import NEW_JOB_FIELDS, insert_statement
from trioq._seam.records import NewJob, NewJobs

WRITERS = {
    "job_insert_many",
    "job_insert_batch",
    "job_insert_one",
    "schedule_fire_many",
    "job_spawn_many",
}
INSERT_INTO_JOBS = re.compile(r"INSERT INTO (\{schema\}|\"trioq\")\.job_rows\b")
# The fields new_row derives instead of storing them as given (the due time, the key's hold,
# the deadline), and the one that only tells the insert whether to read the task's deadline.
# The fields of a job with a dedup or concurrency key, which only job_insert_many takes.
KEYS = {"dedup_key", "unique_for_seconds", "unique_states", "concurrency_key", "concurrency_limit"}
DERIVED = {
    "run_at",
    "delay_seconds",
    "unique_for_seconds",
    "deadline_at",
    "deadline_seconds",
    "deadline_source",
    "task_deadline",
}


def test_the_one_insert_is_the_only_insert_into_jobs_in_the_source() -> None:
    folder = resources.files(_sql)
    sources = {"queries.sql": folder.joinpath("queries.sql").read_text()}
    for entry in folder.joinpath("functions").iterdir():
        if entry.name.endswith(".sql"):
            sources[f"functions/{entry.name}"] = entry.read_text()
    found = [
        (source, match.group(0))
        for source, text in sources.items()
        for match in INSERT_INTO_JOBS.finditer(text)
    ]
    assert found == []
    # The fragment's own line names its table by a parameter, which the pattern does not match.
    assert sources["queries.sql"].count("INSERT INTO {schema}.@target@") == 1


def test_every_writer_expands_it_and_no_other_statement_inserts_jobs() -> None:
    statements = _sql.queries("trioq")
    writers = {name for name, text in statements.items() if INSERT_INTO_JOBS.search(text)}
    assert writers == WRITERS
    enqueue = next(function for function in _sql.functions("trioq") if function.name == "enqueue")
    assert INSERT_INTO_JOBS.search(enqueue.sql)
    assert "-- include:" not in enqueue.sql


def test_no_function_file_lists_the_columns_of_a_new_job() -> None:
    """enqueue()'s rows are a fragment of queries.sql, beside every other writer's: a column
    added to jobs is given in that one file, not in a function's too."""
    folder = resources.files(_sql).joinpath("functions")
    text = folder.joinpath("enqueue.sql").read_text()
    assert "-- include: enqueue_new_jobs" in text
    assert " AS on_parent_cancel" not in text


def test_every_writer_takes_every_field_of_new_job() -> None:
    statements = _sql.positional_queries("trioq")
    fields = set(NEW_JOB_FIELDS)
    assert fields == {field.name for field in attrs.fields(NewJob)}
    for name in ("job_insert_many", "job_spawn_many"):
        assert fields <= set(statements[name].names), name
    # The fast statements take every field but the keys' (a keyed job goes to job_insert_many).
    assert set(statements["job_insert_one"].names) == fields - KEYS
    assert set(statements["job_insert_batch"].names) == fields - KEYS - {"payload_json"} | {
        "payloads"
    }


def test_every_parameter_a_statement_names_is_sent() -> None:
    statements = _sql.positional_queries("trioq")
    template = NewJob("default", "t", "{}")
    cases = [
        NewJobs(template, ["{}"]),
        NewJobs(template, ["{}", "[]"]),
        NewJobs(template, ["{}", "[]"], dedup_keys=["a", None]),
    ]
    for jobs in cases:
        name, params = insert_statement(jobs)
        assert set(statements[name].names) <= set(params), name
        assert set(params) - set(statements[name].names) <= KEYS, name


def test_the_memory_driver_stores_every_field_it_does_not_derive() -> None:
    stored = set(attrs.fields_dict(Row))
    assert set(NEW_JOB_FIELDS) - DERIVED <= stored

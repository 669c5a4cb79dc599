"""The enqueue statements' parameters and replies, shared by `PgDriver` and the producers.

Imports neither trio nor psycopg, so `trioq.producer` builds its statements without them.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from typing import Any

import attrs

from .._seam.records import InsertedJob, NewJob, NewJobs
from .replies import Inserted, InsertedBatch, InsertedOne

Params = dict[str, Any]

# The statements of the fast paths, run on the native libpq path (no thread hop).
NATIVE_INSERTS = frozenset({"job_insert_one", "job_insert_batch"})

# The one list of a new job's fields. Every insert statement names its parameters after them
# (queries.sql: new_job_options sends them as scalars, new_job_arrays as one array each), so a
# field added to `NewJob` is sent by every writer without a line here.
NEW_JOB_FIELDS: tuple[str, ...] = tuple(field.name for field in attrs.fields(NewJob))
_fields_of = operator.attrgetter(*NEW_JOB_FIELDS)


def insert_statement(jobs: Sequence[NewJob]) -> tuple[str, Params]:
    """The statement that inserts `jobs`, and its parameters (every producer sends these).

    An enqueue call without dedup or concurrency keys takes a fast path: `job_insert_one` for
    a single job (scalars only), `job_insert_batch` for a batch (its options as scalars and its
    payloads as one text[] literal: psycopg would dump a list of 20,000 payloads element by
    element, 30 ms against 2 ms). Anything else takes the full `job_insert_many`, one array
    per column.
    """
    if (
        isinstance(jobs, NewJobs)
        and jobs.dedup_keys is None
        and jobs.concurrency_keys is None
        and jobs.template.concurrency_key is None
    ):
        params = jobs.template.__dict__.copy()  # every field, by name (NewJob is not slotted)
        del params["payload_json"]  # the template's is unused: the payloads are the batch's
        params["unique_states"] = ",".join(params["unique_states"])
        if len(jobs.payloads) == 1:
            params["payload_json"] = jobs.payloads[0]
            return "job_insert_one", params
        params["payloads"] = text_array(jobs.payloads)
        return "job_insert_batch", params
    return "job_insert_many", insert_params(jobs)


def inserted_jobs(name: str, rows: Sequence[Sequence[Any]]) -> list[InsertedJob]:
    """The result rows of `insert_statement`'s statement, in the order of its jobs."""
    if name == "job_insert_batch":  # one row: the ids in payload order, as one array
        # map over zip: half the time of a comprehension of calls (3.5 ms for 20,000 ids)
        ids = rows[0][InsertedBatch.ids]
        return list(map(InsertedJob._make, zip(ids, itertools.repeat(True))))
    if name == "job_insert_one":
        return [InsertedJob(row[InsertedOne.id], True) for row in rows]
    return [InsertedJob(id=row[Inserted.id], created=row[Inserted.created]) for row in rows]


def insert_params(jobs: Sequence[NewJob]) -> Params:
    """One array per field of `NewJob` (new_job_arrays in queries.sql)."""
    # One C-level attrgetter call per job and one transpose: a NewJobs batch builds its rows
    # on iteration, so they are built once, not once per field.
    columns = list(zip(*map(_fields_of, jobs), strict=True)) or [()] * len(NEW_JOB_FIELDS)
    params = {name: list(column) for name, column in zip(NEW_JOB_FIELDS, columns, strict=True)}
    params["unique_states"] = [",".join(states) for states in params["unique_states"]]
    return params


def text_array(values: Sequence[str]) -> str:
    """A text[] literal: every element double-quoted, backslashes and quotes escaped."""
    return "{" + ",".join([quoted(value) for value in values]) + "}"


def quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

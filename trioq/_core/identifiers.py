"""Identifier rules: schema, queue and task names are validated before they reach SQL.

The same patterns are enforced by the schema (the jobs table's queue and task columns are
domains with a CHECK, migration 0032), so a raw INSERT with a bad name is rejected by Postgres
too.
"""

from __future__ import annotations

import re

# Schemas become part of statements (quoted); keep them to plain lower-case identifiers. At most
# 53 characters: notification channels are `<schema>_result_63` and pg_notify() rejects channel
# names over 63 bytes. `pg_` is reserved by PostgreSQL for system schemas.
SCHEMA_PATTERN = re.compile(r"(?!pg_)[a-z_][a-z0-9_]{0,52}")
# Queues and tasks are data, never interpolated; still keep them printable and bounded.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,127}")
# Keys are opaque user data (partition and dedup keys), only bounded in length.
MAX_KEY_LENGTH = 512


def validate_schema(name: object) -> str:
    """Return `name` if it is a valid schema name, else raise ValueError naming the field."""
    if not isinstance(name, str) or not SCHEMA_PATTERN.fullmatch(name):
        raise ValueError(
            f"schema: {name!r} is not a valid schema name "
            f"(lower-case letters, digits and '_', starting with a letter or '_', not with "
            f"'pg_', at most 53 characters)"
        )
    return name


def validate_name(field: str, name: object) -> str:
    """Validate a queue or task name; the error names `field`."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"{field}: {name!r} is not a valid name (letters, digits and '_.:-', "
            f"not starting with punctuation, 1 to 128 characters)"
        )
    return name


def validate_key(field: str, key: object) -> str | None:
    """Validate an optional partition or dedup key."""
    if key is None:
        return None
    if (
        not isinstance(key, str)
        or not key
        or len(key) > MAX_KEY_LENGTH
        or "\x00" in key
        or not _is_encodable(key)
    ):
        raise ValueError(
            f"{field}: {key!r} must be a non-empty string of at most {MAX_KEY_LENGTH} "
            f"characters without NUL or lone surrogates"
        )
    return key


MAX_JOB_ID = 2**63 - 1  # bigint


def validate_job_id(job_id: object, field: str = "job_id") -> int:
    """Return `job_id` if it is a job id (a positive int in bigint range), else raise ValueError
    naming the field: a string, None or a float never reaches the driver."""
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not 1 <= job_id <= MAX_JOB_ID:
        raise ValueError(f"{field}: {job_id!r} is not a job id (a positive integer)")
    return job_id


def _is_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def quote_ident(name: str) -> str:
    """Quote an already validated schema name for inclusion in a statement."""
    validate_schema(name)
    return '"' + name + '"'


PREPARED_STATEMENTS = ("auto", "off")


def validate_prepared_statements(value: object) -> str:
    """`prepared_statements` of App, the producers and the CLI: "auto", or "off" behind a
    transaction pooler (see docs/operations.md)."""
    if value not in PREPARED_STATEMENTS:
        raise ValueError(
            f"prepared_statements: {value!r} must be 'auto' or 'off' ('off' behind a "
            f"transaction pooler: PgBouncer, RDS Proxy, Supavisor)"
        )
    return str(value)

"""`trioq/_sql/schema.sql`: the database as `trioq migrate` leaves it, read with `pg_dump`; and
`trioq/_sql/hot_statements.sql`: the hot path's statements as PgDriver sends them.

    python -m tests.schema_snapshot        # rewrite both from this checkout

`tests/test_schema_snapshot.py` fails when the file differs from what `migrate` produces (a
migration or function changed without the snapshot), and when a database migrated by the
previous release and then by this one differs from a fresh one.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import trio

import trioq
from trioq._sql import positional_queries
from trioq.embedded import EmbeddedPostgres, find_postgres_bindir

SNAPSHOT = Path(__file__).resolve().parent.parent / "trioq" / "_sql" / "schema.sql"
HOT_STATEMENTS = SNAPSHOT.with_name("hot_statements.sql")
# The statements of a job's life on a queue: enqueue (one, a batch, with dedup keys), the claim
# in its plain and full forms, the completer's settles, the lease renewal, workflow checkpoints.
HOT = (
    "job_insert_one",
    "job_insert_batch",
    "job_insert_many",
    "job_claim_plain",
    "job_claim",
    "job_claim_rated",
    "job_complete_plain",
    "job_settle_many",
    "lease_renew_many",
    "checkpoint_insert_many_plain",
    "checkpoint_insert_many",
)
SCHEMA = "trioq"  # the name the snapshot shows (a dump of another schema is renamed to it)
HEADER = (
    "-- The database as `trioq migrate` leaves it (schema `trioq`), from `pg_dump --schema-only`.\n"
    "-- Generated: `python -m tests.schema_snapshot`; tests/test_schema_snapshot.py checks it.\n"
)


def dump(conninfo: str, schema: str) -> str:
    """`schema`'s definitions as pg_dump prints them, normalized: the dump's version header
    and session settings dropped, and the schema named `trioq`."""
    pg_dump = find_postgres_bindir() / "pg_dump"
    text = subprocess.run(
        [str(pg_dump), "--schema-only", "--no-owner", "--no-privileges", "--schema", schema,
         # The day partitions of finished jobs are named by the date migrate ran on
         # (job_history_rotate): left out, as data is.
         "--exclude-table", f"{schema}.jobs_d[0-9]*", "--dbname", conninfo],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout  # fmt: skip
    # pg_dump's own lines: its version, session settings, the per-object "-- Name:" banners
    # (the statements name their objects) and, from 15.14, a random \restrict key per dump.
    noise = ("-- Dumped ", "-- Name: ", "-- PostgreSQL database dump", "SET ", "\\restrict ")
    noise += ("\\unrestrict ", "SELECT pg_catalog.set_config(")
    kept = [line for line in text.splitlines() if line != "--" and not line.startswith(noise)]
    body = re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip() + "\n"
    # Also inside names (the channel prefixes `<schema>_ready_`): a test's schema is a random
    # name that appears nowhere else.
    body = body.replace(schema, SCHEMA)
    return HEADER + "\n" + body


def hot_statements() -> str:
    """The hot statements as sent for schema `trioq` (includes expanded, comments and
    indentation dropped, `$n` placeholders), each under its name and its parameters' names."""
    statements = positional_queries(SCHEMA)
    parts = [
        "-- The hot path's statements exactly as PgDriver sends them (schema `trioq`):\n"
        "-- queries.sql's blocks with their includes expanded, comments and indentation dropped,\n"
        "-- parameters as $n. Generated: `python -m tests.schema_snapshot`;\n"
        "-- tests/test_schema_snapshot.py checks it. queries.sql says why each is as it is.\n"
    ]
    for name in HOT:
        statement = statements[name]
        names = ", ".join(f"${n} {param}" for n, param in enumerate(statement.names, 1))
        text = statement.text.decode().rstrip().rstrip(";")
        parts.append(f"-- name: {name} ({len(statement.text)} bytes; {names})\n{text};\n")
    return "\n".join(parts)


async def migrate(conninfo: str, schema: str) -> None:
    async with trioq.App(conninfo, schema=schema).client(migrate=True):
        pass


def main() -> None:
    with EmbeddedPostgres() as cluster:
        trio.run(migrate, cluster.conninfo, SCHEMA)
        SNAPSHOT.write_text(dump(cluster.conninfo, SCHEMA))
    HOT_STATEMENTS.write_text(hot_statements())
    print(f"wrote {SNAPSHOT} and {HOT_STATEMENTS}")


if __name__ == "__main__":
    main()

"""Classifying psycopg errors: which ones mean "the connection is gone"."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import attrs
import psycopg

from .._core.errors import DedupKeyConflict, SchemaNotMigrated

# SQLSTATEs whose error means the session ended (or never started) although the client did nothing
# wrong: retrying on a fresh connection is the right reaction. Class 08 is matched by prefix.
_SESSION_ENDED_SQLSTATES = frozenset(
    {
        "57P01",  # admin_shutdown: pg_terminate_backend, smart/fast shutdown
        "57P02",  # crash_shutdown: another backend crashed, the server is restarting
        "57P03",  # cannot_connect_now: the server is starting up or shutting down
        "57P05",  # idle_session_timeout (PG >= 14)
        "25P03",  # idle_in_transaction_session_timeout: the server closed the session
        "53300",  # too_many_connections: only ever raised while connecting
    }
)


# The constraint name trioq's dedup_key_refuse() raises its unique violation with.
DEDUP_KEY_HELD_BY_ANOTHER_TASK = "dedup_key_held_by_another_task"


def dedup_key_conflict(exc: BaseException) -> DedupKeyConflict | None:
    """The trioq error of an enqueue refused because another task's job holds its dedup key
    (None: `exc` is something else)."""
    if (
        isinstance(exc, psycopg.errors.UniqueViolation)
        and exc.diag.constraint_name == DEDUP_KEY_HELD_BY_ANOTHER_TASK
    ):
        return DedupKeyConflict(exc.diag.message_primary or str(exc))
    return None


def is_connection_lost(exc: BaseException) -> bool:
    """True if `exc` means the connection is gone (or could not be opened) rather than that the
    statement was wrong: the statement may or may not have run, the connection must be replaced,
    and an idempotent statement can be retried on a new one.

    That is a `psycopg.OperationalError` raised by the client itself (no SQLSTATE: "connection
    failed", "server closed the connection unexpectedly", "the connection is closed", a COMMIT that
    timed out), any SQLSTATE of class 08 (connection exception), or admin/crash shutdown (57P01,
    57P02), "cannot connect now" (57P03), the server's session timeouts (57P05, 25P03) and
    "too many connections" (53300). Other `OperationalError`s such as `QueryCanceled` (57014),
    `LockNotAvailable` (55P03) or `DeadlockDetected` (40P01) leave the connection usable and are
    *not* connection losses.
    """
    if not isinstance(exc, psycopg.OperationalError):
        return False
    sqlstate = exc.sqlstate
    if sqlstate is None:
        return True
    return sqlstate.startswith("08") or sqlstate in _SESSION_ENDED_SQLSTATES


# How often a statement runs again when a row it waited for was moved to another partition of
# `jobs` by the transaction it waited on (a job finishing under a lease renewal, a result
# watch or a cancel: migration 0038). READ COMMITTED cannot follow the row there (SQLSTATE
# 40001, "tuple to be locked was already moved to another partition"); run as its own
# transaction, the statement rolled back whole, so running it again sees the row where it
# went. Inside a caller's transaction the error is the caller's (docs/api.md, "Transactions").
MOVED_ROW_ATTEMPTS = 5


def is_moved_row(exc: BaseException) -> bool:
    """Whether `exc` is a statement that waited for a row another transaction moved."""
    return isinstance(exc, psycopg.errors.SerializationFailure)


# Errors after which the server rolled the statement back whole and the connection is still
# usable: nothing it wrote is kept, and it may run again.
_ROLLED_BACK_SQLSTATES = frozenset(
    {
        "57014",  # query_canceled: statement_timeout, or pg_cancel_backend
        "55P03",  # lock_not_available: lock_timeout
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
    }
)


def is_transient(exc: BaseException) -> bool:
    """True if the server rolled the statement back for a reason that passes (a statement or
    lock timeout, a cancel request, a deadlock, a serialization failure): the connection is
    usable, nothing the statement wrote is kept, and it may be sent again."""
    return isinstance(exc, psycopg.Error) and exc.sqlstate in _ROLLED_BACK_SQLSTATES


# Where a URL came from, for the fix's wording: the CLI's flag, or a producer's argument.
CLI_URL = "--database-url or TRIOQ_DATABASE_URL"
PRODUCER_URL = "the producer's conninfo or TRIOQ_DATABASE_URL"
_POOLER_FIX = (
    'behind a transaction pooler, use --prepared-statements off (prepared_statements="off" '
    "on App and the producers)"
)


@attrs.frozen
class ConnectionProblem:
    """Why the database cannot be used, in one line naming the fix, and whether waiting could
    fix it (`permanent`: a URL, database, role, password or pooler setting that cannot work)."""

    permanent: bool
    message: str


@attrs.frozen
class _Failure:
    pattern: re.Pattern[str]
    permanent: bool
    template: str  # {0}...: the pattern's groups; {where}: where the URL came from


def _failure(pattern: str, permanent: bool, template: str) -> _Failure:
    return _Failure(re.compile(pattern), permanent, template)


# libpq's and PgBouncer's messages (English; stable across versions): the one mapping from a
# connection error to its line, used by the CLI, the worker's start and both producers.
_CONNECT_FAILURES: tuple[_Failure, ...] = (
    _failure(
        r'database "([^"]+)" does not exist|no such database: (\S+)',
        True,
        "database {0!r} does not exist: create it (createdb {0}) or fix {where}",
    ),
    _failure(
        r'role "([^"]+)" does not exist',
        True,
        "role {0!r} does not exist: create it (createuser {0}) or fix the user in the URL",
    ),
    _failure(
        r'password authentication failed for user "([^"]+)"',
        True,
        "password authentication failed for user {0!r}: fix the password in the URL",
    ),
    _failure(
        r'"([\w-]+)" authentication failed|(SASL) authentication failed',
        True,
        "{0} authentication failed: fix the user or password in the URL (behind PgBouncer: "
        "its auth_file)",
    ),
    _failure(
        r'no pg_hba\.conf entry for host "([^"]+)"',
        True,
        "the server's pg_hba.conf admits no connection from host {0!r} with this user and "
        "database: add a line for it, or fix {where}",
    ),
    _failure(
        r"unsupported startup parameter: (\S+)",
        True,
        "the server (a pooler?) refuses the startup parameter {0!r}: " + _POOLER_FIX + ", "
        "which sends none, and take {0!r} out of the URL and PGOPTIONS",
    ),
    _failure(
        r'prepared statement "([^"]+)" (?:does not exist|already exists)'
        r"|bind message supplies \d+ parameters, but prepared statement \"([^\"]*)\"",
        True,
        "prepared statement {0!r} is missing or taken on this server connection: " + _POOLER_FIX,
    ),
    _failure(
        r"failed to resolve host '([^']+)'",
        False,
        "cannot resolve host {0!r}: fix the host in the URL",
    ),
)


# A named prepared statement the session lost (26000), found taken (42P05) or found to be
# another client's (08P01 "bind message supplies..."): what a transaction pooler does to a
# session that prepares. Each fails before the statement runs, so running it again is safe.
_LOST_STATEMENT = re.compile(
    r'prepared statement "[^"]*" (?:does not exist|already exists)'
    r'|bind message supplies \d+ parameters, but prepared statement "[^"]*"'
)


def is_lost_prepared_statement(exc: BaseException) -> bool:
    """True if `exc` says a named prepared statement is missing or not this session's own:
    a transaction pooler (PgBouncer in transaction mode) in front of a session that prepares."""
    return (
        isinstance(exc, psycopg.Error)
        and exc.sqlstate in ("26000", "42P05", "08P01")
        and _LOST_STATEMENT.search(str(exc)) is not None
    )


def schema_problem(exc: BaseException, schema: str) -> str | None:
    """One line naming `trioq migrate` when `exc` says the schema is missing, or older than
    this trioq (a producer or worker of a newer release pointed at a schema nobody migrated:
    a column, function or type of a later migration is missing); None otherwise."""
    fix = f"run `trioq migrate --schema {schema}`"
    missing = (exc.diag.message_primary or "") if isinstance(exc, psycopg.Error) else ""
    # A schema without `jobs` was never migrated; one that has it but lacks another relation
    # (a view or table a later migration adds) is older than this trioq.
    if isinstance(exc, psycopg.errors.InvalidSchemaName) or (
        isinstance(exc, psycopg.errors.UndefinedTable) and _names_relation(missing, "jobs")
    ):
        return f"schema {schema!r} has no trioq tables ({missing}): {fix}"
    if isinstance(
        exc,
        psycopg.errors.UndefinedTable
        | psycopg.errors.UndefinedColumn
        | psycopg.errors.UndefinedFunction
        | psycopg.errors.UndefinedObject,
    ):
        return (
            f"schema {schema!r} is older than this trioq ({exc.diag.message_primary}): {fix} "
            "with this release"
        )
    return None


def _names_relation(message: str, table: str) -> bool:
    """Whether PostgreSQL's `relation "x.table" does not exist` names `table` (or the message
    names no relation: then nothing says the schema holds trioq tables)."""
    found = re.search(r'relation "([^"]+)"', message)
    return found is None or found[1].rsplit(".", 1)[-1] == table


def migration_refused(exc: BaseException, schema: str, role: str, database: str) -> str | None:
    """One line naming the fix when `trioq migrate` lacks a privilege (a worker's or
    producer's role, or one without CREATE on the database); None for any other error."""
    if not isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return None
    cause = _first_line(exc)
    if "for database" in cause:
        fix = (
            f"GRANT CREATE ON DATABASE {database} TO {role}, or have a superuser run CREATE "
            f"SCHEMA {schema} AUTHORIZATION {role} first"
        )
    else:
        fix = (
            f"run it as the role that owns schema {schema!r} (the owner role of "
            "docs/operations.md, \"Roles: least privilege\"), not a worker's or producer's"
        )
    return f"trioq migrate as role {role!r} was refused ({cause}): {fix}"


def connection_problem(exc: BaseException, where: str = CLI_URL) -> ConnectionProblem | None:
    """What is wrong when `exc` is about reaching or using the database (see
    `ConnectionProblem`), or None when it is not. `where` names where the URL came from."""
    if isinstance(exc, psycopg.ProgrammingError) and _is_conninfo_error(str(exc)):
        return ConnectionProblem(
            True,
            f"the database URL is not valid ({redact_conninfo_error(_first_line(exc))}): fix "
            f"{where} (postgresql://USER:PASSWORD@HOST:PORT/DATABASE, special characters in "
            "the password percent-encoded)",
        )
    if not isinstance(exc, psycopg.Error):
        return None
    text = str(exc)
    for failure in _CONNECT_FAILURES:
        match = failure.pattern.search(text)
        if match:
            groups = [group for group in match.groups() if group is not None]
            return ConnectionProblem(
                failure.permanent, failure.template.format(*groups, where=where)
            )
    if not is_connection_lost(exc):
        return None
    return ConnectionProblem(
        False, f"cannot connect to PostgreSQL ({_first_line(exc)}): start it, or fix {where}"
    )


def describe_database_error(exc: BaseException, where: str = CLI_URL) -> str | None:
    """One line naming why the database could not be used and the fix, or None when `exc` is
    not about reaching the database (the CLI prints this instead of a traceback)."""
    problem = connection_problem(exc, where)
    return None if problem is None else problem.message


def is_unreachable(exc: BaseException) -> bool:
    """The server could not be reached right now (worth retrying), as opposed to a URL,
    database, role, password or pooler setting that cannot work."""
    problem = connection_problem(exc)
    return problem is not None and not problem.permanent and is_connection_lost(exc)


def _is_conninfo_error(text: str) -> bool:
    return any(
        part in text
        for part in (
            "connection info string",
            "invalid connection option",
            "URI",
            "dsn",
            "percent-encoded",
            "IPv6",
            'missing "="',
        )
    )


def redact_conninfo_error(text: str) -> str:
    """libpq's message about a URL it cannot parse, without the part of the URL it quotes: that
    part may be the password (a bad `%` escape) or the whole URI (a bad IPv6 bracket), and the
    message reaches logs, terminals and exceptions raised to web apps."""
    return re.sub(r'"[^"]*"', '"..."', text)


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


@contextlib.contextmanager
def schema_required(schema: str) -> Iterator[None]:
    """Around a statement of trioq's (driver and producers alike): a missing table or schema,
    or a column, function or type of a later migration, means "not migrated", said with the fix
    (`schema_problem`); an enqueue refused for a dedup key of another task's job is
    `DedupKeyConflict`."""
    try:
        yield
    except psycopg.errors.ProgrammingError as exc:
        problem = schema_problem(exc, schema)
        if problem is None:
            raise
        raise SchemaNotMigrated(problem) from exc
    except psycopg.errors.UniqueViolation as exc:
        conflict = dedup_key_conflict(exc)
        if conflict is None:
            raise
        raise conflict from exc

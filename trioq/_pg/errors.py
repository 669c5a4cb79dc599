"""Classifying psycopg errors: which ones mean "the connection is gone"."""

from __future__ import annotations

import re

import psycopg

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


_FIX_URL = "fix --database-url or TRIOQ_DATABASE_URL"


def describe_database_error(exc: BaseException) -> str | None:
    """One line naming why the database could not be used and the fix, or None when `exc` is
    not about reaching the database (the CLI prints this instead of a traceback)."""
    if isinstance(exc, psycopg.ProgrammingError) and _is_conninfo_error(str(exc)):
        return f"the database URL is not valid ({_first_line(exc)}): {_FIX_URL}"
    if not isinstance(exc, psycopg.OperationalError):
        return None
    for needle, fix in _CONNECT_FAILURES:
        match = re.search(needle, str(exc))
        if match:
            return fix.format(*match.groups())
    if not is_connection_lost(exc):
        return None
    return f"cannot connect to PostgreSQL ({_first_line(exc)}): start it, or {_FIX_URL}"


def _is_conninfo_error(text: str) -> bool:
    return any(
        part in text
        for part in ("connection info string", "invalid connection option", "invalid URI", "dsn")
    )


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


# libpq's messages (English; they are stable across versions): pattern -> what to do.
_CONNECT_FAILURES: tuple[tuple[str, str], ...] = (
    (
        r'database "([^"]+)" does not exist',
        "database {0!r} does not exist: create it (createdb {0}) or " + _FIX_URL,
    ),
    (
        r'role "([^"]+)" does not exist',
        "role {0!r} does not exist: create it (createuser {0}) or fix the user in the URL",
    ),
    (
        r'password authentication failed for user "([^"]+)"',
        "password authentication failed for user {0!r}: fix the password in the URL",
    ),
    (r"failed to resolve host '([^']+)'", "cannot resolve host {0!r}: fix the host in the URL"),
)


def is_unreachable(exc: BaseException) -> bool:
    """The server could not be reached right now (worth retrying), as opposed to a URL, database,
    role or password that cannot work."""
    if not isinstance(exc, psycopg.OperationalError) or not is_connection_lost(exc):
        return False
    text = str(exc)
    return not any(re.search(needle, text) for needle, _ in _CONNECT_FAILURES[:3])

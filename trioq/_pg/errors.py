"""Classifying psycopg errors: which ones mean "the connection is gone"."""

from __future__ import annotations

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

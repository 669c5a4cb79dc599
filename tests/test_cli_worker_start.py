"""`trioq worker` start-up: a database that goes away between "reachable" and "worker
running" (a restart racing the start) makes the command wait and start again instead of exiting;
fault test 11 of the suite restarts PostgreSQL while supervised workers start."""

from __future__ import annotations

import psycopg

from trioq.cli.worker import StopRecord, lost_database_while_starting

SHUTTING_DOWN = psycopg.OperationalError(
    'connection failed: connection to server on socket "/tmp/x/.s.PGSQL.5432" failed: '
    "FATAL:  the database system is shutting down"
)


def test_database_lost_while_starting_is_waited_for_not_fatal() -> None:
    record = StopRecord()
    assert lost_database_while_starting(SHUTTING_DOWN, record)
    assert lost_database_while_starting(ExceptionGroup("start", [SHUTTING_DOWN]), record)


def test_errors_after_start_or_of_another_kind_still_end_the_command() -> None:
    assert not lost_database_while_starting(SHUTTING_DOWN, StopRecord(started=True))
    assert not lost_database_while_starting(ValueError("queue: bad"), StopRecord())
    mixed = ExceptionGroup("start", [SHUTTING_DOWN, ValueError("health port busy")])
    assert not lost_database_while_starting(mixed, StopRecord())
    bad_password = psycopg.OperationalError(
        'connection failed: FATAL:  password authentication failed for user "bob"'
    )
    assert not lost_database_while_starting(bad_password, StopRecord())

"""How the `trioq` command ends: one line naming the cause and the fix, and a documented exit
code (docs/cli.md). The full traceback is printed only with `-v`.

| code | meaning |
|---|---|
| 0 | success |
| 1 | what was asked for does not exist or could not change (a job id, a retry refused) |
| 2 | usage or configuration: bad arguments, APP_PATH, JSON, payload, option, busy port |
| 3 | the database: unreachable, bad URL, missing database or role, schema not migrated |
| 4 | the worker was stopped by a second signal and abandoned running jobs |
| 130 | interrupted (Ctrl-C) outside a worker's drain |
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import traceback

from .._core.errors import JobNotFound, MigrationLockTimeout, SchemaNotMigrated, TrioqError

OK = 0
NOT_DONE = 1
USAGE = 2
DATABASE = 3
ABANDONED = 4
INTERRUPTED = 130


class UsageError(TrioqError, ValueError):
    """A command-line value that does not work (raised before anything runs)."""


class PortInUse(UsageError):
    """`--health-port` is taken by another process."""


def leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, in order."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


def explain(error: BaseException) -> tuple[int, str]:
    """The exit code and the one line for an exception that ended a command."""
    from .._pg.errors import describe_database_error  # psycopg stays behind the seam

    database = describe_database_error(error)
    if database is not None:
        return DATABASE, database
    if isinstance(error, SchemaNotMigrated | MigrationLockTimeout):
        return DATABASE, str(error)
    if isinstance(error, JobNotFound):
        return NOT_DONE, str(error)
    if isinstance(error, OSError) and error.errno == errno.EADDRINUSE:
        return USAGE, f"address already in use ({error}): choose another --health-port"
    if isinstance(error, ValueError | LookupError | TrioqError):
        return USAGE, str(error)
    return NOT_DONE, f"unexpected {type(error).__name__}: {error} (run with -v for the traceback)"


def report(error: BaseException, *, verbose: bool) -> int:
    """Print why the command failed (the traceback first with `-v`); return its exit code."""
    found = leaves(error)
    if any(isinstance(leaf, KeyboardInterrupt) for leaf in found):
        return INTERRUPTED
    if found and all(isinstance(leaf, BrokenPipeError) for leaf in found):
        return _reader_went_away()
    if verbose:
        traceback.print_exception(error, file=sys.stderr)
    codes = []
    for leaf in found:
        code, line = explain(leaf)
        codes.append(code)
        print(f"trioq: {line}", file=sys.stderr)
    return max(codes)


def _reader_went_away() -> int:
    """Our stdout's reader closed the pipe (`trioq job 7 | head -1`): not a failure of the
    command. Quietly, as `git log | head` ends: stdout goes to /dev/null so that the
    interpreter's flush at exit does not raise (and print) again."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 0

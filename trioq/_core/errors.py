"""Exceptions raised by trioq (re-exported from `trioq`)."""

from __future__ import annotations


class TrioqError(Exception):
    """Base class of trioq's own errors."""


class PayloadError(TrioqError, ValueError):
    """A payload or result is not JSON trioq can store; the message names the field path."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"payload {path}: {reason}")
        self.path = path
        self.reason = reason


class SchemaNotMigrated(TrioqError):
    """trioq's tables are missing from the schema: run `trioq migrate`."""


class UnknownTask(TrioqError, LookupError):
    """No task of that name is registered with the app."""


class JobNotFound(TrioqError, LookupError):
    """No job with that id exists (it may have been pruned)."""


class ResultTimeout(TrioqError, TimeoutError):
    """wait_result gave up before the job reached a final state."""


class JobFailed(TrioqError):
    """The awaited job ended failed or cancelled; `job` holds its final record."""

    def __init__(self, message: str, job: object) -> None:
        super().__init__(message)
        self.job = job

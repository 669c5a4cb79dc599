"""Exceptions raised by trioq (re-exported from `trioq`)."""

from __future__ import annotations


class TrioqError(Exception):
    """Base class of trioq's own errors."""


class ConfigurationError(TrioqError):
    """The app is missing something it needs (a database URL, an open client)."""


class ProducerError(TrioqError):
    """A producer cannot do what was asked (no database URL, a statement this schema lacks)."""


class ProducerConnectionError(ProducerError):
    """Opening a producer found the database unusable; the message is one line naming the cause
    and the fix (the CLI's texts). `permanent`: waiting cannot fix it (a bad URL, a missing
    database or role, bad authentication, a pooler refusing a startup parameter)."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


class PayloadError(TrioqError, ValueError):
    """A payload or result is not JSON trioq can store; the message names the field path."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"payload {path}: {reason}")
        self.path = path
        self.reason = reason


class DedupKeyConflict(TrioqError, ValueError):
    """An enqueue's dedup key is held by a job of another task. Dedup keys are global (across
    tasks and queues: neither is a tenant boundary), so the enqueue is refused instead of
    returning that job and its result; put the task (or the tenant) in the key."""


def dedup_key_conflict_message(key: str, task: str, holder_id: int, holder_task: str) -> str:
    """The one line both drivers and the SQL `enqueue()` raise (trioq/_sql/functions/
    dedup_key_refuse.sql writes the same text)."""
    return (
        f"dedup_key {_quoted(key)} is held by job {holder_id} of task {_quoted(holder_task)}, "
        f"not {_quoted(task)}: dedup keys are global across tasks and queues (put the task in "
        "the key)"
    )


def _quoted(text: str) -> str:
    """As PostgreSQL's quote_literal writes it (format's %L) for a key without a backslash."""
    return "'" + text.replace("'", "''") + "'"


class SchemaNotMigrated(TrioqError):
    """trioq's tables are missing from the schema: run `trioq migrate`."""


class MigrationLockTimeout(TrioqError):
    """`trioq migrate` gave up waiting for a lock another session held (see its message)."""


class UnknownTask(TrioqError, LookupError):
    """No task of that name is registered with the app."""


class UnservedTaskWarning(UserWarning):
    """A producer enqueued a task name that no declaration it was given knows and no live
    worker serves: a misspelt name, or a worker not started yet (`strict=True`: an error)."""


class JobNotFound(TrioqError, LookupError):
    """No job with that id exists (it may have been pruned)."""


class JobFinished(TrioqError):
    """The job is final (completed, failed or cancelled): it receives no more messages."""


class ValueNotSet(TrioqError, LookupError):
    """`client.get_value`: the workflow has not set that key (within the wait, if any)."""


class ResultTimeout(TrioqError, TimeoutError):
    """wait_result gave up before the job reached a final state."""


class JobFailed(TrioqError):
    """The awaited job ended failed or cancelled; `job` holds its final record (for a child
    awaited by a workflow: its id, state, result and stored error)."""

    def __init__(self, message: str, job: object) -> None:
        super().__init__(message)
        self.job = job

    @property
    def error(self) -> object:
        """The awaited job's stored error (type, message, traceback)."""
        return getattr(self.job, "error", None)


class EventTimeout(TrioqError, TimeoutError):
    """`ctx.wait_for_event` reached its deadline before the event was emitted. Recorded in the
    job's history, so every replay raises it again at the same point."""

    def __init__(self, key: str) -> None:
        super().__init__(f"event {key!r} was not emitted before the wait's deadline")
        self.key = key


class NondeterminismError(TrioqError):
    """A workflow's code reached a durable primitive that does not match its stored history
    (another kind or name at that position). The job fails with it; after fixing the code,
    `client.retry(job_id)` re-runs it against the same history."""

    def __init__(self, position: int, recorded: tuple[str, str], reached: tuple[str, str]) -> None:
        super().__init__(
            f"history position {position}: recorded {recorded[0]} {recorded[1]!r}, but the code "
            f"now reaches {reached[0]} {reached[1]!r} (the workflow changed under a running job; "
            f"fix the code or version the task, then `trioq retry`)"
        )
        self.position = position
        self.recorded = recorded
        self.reached = reached


class HistoryLimitExceeded(TrioqError):
    """A workflow reached its task's `history_limit` of checkpoints. It fails for good (a retry
    would replay the same history into the same limit): a workflow that loops must call
    `ctx.continue_as_new(payload)` to start afresh with an empty history."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the workflow reached its history limit of {limit} checkpoints: call "
            f"ctx.continue_as_new(payload) to carry its state into a fresh history (or raise "
            f"the task's history_limit)"
        )
        self.limit = limit

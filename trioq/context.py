"""What a handler sees: `ctx.job` (who am I) and the worker it runs in."""

from __future__ import annotations

import datetime
import logging
import uuid

import attrs


@attrs.frozen
class JobInfo:
    id: int
    task: str
    queue: str
    attempt: int
    max_attempts: int
    partition_key: str | None
    priority: int
    created_at: datetime.datetime
    version: int = 1  # the handler version this job was enqueued for


class Context:
    """Passed to every handler as its first argument.

    `job` describes the attempt being run. `logger` carries the job id, attempt and worker id in
    every record (`extra`); it is built on first use, so handlers that do not log pay nothing.
    Durable workflow primitives (steps, sleeps, waits) will hang off this object; they are not
    part of this release.
    """

    __slots__ = ("_logger", "job", "worker_id")

    def __init__(self, job: JobInfo, worker_id: uuid.UUID) -> None:
        self.job = job
        self.worker_id = worker_id
        self._logger: logging.LoggerAdapter[logging.Logger] | None = None

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        if self._logger is None:
            self._logger = logging.LoggerAdapter(
                logging.getLogger(f"trioq.task.{self.job.task}"),
                {
                    "job_id": self.job.id,
                    "attempt": self.job.attempt,
                    "worker_id": str(self.worker_id),
                },
            )
        return self._logger

    def __repr__(self) -> str:
        return f"Context(job={self.job!r}, worker_id={self.worker_id!r})"

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


@attrs.frozen
class Context:
    """Passed to every handler as its first argument.

    `job` describes the attempt being run. `logger` carries the job id and attempt in every
    record (`extra`). Durable workflow primitives (steps, sleeps, waits) will hang off this
    object; they are not part of this release.
    """

    job: JobInfo
    worker_id: uuid.UUID
    logger: logging.LoggerAdapter[logging.Logger]

"""Logging: two loggers and two formats.

- `trioq.jobs`: one line per failed attempt (retried, failed for good), carrying job id,
  attempt, task, queue, worker id, trace id and error type as fields. The stored attempt row
  (`attempts`, keyed by job id and attempt) is the source of truth; the line names it.
- `trioq.worker`: the worker loop's own warnings (lost leases, listener down, reconnects,
  admission changes), so alerting on job failures and on worker health stay separate.

`--log-format json` prints one JSON object per line (the fields above as keys, plus ts,
level, logger, message, and exception text when there is one); `text` the classic line.
The standard library's logging does this well; only the JSON formatter is ours (a few lines,
no dependency).
"""

from __future__ import annotations

import datetime
import json
import logging
import uuid
from typing import Any

JOB_LOGGER = "trioq.jobs"
WORKER_LOGGER = "trioq.worker"
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
JOB_FIELDS = ("job_id", "attempt", "task", "queue", "worker_id", "trace_id", "error_type")
EXTRA_FIELDS = (*JOB_FIELDS, "max_attempts", "outcome", "retry_in", "reason")

job_log = logging.getLogger(JOB_LOGGER)


class TextFormatter(logging.Formatter):
    """The classic line, kept to one line per record: a message with line breaks (psycopg's
    `...failed: Connection refused\n\tIs the server running...`) is joined with spaces, so
    grep and a line-based collector see one record as one line. A traceback (`exc_info`)
    still follows on its own lines."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        if "\n" in record.message:
            record.message = " ".join(line.strip() for line in record.message.splitlines())
        return super().formatMessage(record)


def text_handler() -> logging.Handler:
    handler = logging.StreamHandler()
    handler.setFormatter(TextFormatter())
    return handler


class JsonFormatter(logging.Formatter):
    """One JSON object per record; trioq's structured fields become top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in EXTRA_FIELDS:
            if field in record.__dict__:
                entry[field] = record.__dict__[field]
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(log_format: str, level: int | str) -> None:
    if log_format not in FORMATS:
        raise ValueError(f"--log-format: must be one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def log_job_failure(
    *,
    job_id: int,
    attempt: int,
    max_attempts: int,
    task: str,
    queue: str,
    worker_id: uuid.UUID,
    error_type: str,
    message: str,
    retry_in: float | None,
    trace_id: str | None = None,
) -> None:
    """The failure line of one attempt (INFO when retried, WARNING when final)."""
    fields = {
        "job_id": job_id,
        "attempt": attempt,
        "max_attempts": max_attempts,
        "task": task,
        "queue": queue,
        "worker_id": str(worker_id),
        "trace_id": trace_id,
        "error_type": error_type,
        "outcome": "failed" if retry_in is None else "retried",
        "retry_in": None if retry_in is None else round(retry_in, 3),
    }
    then = "failed for good" if retry_in is None else f"failed, retry in {retry_in:.2f}s"
    job_log.log(
        logging.WARNING if retry_in is None else logging.INFO,
        "job %d attempt %d/%d %s: %s: %s (task=%s queue=%s worker=%s trace=%s; "
        "attempts row job_id=%d attempt=%d)",
        job_id, attempt, max_attempts, then, error_type, message, task, queue, worker_id,
        trace_id or "-", job_id, attempt,
        extra=fields,
    )  # fmt: skip


__all__ = ["JOB_LOGGER", "WORKER_LOGGER", "JsonFormatter", "configure_logging", "log_job_failure"]

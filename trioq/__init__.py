"""trioq: durable jobs on PostgreSQL, for trio.

The names below are imported at first use (PEP 562), so `import trioq` and the producers of
`trioq.producer` load neither trio nor the worker runtime until something asks for them
(docs/producers.md, "Importing trioq in a web process"). The errors and `JobState` are plain
and imported at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._core.errors import (
    ConfigurationError,
    DedupKeyConflict,
    EventTimeout,
    HistoryLimitExceeded,
    JobFailed,
    JobFinished,
    JobNotFound,
    NondeterminismError,
    PayloadError,
    ProducerConnectionError,
    ProducerError,
    ResultTimeout,
    SchemaNotMigrated,
    TrioqError,
    UnknownTask,
    UnservedTaskWarning,
    ValueNotSet,
)
from ._core.states import JobState

if TYPE_CHECKING:
    from ._core.explain import Explanation, Gate
    from ._core.retry import RetryPolicy
    from ._enqueue.rows import ClientTransaction, Job, TaskDeclaration, declare_task
    from ._runtime.job.claim_loop import WorkerHooks
    from ._runtime.job.job_transaction import JobLeaseLost, JobTransaction
    from ._runtime.services.worker import Worker, WorkerConfig
    from ._seam.records import EventOutcome
    from .app import App
    from .client import Client
    from .context import Context, JobInfo

# Public name -> the module that defines it, imported when the name is first read.
_LAZY: dict[str, str] = {
    "Explanation": "._core.explain",
    "Gate": "._core.explain",
    "RetryPolicy": "._core.retry",
    "EventOutcome": "._seam.records",
    "ClientTransaction": "._enqueue.rows",
    "Job": "._enqueue.rows",
    "TaskDeclaration": "._enqueue.rows",
    "declare_task": "._enqueue.rows",
    "WorkerHooks": "._runtime.job.claim_loop",
    "JobLeaseLost": "._runtime.job.job_transaction",
    "JobTransaction": "._runtime.job.job_transaction",
    "Worker": "._runtime.services.worker",
    "WorkerConfig": "._runtime.services.worker",
    "App": ".app",
    "Client": ".client",
    "Context": ".context",
    "JobInfo": ".context",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trioq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "App",
    "Client",
    "ClientTransaction",
    "ConfigurationError",
    "Context",
    "DedupKeyConflict",
    "EventOutcome",
    "EventTimeout",
    "Explanation",
    "Gate",
    "HistoryLimitExceeded",
    "Job",
    "JobFailed",
    "JobFinished",
    "JobInfo",
    "JobLeaseLost",
    "JobNotFound",
    "JobState",
    "JobTransaction",
    "NondeterminismError",
    "PayloadError",
    "ProducerConnectionError",
    "ProducerError",
    "ResultTimeout",
    "RetryPolicy",
    "SchemaNotMigrated",
    "TaskDeclaration",
    "TrioqError",
    "UnknownTask",
    "UnservedTaskWarning",
    "ValueNotSet",
    "Worker",
    "WorkerConfig",
    "WorkerHooks",
    "declare_task",
]

"""trioq: durable jobs on PostgreSQL, for trio."""

from ._core.errors import (
    ConfigurationError,
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
from ._core.explain import Explanation, Gate
from ._core.retry import RetryPolicy
from ._core.states import JobState
from ._driver import EventOutcome
from ._enqueue import ClientTransaction, Job, TaskDeclaration, declare_task
from ._runtime.claim_loop import WorkerHooks
from ._runtime.job_transaction import JobLeaseLost, JobTransaction
from ._runtime.worker import Worker, WorkerConfig
from .app import App
from .client import Client
from .context import Context, JobInfo

__all__ = [
    "App",
    "Client",
    "ClientTransaction",
    "ConfigurationError",
    "Context",
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

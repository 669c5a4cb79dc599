"""Producers for code that is not trio: Django, Flask, FastAPI, scripts (see docs/producers.md).

    from trioq.producer import SyncProducer, AsyncProducer, declare_task

`SyncProducer` (psycopg sync, thread-safe) and `AsyncProducer` (psycopg async, for asyncio)
enqueue by task name or shared `TaskDeclaration`, without importing the worker's handlers; both
run trioq's own statements and validation, and take your psycopg connection (`conn=`) to
enqueue inside your transaction.
"""

from .._core.errors import ProducerConnectionError, ProducerError
from .._enqueue.rows import Job, TaskDeclaration, declare_task
from .._seam.records import EventOutcome
from .aio import AsyncProducer
from .sync import SyncProducer

__all__ = [
    "AsyncProducer",
    "EventOutcome",
    "Job",
    "ProducerConnectionError",
    "ProducerError",
    "SyncProducer",
    "TaskDeclaration",
    "declare_task",
]

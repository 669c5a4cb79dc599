"""Public test helpers for trioq users (see docs/testing.md) and trioq's own tests."""

from .._memory import MemoryDriver
from .conformance import (
    CHECKS,
    ConformanceCheck,
    DriverClock,
    ManualClock,
    NotificationRecorder,
    SqlClock,
    flush_notifications,
)
from .helpers import (
    DrainResult,
    assert_enqueued,
    drain,
    enqueued_jobs,
    refute_enqueued,
    run_job,
)

__all__ = [
    "CHECKS",
    "ConformanceCheck",
    "DrainResult",
    "DriverClock",
    "ManualClock",
    "MemoryDriver",
    "NotificationRecorder",
    "SqlClock",
    "assert_enqueued",
    "drain",
    "enqueued_jobs",
    "flush_notifications",
    "refute_enqueued",
    "run_job",
]

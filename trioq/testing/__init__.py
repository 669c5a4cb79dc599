"""Public test helpers for trioq users (see docs/testing.md) and trioq's own tests."""

from .._memory import MemoryDriver
from . import conformance_waits as _conformance_waits  # noqa: F401  (registers checks)
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

from . import (
    conformance_continue,  # noqa: F401  (registers the continue-as-new and cancel checks)
    conformance_leadership,  # noqa: F401  (registers the leadership checks)
    conformance_messages,  # noqa: F401  (registers the message and value checks)
    conformance_schedules,  # noqa: F401  (registers the schedule checks)
    conformance_versions,  # noqa: F401  (registers the version checks)
)

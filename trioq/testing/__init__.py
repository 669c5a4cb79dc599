"""Public test helpers for trioq users and trioq's own tests."""

from .conformance import (
    CHECKS,
    ConformanceCheck,
    DriverClock,
    ManualClock,
    NotificationRecorder,
    SqlClock,
    flush_notifications,
)

__all__ = [
    "CHECKS",
    "ConformanceCheck",
    "DriverClock",
    "ManualClock",
    "NotificationRecorder",
    "SqlClock",
    "flush_notifications",
]

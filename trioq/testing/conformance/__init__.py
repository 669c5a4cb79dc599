"""The driver conformance suite: behaviour every `Driver` must show, whatever stores the jobs.

Each check is a plain `async def check_*(driver, clock)` registered in `CHECKS`; it takes a
freshly migrated, empty driver and a `DriverClock` that moves that driver's notion of "now"
forward. A check raises `AssertionError` (with the facts in its message) when the driver
misbehaves. `tests/test_conformance.py` runs all of them against `MemoryDriver` and `PgDriver`.

Clocks: `ManualClock` drives `MemoryDriver(clock=...)`; `SqlClock` moves a Postgres schema's
`db_now()` (the one function all of trioq's SQL takes time from) by an offset kept in a table of
that schema, so it works across every pooled connection. Neither clock is for production use.

Notification checks never wait for something *not* to happen: they commit a sentinel enqueue
after the action and wait for its notification; a listener receives notifications in commit
order, so anything the action sent has arrived by then.

The checks are split by concern, one module each: `claims`, `outcomes` (fence, complete, fail,
release), `leases` (renewal and recovery), `keys` (dedup and partition keys), `cancel`,
`notifications` (transactions and what a commit announces), `status`, `waits` (events and
children), `parents` (a child's end wakes its parent, whichever statement ends it),
`messages`, `schedules`, `leadership`, `versions`, `continue_as_new`, `limits` (cluster-wide
queue limits), `concurrency_keys` (at most N running per key), `key_rates` (at most N starts
per period per key) and `concurrency` (two workers at once); `harness` holds what they share.
"""

from . import (  # noqa: F401  (each module registers its checks in CHECKS)
    cancel,
    claims,
    concurrency,
    concurrency_keys,
    continue_as_new,
    deadlines,
    key_rates,
    keys,
    leadership,
    leases,
    limits,
    messages,
    notifications,
    outcomes,
    parents,
    schedules,
    status,
    versions,
    waits,
)
from .harness import (
    CHECKS,
    LEASE_SECONDS,
    QUEUE,
    TASK,
    WAIT_SECONDS,
    ConformanceCheck,
    DriverClock,
    ManualClock,
    NotificationRecorder,
    SqlClock,
    claim,
    claim_due,
    claim_round,
    complete,
    conformance_check,
    database_now,
    enqueue,
    expect,
    fail,
    flush_notifications,
    ids,
    new_job,
    record,
    release,
    renew,
    settle,
)

__all__ = [
    "CHECKS",
    "LEASE_SECONDS",
    "QUEUE",
    "TASK",
    "WAIT_SECONDS",
    "ConformanceCheck",
    "DriverClock",
    "ManualClock",
    "NotificationRecorder",
    "SqlClock",
    "claim",
    "claim_due",
    "claim_round",
    "complete",
    "conformance_check",
    "database_now",
    "enqueue",
    "expect",
    "fail",
    "flush_notifications",
    "ids",
    "new_job",
    "record",
    "release",
    "renew",
    "settle",
]

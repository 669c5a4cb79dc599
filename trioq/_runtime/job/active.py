"""The client a worker's handlers reach the database through, as the runtime sees it.

The runtime sits below the public API (`trioq.client`), so it names only what it uses of a
client (`ClientPort`); `app.client()` sets `ACTIVE_CLIENT` to the real `Client` for its block.
"""

from __future__ import annotations

import contextvars
from typing import Protocol

from ..._enqueue.rows import Enqueuer
from ..._seam.driver import Driver


class ClientPort(Protocol):
    """What a job's context needs of the client: its driver (the worker's pool) and the
    resolver of task names for enqueues inside a job's transaction."""

    @property
    def driver(self) -> Driver: ...

    @property
    def enqueuer(self) -> Enqueuer: ...


# The client whose `app.client()` block the current task runs in (any app): a worker's handlers
# reach the worker's pool through it (`ctx.client`), with no connections of their own.
ACTIVE_CLIENT: contextvars.ContextVar[ClientPort | None] = contextvars.ContextVar(
    "trioq_active_client", default=None
)

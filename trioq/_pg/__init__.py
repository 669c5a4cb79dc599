"""The PostgreSQL driver: psycopg 3 (sync, public API only) driven from trio.

With `trioq.producer` (the sync and asyncio producers, which use some of its modules), the only
code of trioq that imports psycopg. See docs/adr/0001-psycopg-through-a-trio-adapter.md. The
names below are imported at first use (PEP 562): `trioq.producer` loads neither trio nor, until
it connects, psycopg.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trioq._pg.connection import (
        Connection,
        ConnectionStatistics,
        ConnectOptions,
        connect,
    )
    from trioq._pg.errors import is_connection_lost
    from trioq._pg.listen import Listener, PollingListener, open_listener
    from trioq._pg.pool import Pool, PoolStatistics, open_pool

_LAZY: dict[str, str] = {
    "ConnectOptions": "trioq._pg.connection",
    "Connection": "trioq._pg.connection",
    "ConnectionStatistics": "trioq._pg.connection",
    "connect": "trioq._pg.connection",
    "is_connection_lost": "trioq._pg.errors",
    "Listener": "trioq._pg.listen",
    "PollingListener": "trioq._pg.listen",
    "open_listener": "trioq._pg.listen",
    "Pool": "trioq._pg.pool",
    "PoolStatistics": "trioq._pg.pool",
    "open_pool": "trioq._pg.pool",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trioq._pg' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ConnectOptions",
    "Connection",
    "ConnectionStatistics",
    "Listener",
    "PollingListener",
    "Pool",
    "PoolStatistics",
    "connect",
    "is_connection_lost",
    "open_listener",
    "open_pool",
]

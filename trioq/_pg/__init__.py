"""The PostgreSQL driver: psycopg 3 (sync, public API only) driven from trio.

The only package of trioq that imports psycopg. See docs/adr/0001-psycopg-through-a-trio-adapter.md.
"""

from trioq._pg.connection import (
    Connection,
    ConnectionStatistics,
    ConnectOptions,
    connect,
)
from trioq._pg.errors import is_connection_lost
from trioq._pg.listen import Listener, PollingListener, open_listener
from trioq._pg.pool import Pool, PoolStatistics, open_pool

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

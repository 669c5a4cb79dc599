"""The in-memory driver: the `Driver` protocol with the semantics of `_sql/queries.sql`.

`driver.py` holds `MemoryDriver` and its job table; `waits.py`, `messages.py` and
`schedules.py` hold the event waits, the messages and values, and the schedules.
"""

from .driver import MemoryDriver

__all__ = ["MemoryDriver"]

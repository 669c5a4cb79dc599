"""The in-memory driver: the `Driver` protocol with the semantics of `_sql/queries.sql`.

`state.py` holds the tables (`MemoryState`) and the row types; `driver.py` holds `MemoryDriver`,
which runs each statement over one state; `waits.py`, `messages.py`, `schedules.py` and
`reads.py` hold the event waits and children, the messages and values, the schedules, and the
read-only statements (records, explain, status), as functions over it.
"""

from .driver import MemoryDriver

__all__ = ["MemoryDriver"]

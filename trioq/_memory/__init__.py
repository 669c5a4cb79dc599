"""The in-memory driver: the `Driver` protocol with the semantics of `_sql/queries.sql`.

`state.py` holds the tables (`MemoryState`) and the row types; `driver.py` holds `MemoryDriver`,
which runs each statement over one state; `waits.py`, `messages.py` and `schedules.py` hold the
event waits and children, the messages and values, and the schedules, as functions over it.
"""

from .driver import MemoryDriver

__all__ = ["MemoryDriver"]

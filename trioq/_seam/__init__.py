"""The driver seam: the `Driver` Protocol the runtime speaks (`driver.py`, with one Protocol
per other concern in `workflow.py`, `services.py`, `schedules.py` and `admin.py`), the lease
they all carry (`lease.py`), the records a producer shares with it (`records.py`) and the
handler's trace span (`tracing.py`).

Empty on purpose: `trioq.producer` imports `records.py` alone, without the Protocol's classes.
"""

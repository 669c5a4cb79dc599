"""Notification channel names.

Ready channels are sharded by `hashtext(queue) & 63`, computed by the SQL function
`ready_channel(queue)` (enqueue, retry and recovery all notify from SQL; a worker asks the same
function for the channels of its queues). Result channels shard by job id, the same rule as the
SQL function `result_channel(id)`.
"""

from __future__ import annotations

CHANNEL_SHARDS = 64
# A job id in a notification: at most a bigint's digits. Any login may NOTIFY any channel, so a
# payload is parsed as untrusted text: ASCII digits only ('²'.isdigit() is True and int('²')
# raises), bounded in length.
_MAX_ID_DIGITS = 19


def result_channel(schema: str, job_id: int) -> str:
    """The channel a job's final state is announced on (the payload lists job ids)."""
    return f"{schema}_result_{job_id & (CHANNEL_SHARDS - 1)}"


def job_id_of(text: str) -> int | None:
    """The job id a notification payload (or one comma-separated part of it) names; None for
    anything else (a hint that names nothing is dropped, never an error)."""
    if 0 < len(text) <= _MAX_ID_DIGITS and text.isascii() and text.isdigit():
        return int(text)
    return None


def job_ids_of(payload: str) -> list[int]:
    """The job ids of a result notification's comma-separated payload (the parts naming none
    are dropped)."""
    return [job_id for part in payload.split(",") if (job_id := job_id_of(part)) is not None]


def control_channel(schema: str) -> str:
    """Worker control messages. A bare job id is a cancel hint: the worker running that job
    reads its stored cancel request before it cancels anything."""
    return f"{schema}_control"


def schedules_channel(schema: str) -> str:
    """Schedules were added, changed or removed: the schedulers re-read the table."""
    return f"{schema}_schedules"

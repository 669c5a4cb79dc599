"""Notification channel names.

Ready channels are sharded by `hashtext(queue) & 63`, computed by the SQL function
`ready_channel(queue)` (enqueue, retry and recovery all notify from SQL; a worker asks the same
function for the channels of its queues). Result channels shard by job id, the same rule as the
SQL function `result_channel(id)`.
"""

from __future__ import annotations

CHANNEL_SHARDS = 64


def result_channel(schema: str, job_id: int) -> str:
    """The channel a job's final state is announced on (the payload lists job ids)."""
    return f"{schema}_result_{job_id & (CHANNEL_SHARDS - 1)}"


def control_channel(schema: str) -> str:
    """Worker control messages (cancel a running job): payload is the job id."""
    return f"{schema}_control"


def schedules_channel(schema: str) -> str:
    """Schedules were added, changed or removed: the schedulers re-read the table."""
    return f"{schema}_schedules"

"""Messages and readable state: the primitives behind `ctx.receive` and `ctx.set_value`
(docs/workflows.md, "Messages" and "Readable state").

A receive is a durable wait like `ctx.wait_for_event`: decided AND suspended by one fenced
statement of its own (`job_receive`), because "messages queued -> take them, else -> waiting"
must be decided under the job row lock that a send takes too (migration 0016). The messages it
takes become its checkpoint in the same transaction, so each is delivered once and a replay
returns the same list. A suspended receive ends the execution with `Run.suspended_in_place`,
and the settle statement writes nothing for it. The send that wakes it writes its message as
that checkpoint (migration 0025), so the woken handler's replay below returns it from history
without a statement.

Values are not history: `set_value` keeps the newest value per key on the run and the next
write carries them (a checkpoint through the group commit, a receive, or, when the handler
suspends or returns first, `flush_values`). A replay sets the same values again, which changes
nothing.

Checkpoint kind written here:
  receive  {"deadline": t} while waiting, then {"messages": [payload, ...]} ([]: timed out;
           one payload when written by the waking send)
"""

from __future__ import annotations

import datetime
from typing import Any

import trio

from ..._core import codec
from ..._core.identifiers import validate_key
from ..._seam.workflow import Receive, ValueSet
from ..job.run import LeaseLost, Run

RECEIVE = "receive"
MAX_RECEIVE = 10_000  # messages one receive may take (its checkpoint holds them all)


async def receive(run: Run, topic: str, timeout: datetime.timedelta, limit: int) -> list[Any]:  # noqa: ASYNC109 (a durable deadline)
    if topic is None:
        raise ValueError("receive: the topic must be a non-empty string, not None")
    validate_key("receive topic", topic)
    if not isinstance(timeout, datetime.timedelta) or timeout.total_seconds() < 0:
        raise ValueError(f"receive {topic!r}: timeout must be a non-negative timedelta")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_RECEIVE:
        raise ValueError(f"receive {topic!r}: limit {limit!r} must be an integer in [1, 10000]")
    position, entry = run.replay(RECEIVE, topic)
    deadline = None
    if entry is not None:
        if "messages" in entry.value:
            return list(entry.value["messages"])
        deadline = datetime.datetime.fromisoformat(entry.value["deadline"])
    params = Receive(
        run.lease, position, topic, timeout.total_seconds(), deadline, limit, run.take_values()
    )
    with run.ending_statement():  # a message sent as it commits can make the job ready again
        outcome = await run.driver.job_receive(params)
    if outcome.state in ("received", "timeout"):
        for message in outcome.messages:
            if type(message) is codec.Undecodable:  # stored by SQL, past every check
                raise message.error(f"message {topic!r}")
        return list(outcome.messages)
    if outcome.state == "waiting":
        run.suspended_in_place(outcome.deadline)
    run.cancel("lost")
    raise LeaseLost(f"receive {topic!r}: this attempt no longer owns the job")


async def set_value(run: Run, key: str, value: Any) -> None:
    if key is None:
        raise ValueError("set_value: the key must be a non-empty string, not None")
    validate_key("set_value key", key)
    run.pending_values[key] = codec.encode(value, root=f"value {key!r}")
    await trio.lowlevel.checkpoint()


async def flush_values(run: Run) -> None:
    """Write the pending values now (fenced): the handler suspends or returns before any
    checkpoint could carry them. A lost lease ends the run like a lost checkpoint."""
    values = run.take_values()
    if values and not await run.driver.job_value_set_many(ValueSet(run.lease, values)):
        run.cancel("lost")
        raise LeaseLost("set_value: this attempt no longer owns the job")

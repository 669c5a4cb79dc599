"""The differential machine of tests/test_state_machine.py with messages added: sends (to
running, suspended, final and not yet started jobs), receives (taking, timing out, suspending),
replays of recorded and of pending receives after a wake-up or a crash (lease recovery and a
new claim), mixed with every rule of the base machine (settles, sleeps, recovery, cancel,
redrive, time). Both drivers must agree on every answer, and on the rows:

- no message lost or delivered twice: per job and topic, the messages recorded by its receive
  checkpoints followed by the ones still queued are exactly the accepted sends, in send order;
- a replay of a recorded receive returns the same messages and takes none;
- the send that wakes a job suspended in a receive of its topic is that receive's checkpoint;
- no lost wake-up: a job waiting for a topic has no message of that topic queued.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from tests.test_state_machine import SLEEP, DifferentialMachine, one_example, run_machine
from trioq._core.identifiers import quote_ident
from trioq._seam.driver import Driver, MessageSend
from trioq._seam.workflow import Receive

TOPICS = ("t1", "t2")
Deadlines = tuple[datetime.datetime | None, datetime.datetime | None]  # (memory, Postgres)
NONE: Deadlines = (None, None)


async def _pg_queued(pg: Driver, schema: str) -> list[tuple[Any, ...]]:
    async with pg.transaction() as tx:
        return await tx.fetch(
            f"SELECT job_id, topic, payload FROM {quote_ident(schema)}.messages ORDER BY id"
        )


class MessagesMachine(DifferentialMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sent: dict[tuple[int, str], list[int]] = {}  # (memory id, topic) -> payloads
        self.recorded: dict[tuple[int, int], tuple[str, list[Any]]] = {}  # (job, position)
        # memory id -> (position, topic, deadlines) of the receive it suspended in: the
        # deadline each driver stored, on its own clock (the memory driver's starts in 2000,
        # Postgres's db_now() is frozen at the real time), as the runtime replays each
        # receive with the deadline its driver recorded in the pending checkpoint
        self.pending: dict[int, tuple[int, str, Deadlines]] = {}
        self.next_payload = 0

    def _held_job(self, pick: int) -> int | None:
        held = sorted(job for w in self.workers.values() for job in w.held if job in self.leases)
        return held[pick % len(held)] if held else None

    def _suspended(self, job: int) -> None:
        for worker in self.workers.values():
            if job in worker.held:
                worker.held.remove(job)
        self.stale.append(self.leases.pop(job))

    @precondition(lambda self: bool(self.to_pg))
    @rule(pick=st.integers(0, 1000), topic=st.sampled_from(TOPICS))
    def send(self, pick: int, topic: str) -> None:
        job = sorted(self.to_pg)[pick % len(self.to_pg)]
        self.next_payload += 1
        payload = json.dumps(self.next_payload)
        row = self.pair.memory._state.rows.get(job)
        pending = self.pending.get(job)
        # The model: a job suspended in a receive of this topic (not yet woken, by a send or
        # its deadline's promotion) gets the message as that receive's checkpoint.
        delivers = (
            pending is not None
            and pending[1] == topic
            and row is not None
            and row.state == "waiting"
            and row.wait_topic == topic
        )
        memory, pg = self.both(
            "message_send",
            (MessageSend(job, topic, payload),),
            (MessageSend(self.to_pg[job], topic, payload),),
        )
        assert (memory.state, memory.message_id is None) == (pg.state, pg.message_id is None)
        if memory.message_id is not None:
            self.sent.setdefault((job, topic), []).append(self.next_payload)
        if delivers:
            assert pending is not None
            assert memory.message_id is not None
            self.recorded[(job, pending[0])] = (topic, [self.next_payload])
            del self.pending[job]

    @precondition(lambda self: bool(self.pending))
    @rule(pick=st.integers(0, 100))
    def send_to_a_suspended_receive(self, pick: int) -> None:
        """A send of the topic a suspended receive waits for (the path that delivers into the
        receive's checkpoint, or queues when the deadline's promotion woke the job first)."""
        job = sorted(self.pending)[pick % len(self.pending)]
        self.send(sorted(self.to_pg).index(job), self.pending[job][1])

    def _receive(
        self,
        job: int,
        position: int,
        topic: str,
        timeout: float,
        deadlines: Deadlines,
        limit: int,
    ) -> Any:
        leases = self.leases[job]
        memory_deadline, pg_deadline = deadlines
        memory, pg = self.both(
            "job_receive",
            (Receive(leases.memory, position, topic, timeout, memory_deadline, limit),),
            (Receive(leases.pg, position, topic, timeout, pg_deadline, limit),),
        )
        assert (memory.state, memory.messages) == (pg.state, pg.messages), (memory, pg)
        if memory.state in ("received", "timeout"):
            earlier = self.recorded.get((job, position))
            if earlier is not None:
                assert earlier == (topic, list(memory.messages)), "a replay differs"
            self.recorded[(job, position)] = (topic, list(memory.messages))
            self.pending.pop(job, None)
        elif memory.state == "waiting":
            self.pending[job] = (position, topic, (memory.deadline, pg.deadline))
            self._suspended(job)
        return memory

    @precondition(lambda self: bool(self.leases))
    @rule(
        pick=st.integers(0, 100),
        topic=st.sampled_from(TOPICS),
        wait=st.booleans(),
        limit=st.integers(1, 3),
    )
    def receive(self, pick: int, topic: str, wait: bool, limit: int) -> None:
        job = self._held_job(pick)
        if job is None or job in self.pending:
            return
        position = self.leases[job].next_position
        outcome = self._receive(job, position, topic, SLEEP if wait else 0.0, NONE, limit)
        if outcome.state in ("received", "timeout") and job in self.leases:
            self.leases[job].next_position = position + 1

    @precondition(lambda self: bool(self.leases) and bool(self.pending))
    @rule(pick=st.integers(0, 100), limit=st.integers(1, 3))
    def replay_pending_receive(self, pick: int, limit: int) -> None:
        """A woken (or recovered) job replays the receive it suspended in."""
        jobs = [job for job in sorted(self.pending) if job in self.leases]
        if not jobs:
            return
        job = jobs[pick % len(jobs)]
        position, topic, deadlines = self.pending[job]
        self._receive(job, position, topic, SLEEP, deadlines, limit)

    @precondition(lambda self: bool(self.leases) and bool(self.recorded))
    @rule(pick=st.integers(0, 100))
    def replay_recorded_receive(self, pick: int) -> None:
        """A re-claimed job replays a receive its history holds (a crash after the receive)."""
        done = sorted(key for key in self.recorded if key[0] in self.leases)
        if not done:
            return
        job, position = done[pick % len(done)]
        topic, _ = self.recorded[(job, position)]
        outcome = self._receive(job, position, topic, SLEEP, NONE, 3)
        assert outcome.state in ("received", "lost"), outcome

    # --- invariants -----------------------------------------------------------------------

    @invariant()
    def every_accepted_send_is_recorded_or_queued_once_in_send_order(self) -> None:
        queued = self.pair.memory._state.messages.queued
        for (job, topic), sent in self.sent.items():
            taken = [
                item
                for (j, _), (t, items) in sorted(self.recorded.items())
                if j == job and t == topic
                for item in items
            ]
            left = [json.loads(p) for _, p in queued.get(job, {}).get(topic, [])]
            assert taken + left == sent, (job, topic, taken, left, sent)
        pg_left: dict[tuple[int, str], list[Any]] = {}
        for pg_job, topic, payload in self.host.call(_pg_queued, self.pair.pg, self.pair.pg.schema):
            pg_left.setdefault((self.to_memory[pg_job], topic), []).append(payload)
        memory_left = {
            (job, topic): [json.loads(p) for _, p in items]
            for job, topics in queued.items()
            for topic, items in topics.items()
            if items
        }
        assert pg_left == memory_left

    @invariant()
    def every_recorded_receive_is_in_the_history(self) -> None:
        """A receive the model saw recorded (by the receive, or by the send that woke it) is
        the job's checkpoint at its position, with the same messages."""
        checkpoints = self.pair.memory._state.checkpoints
        for (job, position), (topic, messages) in self.recorded.items():
            stored = checkpoints.get(job, {}).get(position)
            if stored is None:
                continue  # history gone with the job (purged) or a redrive's fresh start
            assert stored[:2] == ("receive", topic), (job, position, stored)
            assert json.loads(stored[2] or "null") == {"messages": messages}, (job, stored)

    @invariant()
    def no_job_waits_for_a_topic_with_a_queued_message(self) -> None:
        queued = self.pair.memory._state.messages.queued
        for row in self.pair.memory._state.rows.values():
            if row.state == "waiting" and row.wait_topic is not None:
                assert not queued.get(row.id, {}).get(row.wait_topic), row


def test_both_drivers_agree_on_messages_across_crashes_and_replays(
    pg_url: str, pg_schema: str
) -> None:
    run_machine(MessagesMachine, pg_url, pg_schema, steps=35)


def test_a_receive_woken_by_a_cancel_replays_with_each_drivers_deadline(
    pg_url: str, pg_schema: str
) -> None:
    """A cancel wakes a job suspended in a receive before its deadline; the woken run's replay
    passes each driver the deadline that driver recorded (the clocks differ: memory's starts
    in 2000), and both suspend it again (the model once passed memory's deadline to both, long
    past on Postgres's clock: 'waiting' against 'timeout')."""
    with one_example(MessagesMachine, pg_url, pg_schema) as machine:
        machine.enqueue("a", 0, None, False, None, 1)
        machine.settle_and_claim("A", [], 1)
        machine.receive(0, "t1", True, 1)
        machine.cancel_or_retry(0, False)
        machine.settle_and_claim("A", [], 1)
        assert machine.pending and machine.leases
        machine.replay_pending_receive(0, 1)
        machine.rows_agree_and_stay_safe()
        machine.every_accepted_send_is_recorded_or_queued_once_in_send_order()
        machine.no_job_waits_for_a_topic_with_a_queued_message()

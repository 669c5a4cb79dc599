"""The differential machine of tests/test_state_machine.py, with the events and children rules
added: emit, wait for an event, spawn, wait for children (all or fail-fast) and gather's
cancel, mixed with every rule of the base machine (settles, sleeps, recovery, cancel, time).
Both drivers must agree on every answer and row, and these invariants hold on the rows:

- every emitted event wakes every waiter: after emit(k), no job still waits for k;
- a suspended job owns no slot: a waiting or sleeping job has no lease (the base invariant
  counts running jobs per worker against its slots);
- no lost wake-up for children: a job waiting for children is ready as soon as all of them are
  final or one failed, and never woken before that;
- a parent is final only after its children are, for cancellation (job_cancel's tree).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from tests.test_state_machine import QUEUE, SLEEP, DifferentialMachine, _records, run_machine
from trioq._seam.driver import EmitEvent, NewJob
from trioq._seam.lease import Lease
from trioq._seam.workflow import CancelChildren, Spawn, WaitChildren, WaitEvent

KEYS = ("e1", "e2")
FINAL = frozenset({"completed", "failed", "cancelled"})


class WaitsMachine(DifferentialMachine):
    def __init__(self) -> None:
        super().__init__()
        self.event_waiters: dict[str, set[int]] = {key: set() for key in KEYS}
        self.emitted: set[str] = set()
        self.children: dict[int, list[int]] = {}  # memory parent id -> memory child ids
        # parent -> (children it waits for, whether a failed child wakes it)
        self.child_waits: dict[int, tuple[tuple[int, ...], bool]] = {}
        self.redriven: set[int] = set()  # jobs redriven (job_retry) by hand
        self.tree_cancelled: set[int] = set()

    def _held_job(self, pick: int) -> int | None:
        held = sorted(job for w in self.workers.values() for job in w.held if job in self.leases)
        return held[pick % len(held)] if held else None

    def _suspended(self, job: int) -> None:
        """The job's lease ended with its suspension: it is no longer held by anyone."""
        for worker in self.workers.values():
            if job in worker.held:
                worker.held.remove(job)
        self.stale.append(self.leases.pop(job))

    @rule(key=st.sampled_from(KEYS), payload=st.integers(0, 3))
    def emit(self, key: str, payload: int) -> None:
        event = EmitEvent(key, json.dumps(payload))
        memory, pg = self.both("event_emit", (event,), (event,))
        assert (memory.first, memory.woken) == (pg.first, pg.woken)
        assert memory.first == (key not in self.emitted)
        self.emitted.add(key)
        # A parent cancelled while its children run waits for them to end (it is cancelled
        # then, never resumed): the event does not wake it.
        waiters = self.event_waiters[key]
        woken = sorted(waiters - self.tree_cancelled)
        rows = self.host.call(_records, self.pair.memory, woken)
        assert all(row is not None and row.state != "waiting" for row in rows), rows
        waiters.clear()

    @precondition(lambda self: bool(self.leases))
    @rule(pick=st.integers(0, 100), key=st.sampled_from(KEYS))
    def wait_for_event(self, pick: int, key: str) -> None:
        job = self._held_job(pick)
        if job is None:
            return
        leases = self.leases[job]
        position = leases.next_position
        memory, pg = self.both(
            "job_wait_event",
            (WaitEvent(leases.memory, position, key, SLEEP),),
            (WaitEvent(leases.pg, position, key, SLEEP),),
        )
        assert (memory.state, memory.payload) == (pg.state, pg.payload)
        if memory.state == "lost":  # the lease was recovered meanwhile: the attempt is stale
            return
        assert (memory.state == "received") == (key in self.emitted)
        if memory.state == "waiting":
            self.event_waiters[key].add(job)
            self._suspended(job)
        elif memory.state != "lost":
            leases.next_position += 1

    @precondition(lambda self: bool(self.leases))
    @rule(pick=st.integers(0, 100), task=st.sampled_from(["a", "b"]))
    def spawn(self, pick: int, task: str) -> None:
        job = self._held_job(pick)
        if job is None:
            return
        leases = self.leases[job]
        position = leases.next_position
        child = NewJob(QUEUE, task, "{}")
        [memory], [pg] = self.both(
            "job_spawn_many",
            ([Spawn(leases.memory, position, child)],),
            ([Spawn(leases.pg, position, child)],),
        )
        assert (memory.created, memory.cancelling) == (pg.created, pg.cancelling)
        assert (memory.child_id is None) == (pg.child_id is None)
        if memory.child_id is not None and pg.child_id is not None:
            self.to_memory[pg.child_id] = memory.child_id
            self.to_pg[memory.child_id] = pg.child_id
            self.children.setdefault(job, []).append(memory.child_id)
            leases.next_position += 1

    @precondition(lambda self: bool(self.children))
    @rule(pick=st.integers(0, 100), stop_on_failure=st.booleans(), cancel=st.booleans())
    def wait_for_children(self, pick: int, stop_on_failure: bool, cancel: bool) -> None:
        parents = [job for job in sorted(self.children) if job in self.leases]
        if not parents:
            return
        job = parents[pick % len(parents)]
        leases, ids = self.leases[job], tuple(self.children[job])
        position = leases.next_position

        def params(lease: Lease, child_ids: tuple[int, ...]) -> WaitChildren:
            return WaitChildren(lease, position, child_ids, stop_on_failure, True, "gather", "g")

        pg_ids = tuple(self.to_pg[child] for child in ids)
        memory, pg = self.both(
            "job_wait_children", (params(leases.memory, ids),), (params(leases.pg, pg_ids),)
        )
        assert pg.state != "changed"  # nothing runs concurrently here
        assert memory.state == pg.state, (memory, pg)
        assert [(c.state, c.result) for c in memory.children] == [
            (c.state, c.result) for c in pg.children
        ]
        if memory.state == "waiting":
            self.child_waits[job] = (ids, stop_on_failure)
            self._suspended(job)
        elif memory.state == "done":
            leases.next_position += 1
        elif memory.state == "failed" and cancel:
            value = json.dumps({"failed": ids[0]})
            memory_ok, pg_ok = self.both(
                "job_cancel_children",
                (CancelChildren(leases.memory, position, "gather", "g", value, ids),),
                (CancelChildren(leases.pg, position, "gather", "g", value, pg_ids),),
            )
            assert memory_ok == pg_ok
            leases.next_position += memory_ok

    @precondition(lambda self: bool(self.to_pg))
    @rule(pick=st.integers(0, 1000), redrive=st.booleans())
    def cancel_or_retry(self, pick: int, redrive: bool) -> None:
        if redrive:
            self.redriven.add(sorted(self.to_pg)[pick % len(self.to_pg)])
        super().cancel_or_retry(pick, redrive)

    @precondition(lambda self: bool(self.children))
    @rule(pick=st.integers(0, 100))
    def cancel_a_parent(self, pick: int) -> None:
        parents = sorted(self.children)
        job = parents[pick % len(parents)]
        memory, pg = self.both("job_cancel", (job,), (self.to_pg[job],))
        assert memory == pg
        # A parent already final is left alone (its state is returned twice): the promise that
        # its children end is the cancel's, so it holds only for a cancel that applied. (A
        # parent settled `cancel` by a driver call while its child was claimed in the same
        # statement is final with a running child: the runtime never settles `cancel` without
        # a cancel request, which flags the children first.)
        if memory is not None and memory.previous_state not in FINAL:
            self.tree_cancelled.add(job)

    # --- invariants -----------------------------------------------------------------------

    @invariant()
    def waits_hold_no_lease_and_children_wake_their_parent(self) -> None:
        jobs = sorted(self.to_pg)
        rows = dict(zip(jobs, self.host.call(_records, self.pair.memory, jobs), strict=True))
        for job, record in rows.items():
            assert record is not None
            if record.state in ("waiting", "sleeping"):  # suspended: no lease, so no slot
                assert job not in self.leases, record
            else:  # its event wait ended (a timeout, a recovery, a cancel): it waits no more
                for waiters in self.event_waiters.values():
                    waiters.discard(job)
        for parent, (waited, stop_on_failure) in list(self.child_waits.items()):
            record = rows[parent]
            assert record is not None
            if record.state != "waiting":
                del self.child_waits[parent]
                continue
            if parent in self.tree_cancelled:
                # A cancel turned the wait into "until every child has ended" (job_cancel_tree):
                # a child failing or being cancelled no longer wakes it (checked below).
                continue
            states = [rows[child].state for child in waited]  # type: ignore[union-attr]
            settled = all(state in FINAL for state in states)
            failed = stop_on_failure and any(state in ("failed", "cancelled") for state in states)
            assert not (settled or failed), ("a parent missed its wake-up", parent, states)
        for parent in self.tree_cancelled:
            record = rows[parent]
            if record is not None and record.state in FINAL and record.state == "cancelled":
                for child in self.children.get(parent, ()):
                    if child in self.redriven:  # `trioq retry` of a child is the user's call
                        continue
                    child_row = rows[child]
                    assert child_row is not None and child_row.state in FINAL, (parent, child)


@pytest.mark.slow
def test_both_drivers_agree_on_events_and_children(pg_url: str, pg_schema: str) -> None:
    run_machine(WaitsMachine, pg_url, pg_schema, steps=30)

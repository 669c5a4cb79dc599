"""The settle buffer: ONE buffer of finished executions' outcomes, written by the claim loop's
next `job_settle_and_claim` round trip.

A lease stays owned from its claim until the statement that records its outcome commits: while
pending here, and while the statement carrying it is in flight (`writing`).

Plain lists, not dicts by lease: each outcome is added once and moves as part of one batch, so
nothing is looked up by lease on the per-job path (a dict by lease hashed it six times per job).
"""

from __future__ import annotations

import attrs

from .._driver import Lease, Settlement

# A batch in flight: its settlements and, for each, whether it frees a partition key.
_Batch = tuple[tuple[Settlement, ...], tuple[bool, ...]]


@attrs.define(eq=False)
class SettleBuffer:
    _pending: list[Settlement] = attrs.field(factory=list)  # oldest first
    _frees: list[bool] = attrs.field(factory=list)  # per pending outcome: it frees a key
    _writing: list[_Batch] = attrs.field(factory=list)  # batches whose statement is in flight

    def add(self, settlement: Settlement, *, keyed: bool) -> None:
        self._pending.append(settlement)
        self._frees.append(keyed and settlement.kind not in ("sleep", "wait"))

    def take(self, limit: int | None = None) -> tuple[tuple[Settlement, ...], bool]:
        """Move what is pending (the oldest `limit` outcomes, or all) to `writing`; also
        whether any of it frees a key."""
        batch, frees = tuple(self._pending[:limit]), tuple(self._frees[:limit])
        del self._pending[:limit], self._frees[:limit]
        if batch:
            self._writing.append((batch, frees))
        return batch, any(frees)

    def written(self, batch: tuple[Settlement, ...]) -> None:
        """The statement carrying `batch` committed (or was fenced): forget it."""
        self._forget(batch)

    def restore(self, batch: tuple[Settlement, ...]) -> None:
        """The statement failed (nothing committed, or unknown): keep the outcomes for later,
        ahead of those that finished since."""
        frees = self._forget(batch)
        if frees is not None:
            self._pending[:0] = batch
            self._frees[:0] = frees

    def _forget(self, batch: tuple[Settlement, ...]) -> tuple[bool, ...] | None:
        for index, (writing, frees) in enumerate(self._writing):
            if writing is batch:
                del self._writing[index]
                return frees
        return None

    def leases(self) -> list[Lease]:
        leases = [settlement.lease for settlement in self._pending]
        for batch, _ in self._writing:
            leases.extend(settlement.lease for settlement in batch)
        return leases

    def __len__(self) -> int:
        return len(self._pending) + sum(len(batch) for batch, _ in self._writing)

    @property
    def pending(self) -> int:
        return len(self._pending)

"""The settle buffer: ONE buffer of finished executions' outcomes, keyed by lease, written by
the claim loop's next `job_settle_and_claim` round trip.

A lease stays owned from its claim until the statement that records its outcome commits: while
pending here, and while the statement carrying it is in flight (`writing`).
"""

from __future__ import annotations

import attrs

from .._driver import Lease, Settlement


@attrs.define(eq=False)
class SettleBuffer:
    _pending: dict[Lease, Settlement] = attrs.field(factory=dict)
    _writing: dict[Lease, Settlement] = attrs.field(factory=dict)
    _frees_key: set[Lease] = attrs.field(factory=set)  # outcomes that free a partition key

    def add(self, settlement: Settlement, *, keyed: bool) -> None:
        self._pending[settlement.lease] = settlement
        if keyed and settlement.kind not in ("sleep", "wait"):
            self._frees_key.add(settlement.lease)

    def take(self, limit: int | None = None) -> tuple[tuple[Settlement, ...], bool]:
        """Move what is pending (the oldest `limit` outcomes, or all) to `writing`; also
        whether any of it frees a key."""
        batch = tuple(self._pending.values())[:limit]
        for settlement in batch:
            self._writing[settlement.lease] = self._pending.pop(settlement.lease)
        frees_key = any(settlement.lease in self._frees_key for settlement in batch)
        return batch, frees_key

    def written(self, batch: tuple[Settlement, ...]) -> None:
        """The statement carrying `batch` committed (or was fenced): forget it."""
        for settlement in batch:
            self._writing.pop(settlement.lease, None)
            self._frees_key.discard(settlement.lease)

    def restore(self, batch: tuple[Settlement, ...]) -> None:
        """The statement failed (nothing committed, or unknown): keep the outcomes for later."""
        for settlement in batch:
            self._writing.pop(settlement.lease, None)
            self._pending.setdefault(settlement.lease, settlement)

    def leases(self) -> list[Lease]:
        return [*self._pending, *self._writing]

    def __len__(self) -> int:
        return len(self._pending) + len(self._writing)

    @property
    def pending(self) -> int:
        return len(self._pending)

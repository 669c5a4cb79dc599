"""The lease: the fencing triple every write about a claimed job carries (the settle, a
checkpoint, a wait, a renewal), so that a worker that lost its claim writes nothing.
"""

from __future__ import annotations

import uuid

import attrs


# Not frozen, unlike the other values (STYLE): every claimed job builds one, and a frozen
# slotted class sets each field through object.__setattr__ (0.40 against 0.12 us a Lease,
# cache_hash's field included). Never assigned after it is built; its hash and equality are the
# frozen class's (`unsafe_hash`: by value), and it is no longer cached: only the renewer hashes
# leases, a few times per lease and round, not per job.
@attrs.define(unsafe_hash=True)
class Lease:
    """The fencing triple every write after a claim carries (a value: never assigned)."""

    id: int
    attempt: int
    lease_token: uuid.UUID

"""The lease: the fencing triple every write about a claimed job carries (the settle, a
checkpoint, a wait, a renewal), so that a worker that lost its claim writes nothing.
"""

from __future__ import annotations

import uuid

import attrs


@attrs.frozen(cache_hash=True)
class Lease:
    """The fencing triple every write after a claim carries. Its hash is cached: the settle
    buffer and the renewer key dicts and sets by lease, several times per job."""

    id: int
    attempt: int
    lease_token: uuid.UUID

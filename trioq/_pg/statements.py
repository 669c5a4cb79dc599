"""How `PgDriver` runs a named statement: its pools and statement texts, `_query` on the
trio-native libpq path, `_retrying` for the idempotent ones, and the parameter encoders that
statements of several concerns share (the lease fence as arrays).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import functools
import random
from collections.abc import Sequence
from typing import Any

import attrs
import psycopg
import trio

from .._seam.driver import (
    DriverStatistics,
)
from .._seam.lease import Lease
from .._sql import (
    PositionalStatement,
    positional_queries,
    queries,
)
from . import (
    Connection,
    Pool,
    is_connection_lost,
)
from .errors import MOVED_ROW_ATTEMPTS, schema_required
from .inserts import quoted as _quoted
from .limits import LimitedQueues
from .replies import Claimed, EpochsRotated, PlainClaimed

Params = dict[str, Any]


def lease_arrays(leases: Sequence[Lease]) -> Params:
    """The fencing triples as three array literals (cast to bigint[], int[], uuid[] in SQL).

    Sent as text: psycopg dumps a Python list element by element, which showed in the worker's
    profile at saturation; ints and UUIDs need no quoting in an array literal. A token is
    written as its 32 hex digits (`UUID.hex`, which Postgres reads as the same uuid): `str()`
    of a UUID, with its hyphens, cost 1.3 us each, a third of a 25-job claim's parameters.
    """
    return {
        "ids": "{" + ",".join([str(lease.id) for lease in leases]) + "}",
        "attempts": "{" + ",".join([str(lease.attempt) for lease in leases]) + "}",
        # `"%032x" % token.int` is `UUID.hex`'s own text without its property call: 3.3
        # against 6.9 us for a batch of 25 (timeit, best of 5; an f-string 4.7).
        "lease_tokens": "{"
        + ",".join(["%032x" % lease.lease_token.int for lease in leases])  # noqa: UP031
        + "}",
    }


def lease_params(lease: Lease) -> Params:
    return {"id": lease.id, "attempt": lease.attempt, "lease_token": lease.lease_token}


@functools.cache
def timedelta_of(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


# The statements whose result columns are read in binary format (native.fetch): the claim,
# whose 25 rows of 22 columns were the largest decode of a worker's round, and the settles.
# Every column of a statement listed here must be of a built-in type (psycopg returns bytes for
# a type it has no binary loader for).
BINARY_RESULTS = frozenset(
    {
        "job_claim",
        "job_claim_rated",
        "job_claim_plain",
        "job_settle_many",
        "job_complete_plain",
        "job_complete_discard",
    }
)

# Columns of a statement's own that repeat on every row and are read from its last row only
# (native.fetch decodes them there alone): the claims' `now`, a timestamptz that costs ~0.4 us
# to decode with a session time zone other than `UTC` (psycopg converts each value to it), 9.6
# us of a 25-row claim's 47 us decode (timeit on the reply's own 22 columns: 40 against 47 us).
LAST_ROW_ONLY: dict[str, tuple[int, ...]] = {
    "job_claim": (Claimed.now,),
    "job_claim_rated": (Claimed.now,),
    "job_claim_plain": (PlainClaimed.now,),
}


def array_element(value: object) -> str:
    if type(value) is str:  # the common element (results, errors): tested first
        return _quoted(value)
    if isinstance(value, datetime.datetime):
        return f'"{value.isoformat()}"'
    if isinstance(value, float | int) and not isinstance(value, bool):
        return repr(float(value))  # a float subclass (numpy) would repr as np.float64(1.5)
    if isinstance(value, str):
        return _quoted(value)
    raise TypeError(f"array element {value!r}: expected str, a number or a datetime")


QUOTED_NULL = _quoted("null")


def results_element(value: str | None) -> str:
    return "NULL" if value is None else _quoted(value)


@functools.lru_cache(maxsize=64)
def quoted_kind(kind: str) -> str:
    """A checkpoint kind, one of a few constants (step, sleep, ...): quoted once."""
    return _quoted(kind)


@functools.lru_cache(maxsize=1024)
def quoted_name(name: str) -> str:
    """A checkpoint name: a workflow names the same few steps in every run, so each is quoted
    once (quoting every write's name was 1.2% of a 3-step workflow drain's worker CPU)."""
    return _quoted(name)


@attrs.define(eq=False)
class PgStatements:
    """What every statement of `PgDriver` runs through; each concern's statements subclass it."""

    schema: str
    _pool: Pool
    # Lease renewals get a connection of their own: handlers that fill the main pool (say,
    # each inside client.transaction()) must never hold renewals back until leases expire.
    _renewal_pool: Pool
    # Database-wide scans (`queue_demand()`, which reads every unfinished row) get one
    # connection of their own, opened on first use: a burst of them (scrapes of /metrics, say)
    # waits for that connection instead of taking the main pool from claims and settles.
    _scan_pool: Pool
    _conninfo: str = attrs.field(repr=False)  # holds the password
    # Where LISTEN goes; None: nowhere (behind a transaction pooler without a listen URL, where
    # a LISTEN would be silently dead and stay behind for the session's next client).
    _listen_conninfo: str | None = attrs.field(repr=False)
    _listen_options: dict[str, Any] = attrs.field(factory=dict)
    _sql: dict[str, str] = attrs.field(init=False)
    _positional: dict[str, PositionalStatement] = attrs.field(init=False)
    _calls: collections.Counter[str] = attrs.field(init=False, factory=collections.Counter)
    # Per queue: whether its last settle-and-claim round saw no ready keyed row and no row due
    # within the lookahead, so the next may be a plain one.
    _limited: LimitedQueues = attrs.field(init=False, factory=LimitedQueues)
    # Whether any key has a rate (one entry, ""): keyed claims then run the rated statement.
    _rated: LimitedQueues = attrs.field(init=False, factory=LimitedQueues)
    # When job_epochs_rotate last ran and when it is next due (its reply's next_due), by the
    # database's clock; None until the first maintenance pass this driver leads.
    _epochs_rotated: tuple[datetime.datetime, datetime.datetime] | None = attrs.field(
        init=False, default=None
    )

    def __attrs_post_init__(self) -> None:
        self._sql = queries(self.schema)
        self._positional = positional_queries(self.schema)

    async def _query(
        self, conn: Connection, name: str, params: Params | None
    ) -> list[tuple[Any, ...]]:
        """Run the named statement; with parameters, in its positional form (see
        `PositionalStatement`: the cost does not depend on the schema name's length), on the
        trio-native libpq path with psycopg's own parameter types (no worker thread: a thread
        start and a wake-up of the trio loop per statement cost 60-140 us of a short
        statement's latency, and every checkpoint, renewal and claim waits for one)."""
        for attempt in range(MOVED_ROW_ATTEMPTS):
            try:
                if params is None:
                    return await conn.fetch(self._sql[name])
                statement = self._positional[name]
                return await conn.fetch_native(
                    statement.text,
                    statement.values(params),
                    typed=True,
                    binary=name in BINARY_RESULTS,
                    last_row_only=LAST_ROW_ONLY.get(name, ()),
                )
            except psycopg.errors.SerializationFailure:
                # A row it waited for was moved (errors.MOVED_ROW_ATTEMPTS says why it runs
                # again); inside the caller's transaction the error is the caller's.
                if conn.in_transaction or attempt == MOVED_ROW_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    async def _epochs_rotate(
        self, retention_seconds: float | None
    ) -> tuple[int, datetime.datetime]:
        """job_epochs_rotate: the jobs it removed, and when rotation is next due (a minute from
        now when a lock was not granted or a batch of row deletes was full).

        With a retention, the epochs and partitions alone (NULL) are committed first: a
        partition's making locks its parent until the transaction ends (an attach SHARE UPDATE
        EXCLUSIVE; `CREATE TABLE ... PARTITION OF` took ACCESS EXCLUSIVE, which every claim
        queues behind). In one call, a midnight that both starts an epoch and expires one (a
        retention of whole days) ran the prune, its survivors' read and lock waits included,
        under the five parents' locks (tests/test_satellite_epochs.py)."""
        if retention_seconds is not None:
            await self._retrying("job_epochs_rotate", {"retention_seconds": None})
        rotated = await self._retrying(
            "job_epochs_rotate", {"retention_seconds": retention_seconds}
        )
        return int(rotated[0][EpochsRotated.pruned]), rotated[0][EpochsRotated.next_due]

    def statistics(self) -> DriverStatistics:
        return DriverStatistics(calls=dict(self._calls))

    async def _fetch(
        self, name: str, params: Params | None = None, *, pool: Pool | None = None
    ) -> list[tuple[Any, ...]]:
        self._calls[name] += 1
        async with (pool or self._pool).connection() as conn:
            with self._schema_required():
                return await self._query(conn, name, params)

    def _schema_required(self) -> contextlib.AbstractContextManager[None]:
        """`errors.schema_required` for this schema."""
        return schema_required(self.schema)

    async def _retrying(
        self,
        name: str,
        params: Params | None = None,
        attempts: int = 5,
        *,
        pool: Pool | None = None,
    ) -> list[tuple[Any, ...]]:
        """Run an idempotent statement, retrying when the connection was lost."""
        delay = 0.05
        for attempt in range(attempts):
            try:
                return await self._fetch(name, params, pool=pool)
            except Exception as exc:
                if not is_connection_lost(exc) or attempt == attempts - 1:
                    raise
            await trio.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")

"""`trioq migrate` on PostgreSQL: the numbered migrations under an advisory lock, online ones
outside a transaction, and the plpgsql functions when their digest changed.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg
import trio

from .._core.errors import MigrationLockTimeout, SchemaNotMigrated
from .._sql import (
    Migration,
    functions,
    functions_digest,
    migrations,
)
from . import (
    Connection,
)
from .errors import migration_refused
from .replies import (
    FunctionDigest,
    FunctionDigestKept,
    MigrationApplied,
    MigrationSessionTimeouts,
)
from .statements import PgStatements

logger = logging.getLogger("trioq.pg")

T = TypeVar("T")


#: How long one lock of a migration may wait (a queued ACCESS EXCLUSIVE request holds up every
#: enqueue and claim behind it): the online-migration bound of docs/operations.md is 1 s.
MIGRATE_LOCK_TIMEOUT = 0.5


#: How long `migrate` keeps trying in all before it gives up (a nightly pg_dump runs minutes).
MIGRATE_LOCK_WAIT = 600.0


class PgMigrations(PgStatements):
    """`Driver.migrate`, part of `PgDriver`."""

    __slots__ = ()

    async def migrate(
        self,
        *,
        lock_timeout: float = MIGRATE_LOCK_TIMEOUT,
        lock_wait: float = MIGRATE_LOCK_WAIT,
    ) -> list[int]:
        """Apply the SQL functions' current bodies and the missing migrations; returns the
        migration versions applied.

        Online (docs/operations.md, "Online migrations"): consecutive transactional migrations
        run in one transaction with the functions' bodies, under an advisory lock, and every lock
        they take waits at most `lock_timeout` seconds; a lock not granted rolls the transaction
        back and it is tried again after a pause, for `lock_wait` seconds in all, so a
        migration queued behind a long reader (a `pg_dump`) holds up enqueues and claims for a
        `lock_timeout` at a time, not for as long as the reader runs. A no-transaction migration
        (`CREATE INDEX CONCURRENTLY`, batches) runs statement by statement in between.
        """
        applied: list[int] = []
        deadline = trio.current_time() + lock_wait
        # Migrations may run long (an index build on a big table): not under trioq's timeouts.
        async with self._pool.connection() as conn:
            try:
                while True:
                    group, online = await self._retry_lock_timeouts(
                        deadline, lambda: self._migrate_group(conn, lock_timeout)
                    )
                    applied += group
                    if online is None:
                        return applied
                    run = functools.partial(self._run_no_transaction, conn, online, lock_timeout)
                    await self._retry_lock_timeouts(deadline, run)
                    applied.append(online.version)
            except psycopg.errors.InsufficientPrivilege as exc:
                role, database = conn.role_and_database()
                refused = migration_refused(exc, self.schema, role, database)
                raise SchemaNotMigrated(refused or str(exc)) from exc

    async def _retry_lock_timeouts(self, deadline: float, attempt: Callable[[], Awaitable[T]]) -> T:
        delay = 0.1
        while True:
            try:
                return await attempt()
            except psycopg.errors.LockNotAvailable as exc:
                if trio.current_time() + delay > deadline:
                    raise MigrationLockTimeout(
                        "trioq migrate: a lock it needs was held by another session for longer"
                        " than its --lock-wait; see pg_stat_activity for long transactions"
                        f" (a pg_dump, an idle-in-transaction session) and run it again ({exc})"
                    ) from exc
                logger.info("migrate: a lock it needs is held elsewhere; trying again")
            await trio.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 2.0)

    async def _migrate_group(
        self, conn: Connection, lock_timeout: float
    ) -> tuple[list[int], Migration | None]:
        """One transaction: the functions' bodies when they changed, then the pending
        transactional migrations up to the next no-transaction one, which it returns; every
        lock wait bounded by `lock_timeout`."""
        applied: list[int] = []
        online: Migration | None = None
        async with conn.transaction(trioq_timeouts=False):
            await conn.execute(self._sql["migration_lock"], {"schema_name": self.schema})
            await conn.execute(self._sql["migration_prepare"])
            await conn.execute(
                self._sql["migration_lock_timeout"], {"milliseconds": str(int(lock_timeout * 1000))}
            )
            applied_rows = await conn.fetch(self._sql["migration_applied"])
            done = {row[MigrationApplied.version] for row in applied_rows}
            known = migrations(self.schema)
            if done and max(done) > known[-1].version:
                # A newer release migrated this schema (an old worker restarting with
                # --migrate during a rolling deploy, a rollback): applying this release's
                # function bodies would put old ones under the newer workers.
                logger.warning(
                    "schema %s is at migration %d, newer than this trioq knows (%d): nothing "
                    "applied, its functions and tables are the newer release's",
                    self.schema,
                    max(done),
                    known[-1].version,
                )
                return applied, None
            bodies = functions(self.schema)
            digest = functions_digest(bodies)
            changed = await self._functions_changed(conn, digest)
            if changed:
                # Before the migrations, whose triggers name them (queries.sql says why they
                # are not checked here).
                await conn.execute(self._sql["migration_functions_unchecked"])
                for function in bodies:
                    await conn.execute(function.sql)
                await conn.execute(self._sql["migration_functions_checked"])
            for migration in known:
                if migration.version in done:
                    continue
                if not migration.transactional:
                    online = migration
                    break
                await conn.execute(migration.sql)
                await self._record_migration(conn, migration)
                applied.append(migration.version)
            if changed:
                await conn.execute(
                    self._sql["migration_function_digest_record"], {"digest": digest}
                )
        return applied, online

    async def _record_migration(self, conn: Connection, migration: Migration) -> None:
        await conn.execute(
            self._sql["migration_record"], {"version": migration.version, "name": migration.name}
        )

    async def _run_no_transaction(
        self, conn: Connection, migration: Migration, lock_timeout: float
    ) -> None:
        """Each statement on its own: in a transaction of its own, under the session's default
        timeouts and `lock_timeout` set locally; one PostgreSQL refuses in a transaction block
        (`CREATE INDEX CONCURRENTLY`, or a `CALL` of a procedure that commits its batches: its
        first batch is rolled back with the refusal) in autocommit instead. Then the record,
        which another migrate may have written meanwhile."""
        milliseconds = str(int(lock_timeout * 1000))
        for statement in migration.statements():
            try:
                async with conn.transaction(trioq_timeouts=False):
                    await conn.execute(
                        self._sql["migration_lock_timeout"], {"milliseconds": milliseconds}
                    )
                    await conn.execute(statement)
            except (
                psycopg.errors.ActiveSqlTransaction,
                psycopg.errors.InvalidTransactionTermination,
            ):
                await self._run_bare(conn, statement, milliseconds)
        async with conn.transaction(trioq_timeouts=False):
            await conn.execute(self._sql["migration_lock"], {"schema_name": self.schema})
            applied_rows = await conn.fetch(self._sql["migration_applied"])
            if migration.version not in {row[MigrationApplied.version] for row in applied_rows}:
                await self._record_migration(conn, migration)

    async def _run_bare(self, conn: Connection, statement: str, milliseconds: str) -> None:
        """A statement that runs only outside a transaction block, in autocommit. On a session
        of trioq's own its timeouts are set for the session around it (trioq's 30 s statement
        timeout would end an index build on a big table) and restored after; behind a
        transaction pooler nothing is set: a SET there would stay with the server connection
        for its next client, and the pooler's sessions carry none of trioq's timeouts anyway."""
        [saved] = await conn.fetch(self._sql["migration_session_timeouts_save"])
        if not saved[MigrationSessionTimeouts.own]:
            await conn.execute(statement)
            return
        await conn.execute(
            self._sql["migration_session_timeouts_default"], {"milliseconds": milliseconds}
        )
        try:
            await conn.execute(statement)
        finally:
            await conn.execute(
                self._sql["migration_session_timeouts_restore"],
                {
                    "statement_timeout": saved[MigrationSessionTimeouts.statement_timeout],
                    "lock_timeout": saved[MigrationSessionTimeouts.lock_timeout],
                    "idle_timeout": saved[MigrationSessionTimeouts.idle_timeout],
                },
            )

    async def _functions_changed(self, conn: Connection, digest: str) -> bool:
        """Whether the functions' bodies differ from what the last migrate applied."""
        [kept] = await conn.fetch(self._sql["migration_function_digest_kept"])
        if not kept[FunctionDigestKept.kept]:
            return True
        rows = await conn.fetch(self._sql["migration_function_digest"])
        return [row[FunctionDigest.digest] for row in rows] != [digest]

"""A driver wrapper that compares a derived table with the records after every call that may
write a job, and after every transaction: the base of tests/job_due_check.py's and
tests/ready_keyed_check.py's checks, which differ only in the table and its mismatch query."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import attrs

from trioq._pg.driver import PgDriver
from trioq.testing.transitions import METHOD_STATEMENTS


@attrs.define(eq=False)
class CheckedAfterWrites:
    """`inner` (the driver the calls go to, maybe another checked driver around `pg`), with
    `table` compared to the records after every call that may write a job, and after every
    transaction; `pg` reads the two tables on a pooled connection of its own."""

    table: ClassVar[str]
    mismatch: ClassVar[type[AssertionError]]

    inner: Any
    pg: PgDriver
    checked_calls: int = 0

    def mismatches_query(self) -> str:
        raise NotImplementedError

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if name == "transaction":
            return functools.partial(self._transaction, value)
        if name in METHOD_STATEMENTS:
            return functools.partial(self._checked, name, value)
        return value

    @property
    def schema(self) -> str:
        return self.pg.schema

    async def _checked(
        self, method: str, function: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any
    ) -> Any:
        try:
            return await function(*args, **kwargs)
        finally:
            await self.assert_exact(method)

    @asynccontextmanager
    async def _transaction(self, function: Callable[..., Any], *args: Any) -> AsyncIterator[Any]:
        try:
            async with function(*args) as tx:
                yield tx
        finally:
            await self.assert_exact("transaction")

    async def assert_exact(self, after: str) -> None:
        self.checked_calls += 1
        async with self.pg._pool.connection() as conn:
            found = await conn.fetch(self.mismatches_query())
        if found:
            raise self.mismatch(f"after {after}: {self.table} differs from the records: {found}")

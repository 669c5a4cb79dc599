"""The trio floor: the raw baseline's loop (bench/baseline.py) written for trio, on trioq's own
statement path, so a worker CPU ratio splits into what trio and the driver cost and what the
runtime around them costs.

It runs the raw loop's statements (CLAIM_SQL, COMPLETE_SQL) on the raw loop's own table with
the raw loop's algorithm: one claim connection asking for at most the open slots, one
completion connection with one flush in flight, a slot opening as its handler returns. What
changes is what trioq keeps by design:
- trio in place of asyncio, a task per job (`nursery.start_soon`);
- with `--scope` (the default), each job's handler inside a `trio.CancelScope` of its own, as
  trioq's executor runs it (a job is cancelled alone: a timeout, a cancel request, a lost
  lease); `--no-scope` leaves it out, to price it;
- trioq's native statement path (`trioq._pg.connection.Connection.fetch_native`: libpq through
  psycopg's `pq` layer, binary results, the claim's payload decoded by trioq's jsonb loader) in
  place of asyncpg, whose protocol and record decode are written in C.

`--contract keep|delete` runs the same worker (its cancel scope per job included) on the
tables and statements of the contract's floor (bench/contract_floor.py, numbered for the native
path by `contract_floor.native`) instead: a claim that takes ready entries and writes a lease
fenced by attempt and token, a completion fenced by id + attempt + token that appends the
outcome to a history (`keep`) or deletes the record (`delete`). With the same loop, driver and
runtime cost as the raw statements, the server CPU per job between the two is what the
contract's storage costs at the least (`--queue` does not apply: its claim reads `default`).

`--contract trioq` runs it on trioq's own schema with trioq's plain claim and completion
(job_claim_plain, job_complete_plain, sent as trioq's driver sends them: positional, typed,
binary results), or with `--variant DIR` a variant's (bench/statement_variants.py): what those
statements cost the server with the floor's runtime around them.

`python -m bench.trio_floor --dsn ... --schema ... --expect N` prints `ready` once connected,
stops claiming after N jobs and waits to be stopped (SIGTERM), as the raw loop does, so the
harness reads its CPU the same way. `python -m bench.worker_cpu --trio-floor` runs it between
the raw loop and trioq in every repeat, `--contract-floor` on the contract's tables.
"""

from __future__ import annotations

import argparse
import json
import operator
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from bench import contract_floor, statement_variants
from bench.baseline import CLAIM_SQL, COMPLETE_DELETE_SQL, COMPLETE_SQL, IDLE_POLL_SECONDS, noop
from trioq._pg.connection import Connection, connect
from trioq._pg.replies import ClaimedRow
from trioq._pg.statements import BINARY_RESULTS, results_element
from trioq._sql import to_positional

HANDLERS = {"noop": noop}
CONTRACT_COMPLETIONS = {
    "keep": contract_floor.COMPLETE_SQL,
    "delete": contract_floor.COMPLETE_DELETE_SQL,
}


class Worker:
    """Claims on one connection, completes on another; one completion flush in flight.

    `fence` picks a claimed row's fence (its id and lease token; the contract's also its
    attempt) and `columns` names those fields and the result: a job's pending entry is its fence
    and its result's JSON. `params` names the completion's parameters in their `$n` order, each
    an array literal of one column."""

    def __init__(
        self,
        done_conn: Connection,
        complete_sql: bytes,
        scope: bool,
        fence: Callable[[tuple[Any, ...]], tuple[Any, ...]],
        columns: tuple[str, ...],
        params: tuple[str, ...],
    ) -> None:
        self.done_conn = done_conn
        self.complete_sql = complete_sql
        self.scope = scope
        self.fence = fence
        self.at = [columns.index(name) for name in params]  # each parameter's field
        self.results_at = columns.index("results")
        self.pending: list[tuple[Any, ...]] = []
        self.have_pending = trio.Event()
        self.slot_freed = trio.Event()
        self.running = 0

    async def run_job(self, row: tuple[Any, ...]) -> None:
        task, payload = row[1], row[2]  # the same two columns in both claims
        if self.scope:
            with trio.CancelScope():
                result = await HANDLERS[task](payload)
        else:
            result = await HANDLERS[task](payload)
        self.pending.append((*self.fence(row), json.dumps(result)))
        self.running -= 1
        self.have_pending.set()
        self.slot_freed.set()

    async def complete_forever(self) -> None:
        while True:
            if not self.pending:
                self.have_pending = trio.Event()
                await self.have_pending.wait()
                continue
            batch, self.pending = self.pending, []
            await self.flush(batch)

    async def flush(self, batch: list[tuple[Any, ...]]) -> None:
        await self.done_conn.fetch_native(self.complete_sql, self.completion_params(batch))

    def completion_params(self, batch: list[tuple[Any, ...]]) -> list[str]:
        # Array literals, as trioq's completer sends its fences and results (each result's
        # JSON quoted once, by the driver's own element quoting).
        return [
            "{"
            + ",".join(
                [results_element(entry[k]) for entry in batch]
                if k == self.results_at
                else [str(entry[k]) for entry in batch]
            )
            + "}"
            for k in self.at
        ]


# The raw loop's claim returns (id, task, payload, lease_token); its completion takes ids,
# tokens and results (raw-del's: ids and tokens).
RAW_COLUMNS = ("ids", "lease_tokens", "results")


def raw_statements(
    done_conn: Connection, schema: str, queue: str, scope: bool, delete: bool = False
) -> tuple[Worker, bytes, Callable[[int], list[str]]]:
    """The raw loop's statements: its worker, claim and the claim's parameters for `free`;
    with `delete`, its completion that deletes the finished row (`raw-del`'s)."""
    claim_sql = CLAIM_SQL.format(schema=schema).replace("$2", "$2::int").encode()
    complete_sql = (COMPLETE_DELETE_SQL if delete else COMPLETE_SQL).format(schema=schema)
    params = RAW_COLUMNS[:2] if delete else RAW_COLUMNS
    fence = operator.itemgetter(0, 3)
    worker = Worker(done_conn, complete_sql.encode(), scope, fence, RAW_COLUMNS, params)
    return worker, claim_sql, lambda free: [queue, str(free)]


def contract_statements(
    done_conn: Connection, schema: str, contract: str, scope: bool
) -> tuple[Worker, bytes, Callable[[int], list[str]]]:
    """The contract floor's statements, as `raw_statements`; the lease names this worker. Its
    claim returns (id, task, payload, max_attempts, attempt, lease_token), and its completion
    takes each job's attempt beside its token (the fence)."""
    claim_sql, claim_names = contract_floor.native(contract_floor.CLAIM_SQL, schema)
    complete_sql, complete_names = contract_floor.native(CONTRACT_COMPLETIONS[contract], schema)
    columns = ("ids", "attempts", "lease_tokens", "results")
    fence = operator.itemgetter(0, 4, 5)
    worker = Worker(done_conn, complete_sql, scope, fence, columns, complete_names)
    worker_id = str(uuid.uuid4())

    def claim_params(free: int) -> list[str]:
        values = {"limit": str(free), "worker_id": worker_id}
        return [values[name] for name in claim_names]

    return worker, claim_sql, claim_params


class TrioqStatementsWorker(Worker):
    """The floor's worker sending trioq's own hot statements (job_claim_plain,
    job_complete_plain), or a variant's (bench/statement_variants.py), as trioq's driver sends
    them (positional, typed, binary results)."""

    def __init__(
        self, done_conn: Connection, schema: str, scope: bool, variant: Path | None
    ) -> None:
        super().__init__(done_conn, b"", scope, operator.itemgetter(0, 3, 4), LEASES, LEASES)
        sql, self.session, self.tasks = statement_variants.load(variant, schema)
        self.statements = {name: to_positional(text) for name, text in sql.items()}

    async def send(self, conn: Connection, name: str, params: dict[str, Any]) -> list[Any]:
        statement = self.statements[name]
        return await conn.fetch_native(
            statement.text, statement.values(params), typed=True, binary=name in BINARY_RESULTS
        )

    async def flush(self, batch: list[tuple[Any, ...]]) -> None:
        values = dict(zip(LEASES, self.completion_params(batch), strict=True))
        await self.send(self.done_conn, "job_complete_plain", values)


# trioq's completion takes the fences and the results.
LEASES = ("ids", "attempts", "lease_tokens", "results")


async def trioq_statements(
    claim_conn: Connection,
    done_conn: Connection,
    schema: str,
    queue: str,
    scope: bool,
    variant: Path | None,
) -> tuple[Worker, Callable[[int], Awaitable[list[tuple[Any, ...]]]]]:
    """trioq's statements (or `variant`'s) on trioq's tables: the worker and its claim of
    `free` jobs, each row as (id, task, payload, attempt, lease_token)."""
    worker = TrioqStatementsWorker(done_conn, schema, scope, variant)
    for statement in worker.session:
        for conn in (claim_conn, done_conn):
            await conn.fetch_native(statement.encode(), [])
    base = {
        "lookahead": 1.0,
        "queue": queue,
        "tasks": "{" + ",".join(worker.tasks) + "}",
        "task_versions": None,
        "lease_seconds": 30.0,
        "worker_id": uuid.uuid4(),
        "traced": False,
    }
    fields = operator.itemgetter(
        ClaimedRow.id, ClaimedRow.task, ClaimedRow.payload, ClaimedRow.attempt,
        ClaimedRow.lease_token,
    )  # fmt: skip

    async def claim(free: int) -> list[tuple[Any, ...]]:
        rows = await worker.send(claim_conn, "job_claim_plain", {**base, "limit": free})
        return [fields(row) for row in rows if row[ClaimedRow.id] is not None]

    return worker, claim


async def run_worker(
    dsn: str,
    schema: str,
    queue: str,
    batch: int,
    expect: int,
    scope: bool,
    contract: str | None,
    delete: bool = False,
    variant: Path | None = None,
) -> None:
    claim_conn = await connect(dsn)
    done_conn = await connect(dsn)
    claim: Callable[[int], Awaitable[list[tuple[Any, ...]]]]
    if contract == "trioq":
        worker, claim = await trioq_statements(claim_conn, done_conn, schema, queue, scope, variant)
    else:
        if contract is None:
            worker, claim_sql, claim_params = raw_statements(
                done_conn, schema, queue, scope, delete
            )
        else:
            worker, claim_sql, claim_params = contract_statements(
                done_conn, schema, contract, scope
            )
            # The claim deletes the entries it takes by address (`ctid = ANY(...)`), as
            # trioq's ready_ring_take() does, and for the same reason with the same setting:
            # its generic plan is made while the worker polls the empty table before the
            # backlog, and there a sequential scan is the cheaper delete. Kept, it read every
            # entry the drain had left dead at each claim: 4.5 ms a claim of 25 (92 us of
            # server CPU per job, 5 repeats).
            await claim_conn.fetch_native(b"SET enable_seqscan = off", [])

        async def claim(free: int) -> list[tuple[Any, ...]]:
            return await claim_conn.fetch_native(claim_sql, claim_params(free), binary=True)

    print("ready", flush=True)
    claimed = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.complete_forever)
        while claimed < expect:
            free = batch - worker.running
            if free == 0:
                worker.slot_freed = trio.Event()
                await worker.slot_freed.wait()
                continue
            rows = await claim(free)
            if not rows:
                await trio.sleep(IDLE_POLL_SECONDS)
                continue
            claimed += len(rows)
            worker.running += len(rows)
            for row in rows:
                nursery.start_soon(worker.run_job, row)
        # Stay alive (and silent) so the harness can read this process's CPU and peak RSS.
        await trio.sleep_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trio_floor", description=__doc__)
    parser.add_argument("--dsn", required=True, help="a libpq conninfo")
    parser.add_argument("--schema", required=True)
    parser.add_argument("--queue", default="default")
    parser.add_argument("--batch", type=int, default=25, help="slots")
    parser.add_argument("--expect", type=int, required=True, help="stop claiming after this many")
    parser.add_argument(
        "--scope",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="each handler in a cancel scope of its own, as trioq's (default: on)",
    )
    parser.add_argument(
        "--contract",
        choices=[*sorted(CONTRACT_COMPLETIONS), "trioq"],
        default=None,
        help="drain the contract floor's tables (bench/contract_floor.py), the outcome kept or"
        " the record deleted (default: the raw loop's table and statements)",
    )
    parser.add_argument(
        "--delete",
        action="store_true",
        help="on the raw loop's table, its completion that deletes the row (raw-del's)",
    )
    parser.add_argument(
        "--variant",
        type=Path,
        default=None,
        help="with --contract trioq: a variant's directory (bench/statement_variants.py) whose"
        " statements the worker sends in place of trioq's",
    )
    args = parser.parse_args(argv)
    trio.run(
        run_worker,
        args.dsn,
        args.schema,
        args.queue,
        args.batch,
        args.expect,
        args.scope,
        args.contract,
        args.delete,
        args.variant,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

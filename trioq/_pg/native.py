"""One statement on a psycopg connection driven from trio itself, without a worker thread.

`Connection` normally runs each call in a worker thread (trioq/_pg/threads.py): a thread start
and a wake-up of the trio loop per statement, about 60-140 us of a single enqueue's 300-600 us
on a durable cluster (bench/RESULTS.md, "Design decisions"). Every named
statement with parameters (the driver's `_query`: claims, checkpoints, renewals, enqueues) goes
through this module instead, which does the same work on libpq's non-blocking API
(psycopg's public `pq` layer, which psycopg itself already set non-blocking at connect): send,
flush while the socket is writable, read while it is readable, all with trio's own I/O waits.
psycopg has no trio support of its own (its async connection needs asyncio), which is why this
is hand-written.

Cancellation keeps `Connection`'s promise: when the caller is cancelled after the statement was
sent, the server is asked to cancel it (repeatedly, backing off, as threads.py does) while the
results are read to the end, shielded; only then is the cancellation re-raised, so the
connection is idle and usable afterwards (in a transaction, the transaction has failed).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import trio
from psycopg import abc, pq
from psycopg.adapt import AdaptersMap, Buffer, PyFormat, Transformer
from psycopg.rows import TupleRow
from psycopg.types.json import JsonbBinaryLoader, JsonbLoader

from .._core.codec import loads_or_undecodable
from .threads import cancel_until_done

logger = logging.getLogger("trioq.pg")

RawConnection = psycopg.Connection[TupleRow]

_AUTO, _TEXT = PyFormat.AUTO, PyFormat.TEXT
_OK = frozenset({pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK, pq.ExecStatus.EMPTY_QUERY})
_BINARY = pq.Format.BINARY
_BYTEA_OID = 17  # the loader that copies a value's bytes (`_rows_decoded_last`)

_loads = loads_or_undecodable  # one undecodable row fails its job, not the statement


class _JsonbLoader(JsonbLoader):
    """jsonb (text format) as psycopg's loader returns it, cheaper for the common payloads.

    psycopg's loader calls `json.loads(bytes)`, which first runs `json.detect_encoding` in
    Python: with the `{}` payload most jobs carry that is 1.5 us per claimed row, more than any
    other column. `{}` and `null` are answered without parsing (a new dict each time: handlers
    may mutate their payload); anything else is decoded as UTF-8 and parsed, which is what
    `json.loads(bytes)` does for any text Postgres sends (it has no NUL and no BOM, the only
    things that make `detect_encoding` answer otherwise)."""

    def load(self, data: Buffer) -> Any:
        if data == b"{}":
            return {}
        if data == b"null":
            return None
        return _loads(bytes(data).decode("utf-8", "surrogatepass"))


class _JsonbBinaryLoader(JsonbBinaryLoader):
    """jsonb in binary format: a version byte (1), then the same text."""

    def load(self, data: Buffer) -> Any:
        if data == b"\x01{}":
            return {}
        if not data or data[0] != 1:
            return super().load(data)  # psycopg's own error (or its answer) for anything else
        return _loads(bytes(data[1:]).decode("utf-8", "surrogatepass"))


class _AdaptContext:
    """The session's adapters with trioq's jsonb loaders on top (psycopg's `AdaptContext`): a
    copy, so the connection's own cursors keep psycopg's loaders."""

    def __init__(self, raw: RawConnection) -> None:
        self.connection = raw
        self.adapters = AdaptersMap(raw.adapters)
        self.adapters.register_loader("jsonb", _JsonbLoader)
        self.adapters.register_loader("jsonb", _JsonbBinaryLoader)


class NativeStatements:
    """Per-connection state: the statements this session has prepared (as far as it knows: see
    `fetch` for psycopg's DEALLOCATE ALL).

    A name is never used twice: a PREPARE cancelled or failed after it was sent may or may not
    exist on the server, so the next attempt takes a new name (found by the random
    cancellation test: "prepared statement trioq_0 already exists").
    """

    def __init__(self) -> None:
        self._names: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        self._attempts = 0
        self._transformer: abc.Transformer | None = None
        # trio's clock when the last statement's results had all arrived, before they were
        # decoded (a claim of 200 rows with history takes ~10 ms to decode here).
        self.replied_at = 0.0

    def transformer(self, raw: RawConnection) -> abc.Transformer:
        """One Transformer per session, as a psycopg cursor keeps one across its executes: it
        caches the dumper and loader of each type (a fresh one looks each up again, about
        1.5 us per parameter and per column of a claim round)."""
        if self._transformer is None:
            self._transformer = Transformer(_AdaptContext(raw))
        return self._transformer

    def known(self, key: tuple[bytes, tuple[int, ...]]) -> bytes | None:
        return self._names.get(key)

    def new_name(self) -> bytes:
        self._attempts += 1
        return f"trioq_{self._attempts - 1}".encode()

    def prepared(self, key: tuple[bytes, tuple[int, ...]], name: bytes) -> None:
        self._names[key] = name

    def forget_all(self) -> None:
        self._names.clear()


async def fetch(
    raw: RawConnection,
    statements: NativeStatements,
    sql: bytes,
    params: Sequence[Any],
    cancel_on_server: Callable[[], None],
    *,
    typed: bool = False,
    binary: bool = False,
    last_row_only: tuple[int, ...] = (),
) -> list[tuple[Any, ...]]:
    """Run `sql` (`$n` placeholders) and return its rows.

    `last_row_only` names columns whose value the caller reads from the last row alone (a
    statement's own column repeated on every row): on the other rows they hold the undecoded
    bytes.

    `binary` asks for every result column in binary format: the same Python values (psycopg
    has a binary loader for each built-in type; a type without one would come back as bytes,
    so only statements whose columns are all built-in ask), decoded with less work (no text
    parsing of timestamps, uuids and integers: ~25 us less per claim of 25 rows).

    Untyped (the default), every parameter is sent as text without a type, so each must be cast
    in the SQL. `typed` sends them as psycopg's own cursor would (its dumpers choose each value's
    type and format, binary where it has one), so a statement written for psycopg runs here
    unchanged; a value's type can depend on the value (psycopg dumps 25 as int2 and 40,000 as
    int4), so a statement is prepared once per set of parameter types, as psycopg does too.

    Outside a transaction the statement is prepared once per session and re-prepared if it has
    gone: psycopg sends DEALLOCATE ALL after a ROLLBACK, DROP, ALTER or DISCARD ALL it ran
    (found by the random cancellation test), and an EXECUTE of a missing statement fails before
    running anything, so it is simply sent again. Inside a transaction such a failure would
    abort the caller's transaction, so the statement is sent unprepared there (planned each
    time), and always with `prepare_threshold=None` (PgBouncer in transaction mode).
    """
    await trio.lowlevel.checkpoint_if_cancelled()  # already cancelled: send nothing
    pgconn = raw.pgconn
    transformer = statements.transformer(raw)
    values = transformer.dump_sequence(params, [_AUTO if typed else _TEXT] * len(params))
    types = transformer.types if typed else None
    formats = transformer.formats if typed else None
    result_format = _BINARY if binary else pq.Format.TEXT
    if raw.prepare_threshold is None or pgconn.transaction_status != pq.TransactionStatus.IDLE:
        pgconn.send_query_params(
            sql, values, param_types=types, param_formats=formats, result_format=result_format
        )
        results = await _results(pgconn, cancel_on_server, statements)
        return _rows(transformer, results, raw, last_row_only)
    key = (sql, tuple(types or ()))
    for _ in range(2):
        name = statements.known(key)
        if name is None:
            name = statements.new_name()
            pgconn.send_prepare(name, sql, param_types=types)
            _rows(transformer, await _results(pgconn, cancel_on_server, statements), raw)
            statements.prepared(key, name)
        pgconn.send_query_prepared(name, values, param_formats=formats, result_format=result_format)
        results = await _results(pgconn, cancel_on_server, statements)
        if not _missing_statement(results):
            break
        statements.forget_all()  # deallocated behind our back: prepare again, once
    return _rows(transformer, results, raw, last_row_only)


def _missing_statement(results: list[pq.abc.PGresult]) -> bool:
    for result in results:  # a loop, not any(genexpr): this runs on every hot statement
        if result.status == pq.ExecStatus.FATAL_ERROR and result.error_field(
            pq.DiagnosticField.SQLSTATE
        ) in (
            b"26000",  # no such statement
            # "cached plan must not change result type": a migration changed a column the
            # statement returns (0032 made 14 of them domains) under a running worker; outside
            # a transaction nothing ran, so preparing again is safe.
            b"0A000",
        ):
            return True
    return False


def _rows(
    transformer: abc.Transformer,
    results: list[pq.abc.PGresult],
    raw: RawConnection,
    last_row_only: tuple[int, ...] = (),
) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for result in results:
        if result.status not in _OK:
            raise psycopg.errors.error_from_result(result, encoding=raw.info.encoding)
        if result.status == pq.ExecStatus.TUPLES_OK:
            transformer.set_pgresult(result)
            try:
                count = result.ntuples
                if last_row_only and count > 1:
                    rows = _rows_decoded_last(transformer, result, count, last_row_only)
                else:
                    rows = transformer.load_rows(0, count, tuple)
            finally:
                # The transformer lives as long as the session: let go of the result, or an
                # idle pooled connection would keep its last (perhaps large) one in memory.
                transformer.set_pgresult(None)
    return rows


def _rows_decoded_last(
    transformer: abc.Transformer, result: pq.abc.PGresult, count: int, columns: tuple[int, ...]
) -> list[tuple[Any, ...]]:
    """The rows of `result` (set on `transformer`), `columns` decoded on the last row only:
    on the others they are loaded as bytea (their bytes, as they came)."""
    last = transformer.load_rows(count - 1, count, tuple)
    types = [result.ftype(column) for column in range(result.nfields)]
    for column in columns:
        types[column] = _BYTEA_OID
    transformer.set_loader_types(types, pq.Format(result.fformat(0)))
    rows = transformer.load_rows(0, count - 1, tuple)
    rows += last
    return rows


async def _results(
    pgconn: pq.abc.PGconn, cancel_on_server: Callable[[], None], statements: NativeStatements
) -> list[pq.abc.PGresult]:
    try:
        results = await _communicate(pgconn)
        statements.replied_at = trio.current_time()
        return results
    except BaseException:  # trio.Cancelled, KeyboardInterrupt, a lost connection
        sent = pgconn.transaction_status == pq.TransactionStatus.ACTIVE
        if pgconn.status == pq.ConnStatus.OK and sent:
            with trio.CancelScope(shield=True):
                await _drain_cancelled(pgconn, cancel_on_server)
        raise


async def _communicate(pgconn: pq.abc.PGconn) -> list[pq.abc.PGresult]:
    """Flush what was sent, then read every result of it (psycopg's own order of calls)."""
    while pgconn.flush() != 0:
        await trio.lowlevel.wait_writable(pgconn.socket)
    results: list[pq.abc.PGresult] = []
    while True:
        while pgconn.is_busy():
            await trio.lowlevel.wait_readable(pgconn.socket)
            pgconn.consume_input()  # notifications stay queued in libpq for psycopg to deliver
        result = pgconn.get_result()
        if result is None:
            return results
        results.append(result)


async def _drain_cancelled(pgconn: pq.abc.PGconn, cancel_on_server: Callable[[], None]) -> None:
    done = trio.Event()

    async def drain() -> None:
        try:
            await _communicate(pgconn)
        except Exception as exc:  # a broken connection: the pool replaces it
            logger.debug("reading a cancelled statement's results failed: %r", exc)
        finally:
            done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        with contextlib.suppress(Exception):
            await cancel_until_done(done, cancel_on_server)

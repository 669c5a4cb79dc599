"""Candidate storage layouts under a pinned horizon: a PROTOTYPE replay on minimal tables.

Run once (not part of the test suite): `python -m bench.layouts [--pinned-jobs 120000]`.

The question: which layout keeps a claim's cost flat while another session holds a snapshot
open (a nightly `pg_dump`, an analytics query)? Under a pinned horizon no dead row version
can be removed, so a claim that scans an index in claim order steps over every entry of every
job claimed since the pin: its cost grows with the time the horizon has been pinned (measured
on trioq's own table: pickup p95 46.7 s after 420 s at 800 jobs/s). This replay runs the same
job flow through each layout's three statements (insert a batch, claim it, complete it) on one
session, with nothing else between them, and reports each statement's time per window of jobs:
- clean: `--clean-jobs` jobs, nothing held;
- pinned: `--pinned-jobs` jobs while another session holds a REPEATABLE READ snapshot (with
  `--locks`, also ACCESS SHARE on every table of the layout, as `pg_dump` does: nothing can be
  truncated then);
- after: `--clean-jobs` jobs once it has committed.

The layouts (each on its own minimal tables, no trioq code involved):
- `inplace`: one row per job updated in place (claim: state running; completion: state
  completed with its result, the row kept): trioq's shape, the `raw-keep` floor's table.
- `delete`: as `inplace`, the completion DELETEs the row (graphile-worker's shape, the raw floor).
- `move`: a row per job and per phase: `ready` (claim order), `running` (lease), `done`
  (results, append-only). The claim deletes from ready and inserts into running in one
  statement; the completion deletes from running and inserts into done.
- `segments`: as `move`, with `ready` LIST-partitioned into a ring of slots. Inserts go to the
  current slot; every `--segment-jobs` jobs the slot is sealed and the next free one becomes
  current. The claim scans only the live slots (`slot = ANY($live)`, pruned at execution), so
  it never steps over the dead entries of a drained slot. A sealed slot is drained once no
  transaction older than its seal is in flight and it holds no row; it is then TRUNCATEd
  (NOWAIT: a `pg_dump` holding its lock only postpones it) and freed for reuse. With no free
  slot, the oldest drained one is reused as it is, and the replay counts it.
- `part-*`: `segments`' ring as lanes of one `jobs` LIST-partitioned by lane (0..N-1 the
  slots, -1 running, -2 done): the claim and the completion are UPDATEs of the lane, moved
  between partitions by PostgreSQL. `part-any` names the live slots as `= ANY($1)`, `part-in`
  as `IN ($1..$4)`, `part-lit` as literals (one prepared statement per live set); `-g` forces
  generic plans (pruning at execution). `--lookups N` runs N readers of the parent by id
  during the replay (their generic plans lock every partition: the ring's NOWAIT truncations
  they refuse are counted). `bench.partition_hazards` measures the rest of that design.

Reported per window: mean ms per claim, completion and insert statement, microseconds per job
for the three together, and at the end of each phase the dead tuples and size of the relations
the claim scans.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import psycopg
from psycopg import sql

from bench.harness import open_database

Conn = psycopg.Connection[tuple[Any, ...]]
BATCH = 25
WINDOW_JOBS = 10_000
RESULTS = Path(__file__).resolve().parent / "results_layouts.json"


def run_sql(conn: Conn, schema: str, text: str, params: Any = None) -> list[tuple[Any, ...]]:
    cursor = conn.execute(text.replace("{s}", schema), params)
    return cursor.fetchall() if cursor.description else []


@attrs.define(eq=False)
class Layout:
    """One candidate: its tables and its three statements."""

    name: str
    install_sql: str
    insert_sql: str
    claim_sql: str
    complete_sql: str
    claim_relations: tuple[str, ...]

    def install(self, conn: Conn, schema: str) -> None:
        run_sql(conn, schema, self.install_sql)

    def insert(self, conn: Conn, schema: str, count: int) -> None:
        run_sql(conn, schema, self.insert_sql, (count,))

    def claim(self, conn: Conn, schema: str, limit: int) -> list[tuple[Any, ...]]:
        return run_sql(conn, schema, self.claim_sql, (limit,))

    def complete(self, conn: Conn, schema: str, rows: list[tuple[Any, ...]]) -> None:
        ids = [row[0] for row in rows]
        tokens = [row[1] for row in rows]
        results = ['{"ok": true}'] * len(rows)
        run_sql(conn, schema, self.complete_sql, (ids, tokens, results))

    def maintain(self, conn: Conn, schema: str) -> dict[str, int]:
        return {}

    def tables(self) -> tuple[str, ...]:
        return self.claim_relations


INPLACE_INSTALL = """
CREATE TABLE {s}.jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL DEFAULT 'default',
    state text NOT NULL DEFAULT 'ready',
    priority smallint NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL DEFAULT now(),
    payload jsonb NOT NULL DEFAULT '{}',
    lease_token uuid,
    started_at timestamptz,
    result jsonb,
    finished_at timestamptz
);
CREATE INDEX jobs_ready_idx ON {s}.jobs (queue, priority, run_at, id) WHERE state = 'ready';
"""
INPLACE_INSERT = "INSERT INTO {s}.jobs (payload) SELECT '{}' FROM generate_series(1, %s)"
INPLACE_CLAIM = """
WITH c AS MATERIALIZED (
    SELECT id FROM {s}.jobs WHERE queue = 'default' AND state = 'ready' AND run_at <= now()
    ORDER BY priority, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED
)
UPDATE {s}.jobs j SET state = 'running', lease_token = gen_random_uuid(), started_at = now()
FROM c WHERE j.id = c.id RETURNING j.id, j.lease_token, j.payload
"""
INPLACE_COMPLETE = """
UPDATE {s}.jobs j SET state = 'completed', result = d.result::jsonb, finished_at = now(),
    lease_token = NULL
FROM unnest(%s::bigint[], %s::uuid[], %s::text[]) AS d(id, lease_token, result)
WHERE j.id = d.id AND j.lease_token = d.lease_token AND j.state = 'running'
"""
DELETE_COMPLETE = """
DELETE FROM {s}.jobs j USING unnest(%s::bigint[], %s::uuid[], %s::text[]) AS d(id, token, r)
WHERE j.id = d.id AND j.lease_token = d.token AND j.state = 'running'
"""

MOVE_TABLES = """
CREATE TABLE {s}.running (
    id bigint PRIMARY KEY,
    queue text NOT NULL,
    payload jsonb NOT NULL,
    lease_token uuid NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    started_at timestamptz NOT NULL
);
CREATE INDEX running_lease_idx ON {s}.running (lease_expires_at);
CREATE TABLE {s}.done (
    id bigint NOT NULL,
    queue text NOT NULL,
    result jsonb,
    started_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL
);
CREATE INDEX done_id_idx ON {s}.done (id);
"""
MOVE_INSTALL = (
    """
CREATE SEQUENCE {s}.job_ids;
CREATE TABLE {s}.ready (
    id bigint PRIMARY KEY DEFAULT nextval('{s}.job_ids'),
    queue text NOT NULL DEFAULT 'default',
    priority smallint NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL DEFAULT now(),
    payload jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX ready_claim_idx ON {s}.ready (queue, priority, run_at, id);
"""
    + MOVE_TABLES
)
MOVE_INSERT = "INSERT INTO {s}.ready (payload) SELECT '{}' FROM generate_series(1, %s)"
MOVE_CLAIM = """
WITH c AS MATERIALIZED (
    SELECT id FROM {s}.ready WHERE queue = 'default' AND run_at <= now()
    ORDER BY priority, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED
), taken AS (
    DELETE FROM {s}.ready r USING c WHERE r.id = c.id RETURNING r.id, r.queue, r.payload
)
INSERT INTO {s}.running (id, queue, payload, lease_token, lease_expires_at, started_at)
SELECT id, queue, payload, gen_random_uuid(), now() + interval '30 seconds', now() FROM taken
RETURNING id, lease_token, payload
"""
MOVE_COMPLETE = """
WITH finished AS (
    DELETE FROM {s}.running j USING unnest(%s::bigint[], %s::uuid[], %s::text[])
        AS d(id, token, result)
    WHERE j.id = d.id AND j.lease_token = d.token
    RETURNING j.id, j.queue, j.started_at, d.result
)
INSERT INTO {s}.done (id, queue, result, started_at, finished_at)
SELECT id, queue, result::jsonb, started_at, now() FROM finished
"""

SEGMENTS_TABLE = (
    """
CREATE SEQUENCE {s}.job_ids;
CREATE TABLE {s}.ready (
    slot smallint NOT NULL,
    id bigint NOT NULL DEFAULT nextval('{s}.job_ids'),
    queue text NOT NULL DEFAULT 'default',
    priority smallint NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL DEFAULT now(),
    payload jsonb NOT NULL DEFAULT '{}'
) PARTITION BY LIST (slot);
CREATE INDEX ready_claim_idx ON {s}.ready (queue, priority, run_at, id);
"""
    + MOVE_TABLES
)


def segments_install(slots: int) -> str:
    return SEGMENTS_TABLE + "".join(
        f"CREATE TABLE {{s}}.ready_{slot} PARTITION OF {{s}}.ready FOR VALUES IN ({slot});\n"
        for slot in range(slots)
    )


SEGMENTS_INSERT = (
    "INSERT INTO {s}.ready (slot, payload) SELECT %s, '{}' FROM generate_series(1, %s)"
)
LIVE_SLOTS = 4  # slots a claim can scan: as equality parameters, PostgreSQL prunes the others
SEGMENTS_CLAIM = """
WITH c AS MATERIALIZED (
    SELECT tableoid AS t, ctid AS c FROM {s}.ready
    WHERE slot IN (%(a)s, %(b)s, %(c)s, %(d)s) AND queue = 'default' AND run_at <= now()
    ORDER BY priority, run_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
), taken AS (
    DELETE FROM {s}.ready r USING c
    WHERE r.tableoid = c.t AND r.ctid = c.c AND r.slot IN (%(a)s, %(b)s, %(c)s, %(d)s)
    RETURNING r.id, r.queue, r.payload
)
INSERT INTO {s}.running (id, queue, payload, lease_token, lease_expires_at, started_at)
SELECT id, queue, payload, gen_random_uuid(), now() + interval '30 seconds', now() FROM taken
RETURNING id, lease_token, payload
"""


@attrs.define(eq=False)
class Segments(Layout):
    """`move` with a ring of ready slots; the ring's bookkeeping lives in the replay's memory
    (a real design keeps it in a small table the statements read)."""

    segment_jobs: int = 10_000
    slots: int = 16
    current: int = 0
    inserted_in_current: int = 0
    #: slot -> the txid horizon at its seal (drained once every older transaction has ended)
    sealed: dict[int, int] = attrs.Factory(dict)
    drained: list[int] = attrs.Factory(list)  # oldest first: drained, not yet truncated
    free: list[int] = attrs.Factory(list)

    counts: dict[str, int] = attrs.Factory(
        lambda: {
            "sealed": 0,
            "drained": 0,
            "truncated": 0,
            "refused": 0,
            "reused_untruncated": 0,
        }
    )

    def install(self, conn: Conn, schema: str) -> None:
        run_sql(conn, schema, segments_install(self.slots))
        self.free = list(range(1, self.slots))

    def live(self) -> list[int]:
        return [self.current, *self.sealed]

    def insert(self, conn: Conn, schema: str, count: int) -> None:
        run_sql(conn, schema, self.insert_sql, (self.current, count))
        self.inserted_in_current += count

    def claim(self, conn: Conn, schema: str, limit: int) -> list[tuple[Any, ...]]:
        live = self.live()
        assert len(live) <= LIVE_SLOTS, f"{len(live)} live slots"
        a, b, c, d = (live + [self.current] * LIVE_SLOTS)[:LIVE_SLOTS]
        params = {"a": a, "b": b, "c": c, "d": d, "limit": limit}
        return run_sql(conn, schema, self.claim_sql, params)

    def maintain(self, conn: Conn, schema: str) -> dict[str, int]:
        if self.inserted_in_current >= self.segment_jobs:
            self.seal(conn, schema)
        self.drain(conn, schema)
        return self.counts

    def seal(self, conn: Conn, schema: str) -> None:
        (horizon,) = run_sql(conn, schema, "SELECT txid_current()")[0]
        self.sealed[self.current] = int(horizon)
        self.counts["sealed"] += 1
        if self.free:
            self.current = self.free.pop(0)
        else:  # nothing truncated since: reuse the oldest drained slot, dead entries and all
            self.current = self.drained.pop(0)
            self.counts["reused_untruncated"] += 1
        self.inserted_in_current = 0

    def drain(self, conn: Conn, schema: str) -> None:
        (oldest,) = run_sql(conn, schema, "SELECT txid_snapshot_xmin(txid_current_snapshot())")[0]
        for slot, horizon in list(self.sealed.items()):
            if int(oldest) <= horizon:
                continue
            table = self.slot_table(slot)
            empty = run_sql(conn, schema, f"SELECT NOT EXISTS (SELECT 1 FROM {{s}}.{table})")
            if empty[0][0]:
                del self.sealed[slot]
                self.drained.append(slot)
                self.counts["drained"] += 1
        for slot in list(self.drained):
            if self.truncate(conn, schema, slot):
                self.drained.remove(slot)
                self.free.append(slot)
                self.counts["truncated"] += 1

    def truncate(self, conn: Conn, schema: str, slot: int) -> bool:
        table = sql.Identifier(schema, self.slot_table(slot))
        try:
            with conn.transaction():
                conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE NOWAIT").format(table))
                conn.execute(sql.SQL("TRUNCATE {}").format(table))
        except psycopg.errors.LockNotAvailable:
            self.counts["refused"] += 1
            return False
        return True

    def slot_table(self, slot: int) -> str:
        return f"ready_{slot}"

    def tables(self) -> tuple[str, ...]:
        return tuple(self.slot_table(slot) for slot in range(self.slots))


PARTITIONED_TABLE = """
CREATE SEQUENCE {s}.job_ids;
CREATE TABLE {s}.jobs (
    lane int NOT NULL,
    id bigint NOT NULL DEFAULT nextval('{s}.job_ids'),
    queue text NOT NULL DEFAULT 'default',
    state text NOT NULL DEFAULT 'ready',
    priority smallint NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL DEFAULT now(),
    payload jsonb NOT NULL DEFAULT '{}',
    lease_token uuid,
    lease_expires_at timestamptz,
    started_at timestamptz,
    result jsonb,
    finished_at timestamptz,
    cancel_requested boolean NOT NULL DEFAULT false
) PARTITION BY LIST (lane);
CREATE INDEX jobs_id_idx ON {s}.jobs (id);
CREATE TABLE {s}.jobs_running PARTITION OF {s}.jobs FOR VALUES IN (-1);
CREATE INDEX jobs_running_lease_idx ON {s}.jobs_running (lease_expires_at);
"""


def partitioned_install(slots: int, done_lanes: int = 1) -> str:
    """`jobs` LIST-partitioned by lane: 0..slots-1 the ready ring (each with the claim index),
    -1 running, -2, -3, ... done (one lane per day; the replay writes only -2). A primary key
    must include the partition key, so `id` is unique per partition only: the index on (id)
    is a plain one, on every partition."""
    ring = "".join(
        f"CREATE TABLE {{s}}.jobs_{slot} PARTITION OF {{s}}.jobs FOR VALUES IN ({slot});\n"
        f"CREATE INDEX jobs_{slot}_claim_idx ON {{s}}.jobs_{slot} (queue, priority, run_at, id);\n"
        for slot in range(slots)
    )
    done = "".join(
        f"CREATE TABLE {{s}}.jobs_done_{day} PARTITION OF {{s}}.jobs FOR VALUES IN ({-2 - day});\n"
        for day in range(done_lanes)
    )
    return PARTITIONED_TABLE + ring + done


PARTITIONED_INSERT = (
    "INSERT INTO {s}.jobs (lane, payload) SELECT %s, '{}' FROM generate_series(1, %s)"
)
#: `{live}`: the live-slot predicate's right-hand side, one of PARTITIONED_LIVE's
PARTITIONED_CLAIM = """
UPDATE {s}.jobs j SET lane = -1, state = 'running', lease_token = gen_random_uuid(),
    lease_expires_at = now() + interval '30 seconds', started_at = now()
WHERE j.lane {live} AND j.id IN (
    SELECT id FROM {s}.jobs WHERE lane {live} AND queue = 'default' AND run_at <= now()
    ORDER BY priority, run_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
RETURNING j.id, j.lease_token, j.payload
"""
PARTITIONED_LIVE = {
    # one array parameter: `lane = ANY($1)`
    "any": "= ANY(%(live)s)",
    # four scalar parameters, as `segments` names its slots: `lane IN ($1, $2, $3, $4)`
    "in": "IN (%(a)s, %(b)s, %(c)s, %(d)s)",
    # the live slots as integer literals in the text: one prepared statement per live set
    "lit": "IN ({literals})",
}
PARTITIONED_COMPLETE = """
UPDATE {s}.jobs j SET lane = -2, state = 'completed', result = d.result::jsonb,
    finished_at = now(), lease_token = NULL
FROM unnest(%s::bigint[], %s::uuid[], %s::text[]) AS d(id, token, result)
WHERE j.lane = -1 AND j.id = d.id AND j.lease_token = d.token
"""


@attrs.define(eq=False)
class Partitioned(Segments):
    """The ring of `segments` as lanes of one partitioned `jobs`: a claim or a completion is an
    UPDATE of the lane, which PostgreSQL runs as a delete from one partition and an insert
    into another (Oban Pro's DynamicPartitioner shape)."""

    live_form: str = "any"
    #: plan_cache_mode=force_generic_plan on the replay's session: the parameter forms are
    #: pruned at execution (left to `auto`, the server re-plans them at every call)
    generic: bool = False

    def install(self, conn: Conn, schema: str) -> None:
        run_sql(conn, schema, partitioned_install(self.slots))
        if self.generic:
            conn.execute("SET plan_cache_mode = force_generic_plan")
        self.free = list(range(1, self.slots))

    def claim(self, conn: Conn, schema: str, limit: int) -> list[tuple[Any, ...]]:
        live = self.live()
        params: dict[str, Any] = {"limit": limit}
        if self.live_form == "lit":
            literals = ", ".join(str(int(slot)) for slot in sorted(live))
            form = PARTITIONED_LIVE["lit"].format(literals=literals)
        else:
            form = PARTITIONED_LIVE[self.live_form]
            if self.live_form == "any":
                params["live"] = live
            else:
                assert len(live) <= LIVE_SLOTS, f"{len(live)} live slots"
                a, b, c, d = (live + [self.current] * LIVE_SLOTS)[:LIVE_SLOTS]
                params.update(a=a, b=b, c=c, d=d)
        return run_sql(conn, schema, self.claim_sql.replace("{live}", form), params)

    def slot_table(self, slot: int) -> str:
        return f"jobs_{slot}"

    def lookup_sql(self, schema: str) -> str:
        return f"SELECT id, state, lane FROM {schema}.jobs WHERE id = %s"


def layouts(segment_jobs: int, slots: int) -> dict[str, Callable[[], Layout]]:
    return {
        "inplace": lambda: Layout(
            "inplace", INPLACE_INSTALL, INPLACE_INSERT, INPLACE_CLAIM, INPLACE_COMPLETE, ("jobs",)
        ),
        "delete": lambda: Layout(
            "delete", INPLACE_INSTALL, INPLACE_INSERT, INPLACE_CLAIM, DELETE_COMPLETE, ("jobs",)
        ),
        "move": lambda: Layout(
            "move", MOVE_INSTALL, MOVE_INSERT, MOVE_CLAIM, MOVE_COMPLETE, ("ready", "running")
        ),
        "segments": lambda: Segments(
            "segments",
            "",
            SEGMENTS_INSERT,
            SEGMENTS_CLAIM,
            MOVE_COMPLETE,
            ("ready",),
            segment_jobs=segment_jobs,
            slots=slots,
        ),
        **{
            f"part-{form}{suffix}": functools.partial(
                partitioned, form, segment_jobs, slots, generic=bool(suffix)
            )
            for form in PARTITIONED_LIVE
            for suffix in ("", "-g")
            if not (form == "lit" and suffix)
        },
    }


def partitioned(form: str, segment_jobs: int, slots: int, *, generic: bool) -> Partitioned:
    return Partitioned(
        f"part-{form}{'-g' if generic else ''}",
        "",
        PARTITIONED_INSERT,
        PARTITIONED_CLAIM,
        PARTITIONED_COMPLETE,
        ("jobs",),
        segment_jobs=segment_jobs,
        slots=slots,
        live_form=form,
        generic=generic,
    )


def relation_stats(conn: Conn, schema: str, tables: tuple[str, ...]) -> dict[str, int]:
    conn.execute("SELECT pg_stat_force_next_flush()")  # this session's counts, flushed when idle
    conn.execute("SELECT pg_stat_clear_snapshot()")
    rows = run_sql(
        conn,
        schema,
        "SELECT coalesce(sum(n_dead_tup), 0), coalesce(sum(pg_total_relation_size(relid)), 0) "
        "FROM pg_stat_user_tables WHERE schemaname = %s AND relname = ANY(%s)",
        (schema, list(tables)),
    )
    dead, size = rows[0]
    return {"dead_tuples": int(dead), "bytes": int(size)}


def run_phase(
    conn: Conn, schema: str, layout: Layout, jobs: int, phase: str
) -> list[dict[str, Any]]:
    windows: list[dict[str, Any]] = []
    times: dict[str, list[float]] = {"insert": [], "claim": [], "complete": []}
    done = 0
    while done < jobs:
        start = time.perf_counter()
        layout.insert(conn, schema, BATCH)
        claimed_at = time.perf_counter()
        rows = layout.claim(conn, schema, BATCH)
        completed_at = time.perf_counter()
        layout.complete(conn, schema, rows)
        end = time.perf_counter()
        times["insert"].append(claimed_at - start)
        times["claim"].append(completed_at - claimed_at)
        times["complete"].append(end - completed_at)
        assert len(rows) == BATCH, f"{layout.name}: claimed {len(rows)} of {BATCH}"
        done += BATCH
        layout.maintain(conn, schema)
        if done % WINDOW_JOBS == 0 or done >= jobs:
            rounds = len(times["claim"])
            windows.append(
                {
                    "phase": phase,
                    "jobs_done": done,
                    **{f"{k}_ms": 1000 * statistics.fmean(v) for k, v in times.items()},
                    "us_per_job": 1e6 * sum(map(sum, times.values())) / (rounds * BATCH),
                }
            )
            times = {key: [] for key in times}
    return windows


def lookup_loop(conninfo: str, statement: str, stop: Any, counter: Any) -> None:
    """A reader of the parent by id, on a generic plan (it locks every partition)."""
    rng = random.Random()
    done = 0
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        while not stop.is_set():
            conn.execute(statement, (rng.randint(1, 200_000),), prepare=True)
            done += 1
    with counter.get_lock():
        counter.value += done


def prepared_plans(conn: Conn) -> list[dict[str, Any]]:
    """Which plans the server chose for this session's prepared statements."""
    rows = conn.execute(
        "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
    ).fetchall()
    return [
        {"statement": " ".join(text.split())[:90], "generic": generic, "custom": custom}
        for text, generic, custom in rows
        if "SKIP LOCKED" in text or "unnest" in text
    ]


def one_layout(
    db_conninfo: str, schema: str, layout: Layout, args: argparse.Namespace
) -> dict[str, Any]:
    with (
        psycopg.connect(db_conninfo, autocommit=True) as conn,
        psycopg.connect(db_conninfo, autocommit=True) as holder,
    ):
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        layout.install(conn, schema)
        readers: list[Any] = []
        context = multiprocessing.get_context("fork")
        stop, lookups = context.Event(), context.Value("q", 0)
        if args.lookups and isinstance(layout, Partitioned):
            for _ in range(args.lookups):
                reader = context.Process(
                    target=lookup_loop,
                    args=(db_conninfo, layout.lookup_sql(schema), stop, lookups),
                )
                reader.start()
                readers.append(reader)
        windows = run_phase(conn, schema, layout, args.clean_jobs, "clean")
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pg_class")
        if args.locks:
            for table in layout.tables():
                holder.execute(
                    sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(
                        sql.Identifier(schema, table)
                    )
                )
        windows += run_phase(conn, schema, layout, args.pinned_jobs, "pinned")
        pinned_stats = relation_stats(conn, schema, layout.tables())
        holder.execute("COMMIT")
        windows += run_phase(conn, schema, layout, args.clean_jobs, "after")
        after_stats = relation_stats(conn, schema, layout.tables())
        counts = dict(layout.maintain(conn, schema))
        plans = prepared_plans(conn)
        stop.set()
        for reader in readers:
            reader.join()
        if readers:
            counts["lookups"] = lookups.value
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    return {
        "layout": layout.name,
        "locks": args.locks,
        "plans": plans,
        "windows": windows,
        "at_release": pinned_stats,
        "at_end": after_stats,
        "ring": counts,
    }


def summarize(result: dict[str, Any]) -> str:
    windows = result["windows"]
    clean = [w for w in windows if w["phase"] == "clean"]
    pinned = [w for w in windows if w["phase"] == "pinned"]
    after = [w for w in windows if w["phase"] == "after"]
    base = statistics.fmean(w["claim_ms"] for w in clean)
    return (
        f"{result['layout']:<9} claim ms clean {base:.3f}, pinned first {pinned[0]['claim_ms']:.3f}"
        f" last {pinned[-1]['claim_ms']:.3f} ({pinned[-1]['claim_ms'] / base:.1f}x),"
        f" after {after[-1]['claim_ms']:.3f}; us/job clean "
        f"{statistics.fmean(w['us_per_job'] for w in clean):.0f} pinned last "
        f"{pinned[-1]['us_per_job']:.0f}; claim-path dead at release "
        f"{result['at_release']['dead_tuples']}, bytes {result['at_release']['bytes']}"
        f" {result['ring'] or ''}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clean-jobs", type=int, default=20_000)
    parser.add_argument("--pinned-jobs", type=int, default=120_000)
    parser.add_argument("--segment-jobs", type=int, default=10_000)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--layouts", default="inplace,delete,move,segments")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--locks", action="store_true", help="the holder locks as pg_dump does")
    parser.add_argument("--durable", action="store_true")
    parser.add_argument(
        "--lookups",
        type=int,
        default=0,
        help="sessions reading the partitioned parent by id (generic plans) during the replay",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    makers = layouts(args.segment_jobs, args.slots)
    results = []
    with open_database(durable=args.durable) as db:
        conninfo = db.conninfo("bench_harness")
        for repeat in range(args.repeats):
            for name in args.layouts.split(","):
                schema = f"layout_{name.replace('-', '_')}_{repeat}"
                result = one_layout(conninfo, schema, makers[name](), args)
                print(summarize(result), flush=True)
                for plan in result["plans"]:
                    print("   ", plan, flush=True)
                results.append(result)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

"""What each guard of the plain claim costs: variants of trioq's two hot statements replayed on
trioq's own tables, one session each, interleaved.

    python -m bench.statement_variants --jobs 10000 --repeats 7 --build /tmp/claims
    python -m bench.statement_variants --jobs 10000 --repeats 7 trioq lean=bench/variants/lean

A variant is a directory: `job_claim_plain.sql` and/or `job_complete_plain.sql` (`{schema}` for
the schema, `%(name)s` for trioq's parameters; a statement left out is trioq's own),
`session.sql` (run on the session first, `{schema}` as in the statements: a variant may drop an
index) and `tasks` (the task names the claim serves, one per line; default `noop`;
`bench/variants/served100` serves 100, the backlog's among them). `trioq` names this
checkout's statements unchanged.
`bench/variants/lean` is the least a claim and a completion do on these tables: the ring's
entries taken in claim order and deleted, a run written per job, the run deleted and the
outcome appended; no probe, no served-task list, no pause or version check, no lock of the
record, no history, no notification, no reply beyond the claimed rows.
`python -m bench.worker_cpu --variant NAME=DIR` drains the same directories live (the trio
floor's worker sending them, bench/trio_floor.py).

`--build DIR` writes the claim's guards as variants of their own, built from one template:
`none` (the lean claim), `all` (every guard: trioq's claim, written again), `with-GUARD` (the
lean claim with that guard alone) and `no-GUARD` (every guard but that one). The guards: `lock` (the
record read in the ring's scan and locked, SKIP LOCKED), `wide` (with `lock`: the record's
columns carried through the statement, not read again at the end), `probe` (the keyed and due
probe that hands the claim to job_claim), `unnest` (a ring scan per served task), `fn` (the
entries deleted by ready_ring_take(), a function for its SET clauses), `filters` (the ring's
low slot, the version list, the pause check, the database clock) and `hist` (a workflow's
history read when it has checkpoints). Each run replays the variants named after it.

Per repeat and variant: a fresh schema; the claim run 8 times on the empty tables first (a
worker's generic plans are made so, before its backlog arrives); `--jobs` ready no-op jobs
inserted, analyzed and checkpointed (bench.hot_path_cost.insert_backlog); then claim 25 and
complete them until none is left. Reported: the replaying backend's CPU per job
(/proc/PID/schedstat) and its ratio to the first variant's in the same repeat (median of the
ratios); the order rotates each repeat.
"""

from __future__ import annotations

import argparse
import statistics
import uuid
from pathlib import Path
from typing import Any

import psycopg

from bench.harness import HARNESS_ROLE, open_database
from bench.hot_path_cost import BATCH, insert_backlog, schedstat_ns
from bench.stats import rotated
from trioq._pg.replies import ClaimedRow
from trioq._sql import queries

STATEMENTS = ("job_claim_plain", "job_complete_plain")
GUARDS = ("lock", "wide", "probe", "unnest", "fn", "filters", "hist")


def claim_sql(guards: frozenset[str]) -> str:
    """The plain claim with `guards` (see the module's docstring), in the variant file's form.
    Its reply has job_claim_plain's columns; with nothing claimed it has no row."""
    lock, wide = "lock" in guards, "lock" in guards and "wide" in guards
    clock = "{schema}.db_now()" if "filters" in guards else "now()"
    where = [
        "c.queue = %(queue)s::text",
        "c.task = served.task" if "unnest" in guards else "c.task = 'noop'",
        f"c.run_at <= {clock}",
    ]
    if "filters" in guards:
        where += [
            "c.slot >= (SELECT coalesce((SELECT s.low FROM {schema}.ready_ring_state s),"
            " 0::smallint))",
            "((SELECT %(task_versions)s::text[]) IS NULL"
            " OR c.task || '@' || c.version = ANY((SELECT %(task_versions)s::text[])::text[]))",
        ]
    record = (
        "j.attempt, j.executions, j.parent_id, j.result_watched, j.task, j.payload,"
        " j.max_attempts, j.created_at, j.cancel_requested, j.version, j.checkpoint_count,"
        " j.queue AS job_queue"
        if wide
        else "j.attempt"
    )
    locked = (
        f"CROSS JOIN LATERAL (SELECT {record} FROM {{schema}}.job_rows j"
        " WHERE j.id = c.id AND j.phase = 'ready' AND j.filed = c.filed"
        " LIMIT 1 FOR UPDATE OF j SKIP LOCKED) AS job"
        if lock
        else ""
    )
    scan = (
        f"SELECT c.ctid AS entry, c.id, c.priority, c.run_at{', job.*' if lock else ''}"
        f" FROM {{schema}}.ready_ring c {locked} WHERE {' AND '.join(where)}"
        " ORDER BY c.priority, c.run_at, c.id LIMIT %(limit)s::int FOR UPDATE OF c SKIP LOCKED"
    )
    if "unnest" in guards:
        scan = (
            "SELECT per_task.* FROM unnest((SELECT %(tasks)s::text[])) AS served(task)"
            f" CROSS JOIN LATERAL ({scan}) AS per_task"
        )
    conditions = []
    if "probe" in guards:
        conditions.append("NOT (SELECT blocked FROM probe)")
    if "filters" in guards:
        conditions.append(
            "NOT EXISTS (SELECT 1 FROM {schema}.queue_pauses p"
            " WHERE p.queue = (SELECT %(queue)s::text))"
        )
    if "unnest" in guards or conditions:
        kept = f"WHERE {' AND '.join(conditions)}" if conditions else ""
        scan = (
            f"SELECT * FROM ({scan}) AS u {kept} ORDER BY priority, run_at, id LIMIT %(limit)s::int"
        )
    parts = []
    if "probe" in guards:
        parts.append(
            "probe AS MATERIALIZED (SELECT keyed.ready AS keyed_ready, due.run_at AS next_due,"
            " keyed.ready OR coalesce(due.run_at <= {schema}.db_now()"
            " + (SELECT %(lookahead)s::float8) * interval '1 second', false) AS blocked"
            " FROM (SELECT (SELECT e.queue FROM {schema}.ready_keyed e"
            " WHERE e.queue = (SELECT %(queue)s::text) ORDER BY e.queue, e.kind, e.key LIMIT 1)"
            " IS NOT NULL AS ready OFFSET 0) AS keyed"
            " LEFT JOIN LATERAL (SELECT d.run_at FROM {schema}.job_due d"
            " WHERE d.queue = (SELECT %(queue)s::text) AND d.run_at IS NOT NULL"
            " ORDER BY d.run_at LIMIT 1) AS due ON true)"
        )
    parts.append(f"candidates AS MATERIALIZED ({scan})")
    if "fn" in guards:
        parts.append(
            "taken AS MATERIALIZED (SELECT CASE WHEN EXISTS (SELECT 1 FROM candidates)"
            " THEN {schema}.ready_ring_take(ARRAY(SELECT entry FROM candidates),"
            " ARRAY(SELECT id FROM candidates)) ELSE 0 END AS n)"
        )
        taken = "candidates t"
    else:
        parts.append(
            "taken AS (DELETE FROM {schema}.ready_ring r"
            " WHERE r.ctid = ANY(ARRAY(SELECT entry FROM candidates))"
            " AND r.id = ANY(ARRAY(SELECT id FROM candidates)) RETURNING r.id)"
        )
        taken = "taken t"
    run_columns = (
        "INSERT INTO {schema}.job_runs (job_id, attempt, lease_token, lease_expires_at,"
        " worker_id, traced, started_at, executions, queue, partition_key, concurrency_key,"
        " parent_id, result_watched)"
    )
    lease = "gen_random_uuid(), now() + %(lease_seconds)s::float8 * interval '1 second'"
    if wide:
        parts.append(
            f"run AS ({run_columns} SELECT t.id, t.attempt + 1, {lease}, %(worker_id)s::uuid,"
            " false, now(), t.executions + 1, t.job_queue, NULL, NULL, t.parent_id,"
            " t.result_watched FROM candidates t RETURNING job_id, attempt, lease_token)"
        )
        rows = "run u JOIN candidates j ON j.id = u.job_id"
        queue, partition_key = "j.job_queue::text", "NULL::text"
    else:
        parts.append(
            f"run AS ({run_columns} SELECT j.id, j.attempt + 1, {lease}, %(worker_id)s::uuid,"
            " false, now(), j.executions + 1, j.queue, NULL, NULL, j.parent_id,"
            f" j.result_watched FROM {taken} JOIN {{schema}}.job_rows j ON j.id = t.id"
            " RETURNING job_id, attempt, lease_token)"
        )
        rows = "run u JOIN {schema}.job_rows j ON j.id = u.job_id"
        queue, partition_key = "j.queue::text", "j.partition_key::text"
    history = (
        "CASE WHEN j.checkpoint_count > 0 THEN (SELECT jsonb_agg(jsonb_build_array(h.position,"
        " h.kind, h.name, h.value) ORDER BY h.position) FROM {schema}.checkpoints h"
        " WHERE h.job_id = j.id) END"
        if "hist" in guards
        else "NULL::jsonb"
    )
    probed = (
        "(SELECT blocked FROM probe), (SELECT keyed_ready FROM probe), 0, now(),"
        " (SELECT next_due FROM probe), NULL::text"
        if "probe" in guards
        else "NULL::bool, NULL::bool, 0, now(), NULL::timestamptz, NULL::text"
    )
    columns = (
        f"j.id, {queue}, j.task::text, j.payload::jsonb, u.attempt, j.max_attempts::int,"
        f" u.lease_token, {partition_key}, j.priority, j.run_at, j.created_at,"
        f" j.cancel_requested, j.version::int, {history}, j.parent_id, NULL::text"
    )
    taken_read = " WHERE (SELECT n FROM taken) >= 0" if "fn" in guards else ""
    return f"WITH {', '.join(parts)} SELECT {probed}, {columns} FROM {rows}{taken_read}\n"


def build(directory: Path) -> list[str]:
    """Write the claim variants (`none`, `all`, `with-GUARD`, `no-GUARD`) under `directory`;
    their names."""
    everything = frozenset(GUARDS)
    variants = {"none": frozenset(), "all": everything}
    for guard in GUARDS:
        alone = {guard, "lock"} if guard == "wide" else {guard}
        variants[f"with-{guard}"] = frozenset(alone)
        variants[f"no-{guard}"] = everything - ({"lock", "wide"} if guard == "lock" else {guard})
    for name, guards in variants.items():
        path = directory / name
        path.mkdir(parents=True, exist_ok=True)
        (path / "job_claim_plain.sql").write_text(claim_sql(guards))
        # the lean claim deletes its entries in the statement, as bench/variants/lean does
        (path / "session.sql").write_text("SET enable_seqscan = off\n")
    return list(variants)


def load(variant: Path | None, schema: str) -> tuple[dict[str, str], list[str], list[str]]:
    """A variant's two statements, its session statements and its served tasks."""
    sql = {name: queries(schema)[name] for name in STATEMENTS}
    session: list[str] = []
    tasks = ["noop"]
    if variant is not None:
        for name in STATEMENTS:
            if (path := variant / f"{name}.sql").exists():
                sql[name] = path.read_text().replace("{schema}", f'"{schema}"')
        if (path := variant / "session.sql").exists():
            text = path.read_text().replace("{schema}", f'"{schema}"')
            session = [s for s in text.split("\n-- next\n") if s.strip()]
        if (path := variant / "tasks").exists():
            tasks = path.read_text().split()
    return sql, session, tasks


def replay(conninfo: str, schema: str, variant: Path | None, jobs: int) -> float:
    """Backend CPU (us) per job of one replayed drain of `jobs` jobs by `variant`."""
    sql, session, tasks = load(variant, schema)
    params: dict[str, Any] = {
        "lookahead": 1.0,
        "queue": "default",
        "tasks": "{" + ",".join(tasks) + "}",
        "task_versions": None,
        "limit": BATCH,
        "traced": False,
        "lease_seconds": 30.0,
        "worker_id": uuid.uuid4(),
    }

    def array(values: Any) -> str:
        return "{" + ",".join(str(value) for value in values) + "}"

    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SET jit = off")
        for statement in session:
            conn.execute(statement)
        for _ in range(8):  # planned on the empty tables, as a worker's statements are
            conn.execute(sql["job_claim_plain"], params, prepare=True).fetchall()
        insert_backlog(conn, schema, jobs)
        pid = conn.info.backend_pid
        before, done = schedstat_ns(pid), 0
        while done < jobs:
            rows = conn.execute(sql["job_claim_plain"], params, prepare=True).fetchall()
            claimed = [row for row in rows if row[ClaimedRow.id] is not None]
            if not claimed:
                break
            leases = {
                "ids": array(row[ClaimedRow.id] for row in claimed),
                "attempts": array(row[ClaimedRow.attempt] for row in claimed),
                "lease_tokens": array(row[ClaimedRow.lease_token].hex for row in claimed),
                "results": array(['"null"'] * len(claimed)),
            }
            conn.execute(sql["job_complete_plain"], leases, prepare=True)
            done += len(claimed)
        used = schedstat_ns(pid) - before
        [[finished]] = conn.execute(f'SELECT count(*) FROM "{schema}".job_outcomes').fetchall()
    if done != jobs or finished != jobs:
        raise RuntimeError(f"{variant}: {done} claimed and {finished} completed of {jobs}")
    return used / jobs / 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--build", type=Path, default=None, help="write the claim variants here")
    parser.add_argument("variants", nargs="*", help="trioq, NAME=DIR or (with --build) NAME")
    args = parser.parse_args(argv)
    variants: dict[str, Path | None] = {}
    if args.build is not None:
        built = build(args.build)
        print(f"built {', '.join(built)} under {args.build}")
    for spec in args.variants:
        name, _, path = spec.partition("=")
        if name == "trioq" and not path:
            variants[name] = None
        elif path:
            variants[name] = Path(path)
        elif args.build is not None and (args.build / name).is_dir():
            variants[name] = args.build / name
        else:
            raise SystemExit(f"variant {spec!r}: give NAME=DIR, `trioq`, or a name --build wrote")
    if not variants:
        return
    names = list(variants)
    figures: dict[str, list[float]] = {name: [] for name in names}
    with open_database() as db:
        for repeat in range(args.repeats):
            for name in rotated(names, repeat):
                schema = db.fresh_schema()
                try:
                    us = replay(db.conninfo(HARNESS_ROLE), schema, variants[name], args.jobs)
                finally:
                    db.drop_schema(schema)
                figures[name].append(us)
                print(f"repeat {repeat + 1} {name:>12}: {us:6.1f} us backend/job", flush=True)
    first = names[0]
    print(f"medians: ({args.repeats} repeats of {args.jobs} jobs)")
    for name in names:
        ratio = statistics.median(a / b for a, b in zip(figures[name], figures[first], strict=True))
        print(
            f"{name:>12}: {statistics.median(figures[name]):6.1f} us backend/job"
            f"  {ratio:.3f} x {first}"
        )


if __name__ == "__main__":
    main()

"""A PROTOTYPE of a workflow's checkpoints filed by the same `lane` as its job, for a replay of
what it costs the completion (bench-only SQL, no migration).

Retention drops a day of finished jobs whole, but deletes their checkpoints row by row first
(`bench.retention --checkpoints 3`: 500,000 jobs' prune 0.21 -> 1.87 s, 1.55 million dead
tuples). The design it prototypes: checkpoints LIST-partitioned by `lane` like `jobs`, moved
with the job's row when it finishes, so they go with the day. Its price is paid by the
completion of every job that has checkpoints: its rows moved once. This replays a one-session
drain of jobs with `--steps` checkpoints each (job_claim_plain, then job_complete_plain), with
(`moved`) and without (`kept`) the move of the claimed jobs' checkpoints into today's lane in
the completion's transaction, and reports the backend's CPU per job of each.

    python -m bench.satellite_lanes --jobs 5000 --steps 3 --repeats 5

Retired: migration 0043 answered it another way (checkpoints by job id epoch), and since
migration 0049 there are no lanes to move into (the records are partitioned by epoch too). Kept
as the record of its figures; it runs on a schema of a release before 0049 only, and
tests/test_bench_quick.py no longer runs it.
"""

from __future__ import annotations

import argparse
import statistics

import psycopg

from bench.harness import HARNESS_ROLE, Database, open_database
from bench.hot_path_cost import claim_params, complete, insert_backlog, schedstat_ns
from trioq._pg.replies import ClaimedRow
from trioq._sql import queries

Conn = psycopg.Connection[tuple[object, ...]]

INSTALL_SQL = """
CREATE TABLE {schema}.cp_lanes (
    lane integer NOT NULL, job_id bigint NOT NULL, position integer NOT NULL,
    kind text NOT NULL, name text NOT NULL, value jsonb, created_at timestamptz NOT NULL,
    PRIMARY KEY (lane, job_id, position)
) PARTITION BY LIST (lane);
CREATE TABLE {schema}.cp_lanes_live PARTITION OF {schema}.cp_lanes FOR VALUES IN (0);
"""

MOVE_SQL = """
UPDATE {schema}.cp_lanes c SET lane = {schema}.job_lane({schema}.db_now())
WHERE c.lane = 0 AND c.job_id = ANY(%(ids)s::bigint[])
"""


def prepare(db: Database, schema: str, jobs: int, steps: int) -> None:
    db.conn.execute(INSTALL_SQL.format(schema=schema))
    db.conn.execute(
        f"CREATE TABLE {schema}.cp_lanes_today PARTITION OF {schema}.cp_lanes"
        f" FOR VALUES IN ({schema}.job_lane(now()))"
    )
    with psycopg.connect(db.conninfo(HARNESS_ROLE), autocommit=True) as conn:
        insert_backlog(conn, schema, jobs)
        for table, lane in (("checkpoints", ""), ("cp_lanes", "0, ")):
            conn.execute(
                f"INSERT INTO {schema}.{table} ({'lane, ' if lane else ''}job_id, position,"
                " kind, name, value, created_at)"
                f" SELECT {lane}j.id, p, 'step', 's' || p, 'null', now()"
                f" FROM {schema}.jobs j, generate_series(0, %s - 1) AS p",
                [steps],
            )
        conn.execute(f"UPDATE {schema}.job_rows_legacy SET checkpoint_count = %s", [steps])
        conn.execute(
            f"VACUUM ANALYZE {schema}.job_rows_legacy, {schema}.checkpoints, {schema}.cp_lanes"
        )
        conn.execute("CHECKPOINT")


def drain(db: Database, schema: str, jobs: int, moved: bool) -> float:
    """Backend CPU (us) per job: claims of 25 and their completions (and the move)."""
    claim = queries(schema)["job_claim_plain"]
    move = MOVE_SQL.format(schema=schema)
    done = 0
    with psycopg.connect(db.conninfo(HARNESS_ROLE), autocommit=True) as conn:
        pid = conn.info.backend_pid
        before = schedstat_ns(pid)
        while done < jobs:
            reply = conn.execute(claim, claim_params(), prepare=True).fetchall()
            first = ClaimedRow.id
            rows = [row[first:] for row in reply if row[first] is not None]
            if not rows:
                break
            leases = [(row[0], row[4], row[6]) for row in rows]
            with conn.transaction():
                complete(conn, schema, leases)
                if moved:  # in the completion's transaction
                    conn.execute(move, {"ids": [lease[0] for lease in leases]}, prepare=True)
            done += len(rows)
        used = schedstat_ns(pid) - before
    if done != jobs:
        raise RuntimeError(f"the replay completed {done} of {jobs} jobs")
    return used / jobs / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    figures: dict[str, list[float]] = {"kept": [], "moved": []}
    with open_database() as db:
        for repeat in range(args.repeats):
            order = ["kept", "moved"] if repeat % 2 == 0 else ["moved", "kept"]
            for variant in order:
                schema = db.fresh_schema()
                try:
                    db.install_raw(schema)
                    prepare(db, schema, args.jobs, args.steps)
                    us = drain(db, schema, args.jobs, variant == "moved")
                finally:
                    db.drop_schema(schema)
                figures[variant].append(us)
                print(f"repeat {repeat + 1} {variant:>5}: {us:6.1f} us backend/job", flush=True)
    kept, moved = figures["kept"], figures["moved"]
    ratio = statistics.median(m / k for m, k in zip(moved, kept, strict=True))
    print(
        f"medians ({args.repeats} repeats of {args.jobs} jobs, {args.steps} checkpoints each):"
        f" kept {statistics.median(kept):.1f} us, moved {statistics.median(moved):.1f} us,"
        f" moved / kept {ratio:.3f}"
    )


if __name__ == "__main__":
    main()

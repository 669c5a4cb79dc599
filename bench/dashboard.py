"""Dashboard page timings with 1,000,000 jobs in the table (not a test: speed lives here).

Run once: `python -m bench.dashboard [--jobs 1000000] [--requests 40]`. An embedded cluster (or
TRIOQ_DATABASE_URL) gets a schema filled in SQL with a steady-state mix: mostly completed jobs
spread over a week (60,000 of them in the last hour, past the chart's read cap), failed ones,
a ready backlog over four queues (some partition-keyed), scheduled jobs, sleeping and waiting
workflows with history, running jobs. The table is vacuumed and analyzed (as autovacuum would
have done; migration 0005's settings). Then the dashboard serves on a free port and each page
is requested `--requests` times; the server's own time per request (its Server-Timing header:
routing, every query, rendering) gives p50 and p95, and the client's wall time is shown beside.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import urllib.request

import psycopg
import trio

import trioq
from trioq.dashboard.app import DashboardConfig, serve_dashboard
from trioq.dashboard.store import Store
from trioq.embedded import EmbeddedPostgres

SCHEMA = "bench_dashboard"
QUEUES = ("default", "mail", "sync", "reports")

# One INSERT per slice of the mix; %(n)s rows each, %(base)s offsets the ids' payload text.
FILL = {
    "completed": """
        INSERT INTO {s}.jobs (queue, task, payload, state, run_at, attempt, created_at,
                              started_at, finished_at, result, lane)
        SELECT (ARRAY['default','mail','sync','reports'])[1 + g %% 4], 'send_reply',
               jsonb_build_object('conversation_id', 'c' || g, 'text', 'hello ' || g),
               'completed', t, 1, t, t, t + interval '20 ms', '{{"ok": true}}',
               {s}.job_lane(t + interval '20 ms')
        FROM generate_series(1, %(n)s) g,
             LATERAL (SELECT now() - interval '1 hour'
                             - (g::float8 / %(n)s) * interval '7 days' AS t) x""",
    "recent": """
        INSERT INTO {s}.jobs (queue, task, payload, state, run_at, attempt, created_at,
                              started_at, finished_at, lane)
        SELECT (ARRAY['default','mail','sync','reports'])[1 + g %% 4], 'send_reply',
               jsonb_build_object('conversation_id', 'r' || g), 'completed', t, 1, t, t, t,
               {s}.job_lane(t)
        FROM generate_series(1, %(n)s) g,
             LATERAL (SELECT now() - (g::float8 / %(n)s) * interval '59 minutes' AS t) x""",
    "failed": """
        INSERT INTO {s}.jobs (queue, task, payload, state, run_at, attempt, max_attempts,
                              created_at, started_at, finished_at, error, lane)
        SELECT (ARRAY['default','mail','sync','reports'])[1 + g %% 4], 'sync_external',
               jsonb_build_object('source', g), 'failed', t, 5, 5, t, t, t,
               jsonb_build_object('type', 'ProviderUnavailable', 'message', '503 for ' || g),
               {s}.job_lane(t)
        FROM generate_series(1, %(n)s) g,
             LATERAL (SELECT now() - (g::float8 / %(n)s) * interval '3 days' AS t) x""",
    "ready": """
        INSERT INTO {s}.jobs (queue, task, payload, state, run_at, created_at, partition_key)
        SELECT (ARRAY['default','mail','sync','reports'])[1 + g %% 4], 'send_reply',
               jsonb_build_object('conversation_id', 'q' || g), 'ready',
               now() - interval '10 minutes', now() - interval '10 minutes',
               CASE WHEN g %% 3 = 0 THEN 'k' || (g %% 500) END
        FROM generate_series(1, %(n)s) g""",
    "scheduled": """
        INSERT INTO {s}.jobs (queue, task, payload, state, run_at, created_at)
        SELECT (ARRAY['default','mail','sync','reports'])[1 + g %% 4], 'nightly_digest',
               '{{}}', 'scheduled', now() + interval '1 hour', now()
        FROM generate_series(1, %(n)s) g""",
    "sleeping": """
        INSERT INTO {s}.jobs (queue, task, payload, state, run_at, created_at,
                              checkpoint_count)
        SELECT 'default', 'approval_flow', jsonb_build_object('request', g), 'sleeping',
               now() + interval '2 hours', now() - interval '1 hour', 2
        FROM generate_series(1, %(n)s) g""",
    "waiting": """
        INSERT INTO {s}.jobs (queue, task, payload, state, run_at, created_at,
                              checkpoint_count, wait_event_key)
        SELECT 'default', 'approval_flow', jsonb_build_object('request', g), 'waiting',
               now() + interval '1 day', now() - interval '1 hour', 3, 'approval:' || g
        FROM generate_series(1, %(n)s) g""",
    "running": """
        INSERT INTO {s}.jobs (queue, task, payload, state, run_at, attempt, created_at,
                              started_at, lease_token, lease_expires_at)
        SELECT (ARRAY['default','mail','sync','reports'])[1 + g %% 4], 'send_reply', '{{}}',
               'running', now(), 1, now(), now(), gen_random_uuid(), now() + interval '1 hour'
        FROM generate_series(1, %(n)s) g""",
}
HISTORY = """
    INSERT INTO {s}.checkpoints (job_id, position, kind, name, value, created_at)
    SELECT j.id, p.position, p.kind, p.name, p.value, j.created_at
    FROM {s}.jobs j,
         LATERAL (VALUES (0, 'step', 'ask approver', '{{"asked": true}}'::jsonb),
                         (1, 'sleep', 'cool-off', jsonb_build_object('wake_at', j.run_at)))
             AS p(position, kind, name, value)
    WHERE j.state IN ('sleeping', 'waiting')"""


def _mix(total: int) -> dict[str, int]:
    mix = {"recent": 60_000, "failed": 20_000, "ready": 40_000, "scheduled": 10_000,
           "sleeping": 10_000, "waiting": 5_000, "running": 200}  # fmt: skip
    scale = min(1.0, total / 1_000_000)
    mix = {name: max(1, int(n * scale)) for name, n in mix.items()}
    mix["completed"] = total - sum(mix.values())
    return mix


def fill(conninfo: str, total: int) -> int:
    """Insert the mix; returns a sleeping workflow's id (for the job page)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        # The finished jobs are filed by the day they finished on (migration 0038): the last
        # eight days' partitions first.
        conn.execute(
            f"SELECT {SCHEMA}.job_history_add({SCHEMA}.job_lane(now()) - d)"
            " FROM generate_series(0, 8) AS d".encode()
        )
        for name, n in _mix(total).items():
            started = time.perf_counter()
            conn.execute(FILL[name].format(s=SCHEMA).encode(), {"n": n})
            print(f"  {name}: {n:,} rows in {time.perf_counter() - started:.1f}s", flush=True)
        conn.execute(HISTORY.format(s=SCHEMA).encode())
        conn.execute(f"VACUUM (ANALYZE) {SCHEMA}.jobs".encode())
        conn.execute(f"VACUUM (ANALYZE) {SCHEMA}.checkpoints".encode())
        row = conn.execute(
            f"SELECT id FROM {SCHEMA}.jobs WHERE state = 'waiting' LIMIT 1".encode()
        ).fetchone()
    assert row is not None
    return int(row[0])


def _get(url: str) -> tuple[float, float]:
    """(server ms from Server-Timing, client wall ms) of one GET."""
    started = time.perf_counter()
    with urllib.request.urlopen(url) as response:
        response.read()
        timing = response.headers.get("server-timing", "app;dur=nan")
    wall = (time.perf_counter() - started) * 1000
    return float(timing.split("dur=")[1]), wall


def _pages(workflow_id: int) -> dict[str, str]:
    return {
        "overview": "/",
        "overview (live fragment)": "/fragments/overview",
        "overview JSON": "/api/overview",
        "jobs, newest": "/jobs",
        "jobs, state=failed": "/jobs?state=failed",
        "jobs, queue=mail state=ready": "/jobs?queue=mail&state=ready",
        "jobs, payload text (5,000 rows read)": "/jobs?text=no-such-text",
        "jobs, page 100 (keyset)": "/jobs?before_id=500000",
        "job (workflow, timeline)": f"/jobs/{workflow_id}",
        "workflows": "/workflows",
        "schedules": "/schedules",
        "audit": "/audit",
    }


async def measure(conninfo: str, workflow_id: int, requests: int) -> dict[str, dict[str, float]]:
    app = trioq.App(conninfo, schema=SCHEMA)
    results: dict[str, dict[str, float]] = {}
    async with app.client() as client, trio.open_nursery() as nursery:
        port = await nursery.start(serve_dashboard, DashboardConfig(port=0), Store(client))
        base = f"http://127.0.0.1:{port}"
        for name, path in _pages(workflow_id).items():
            await trio.to_thread.run_sync(_get, base + path)  # warm: plans, templates
            samples = [await trio.to_thread.run_sync(_get, base + path) for _ in range(requests)]
            server = sorted(s for s, _ in samples)
            wall = sorted(w for _, w in samples)
            results[name] = {
                "server_p50_ms": round(statistics.median(server), 1),
                "server_p95_ms": round(server[int(0.95 * (len(server) - 1))], 1),
                "wall_p95_ms": round(wall[int(0.95 * (len(wall) - 1))], 1),
            }
            row = results[name]
            print(
                f"  {name:<40} server p50 {row['server_p50_ms']:>6.1f} ms"
                f"  p95 {row['server_p95_ms']:>6.1f} ms   (client wall p95 "
                f"{row['wall_p95_ms']:.1f} ms)",
                flush=True,
            )
        nursery.cancel_scope.cancel()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--out", default="bench/results_dashboard.json")
    args = parser.parse_args()
    url = os.environ.get("TRIOQ_DATABASE_URL")
    with EmbeddedPostgres() if url is None else _External(url) as cluster:
        conninfo = cluster.conninfo
        trio.run(_migrate, conninfo)
        print(f"filling {args.jobs:,} jobs", flush=True)
        workflow_id = fill(conninfo, args.jobs)
        print(f"page timings ({args.requests} requests each):", flush=True)
        results = trio.run(measure, conninfo, workflow_id, args.requests)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE".encode())
    with open(args.out, "w") as out:
        load = [round(n, 1) for n in os.getloadavg()]
        record = {"jobs": args.jobs, "requests": args.requests, "load_average": load}
        json.dump({**record, "pages": results}, out, indent=2)


async def _migrate(conninfo: str) -> None:
    async with trioq.App(conninfo, schema=SCHEMA).client(migrate=True):
        pass


class _External:
    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo

    def __enter__(self) -> _External:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    main()

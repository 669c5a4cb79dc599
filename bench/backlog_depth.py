"""Backlog depth: what one job's drain costs the server when 1,000, 100,000 or 1,000,000 ready
jobs wait.

Run once (not part of the test suite):
`python -m bench.backlog_depth [--depths 1000,100000,1000000] [--measure 1000] [--repeats 5]`.

Each repeat, for each depth (the order rotating): a fresh schema with `depth` ready no-op jobs
(inserted in one statement, analyzed, checkpointed), then bench.hot_path_cost's replay of the
worker's two hot statements (job_claim_plain, job_complete_plain, 25 jobs a round, one session)
over the first `--measure` jobs. Reported per depth: the replaying backend's CPU per job, the
whole cluster's, WAL bytes per job, and the backend's CPU as a ratio to the shallowest depth's
in the same repeat (median of the ratios). The storage target: per-job cost at 1,000,000 ready
within 15% of the cost at 1,000.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from bench.harness import open_database
from bench.hot_path_cost import replay
from bench.stats import rotated

RESULTS = Path(__file__).resolve().parent / "results_backlog_depth.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--depths", default="1000,100000,1000000")
    parser.add_argument("--measure", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--jit", action="store_true", help="PostgreSQL's JIT on (trioq's sessions turn it off)"
    )
    args = parser.parse_args()
    depths = [int(depth) for depth in args.depths.split(",")]
    figures: dict[int, list[tuple[float, float, float]]] = {depth: [] for depth in depths}
    with open_database() as db:
        for repeat in range(args.repeats):
            for depth in rotated(depths, repeat):
                schema = db.fresh_schema()
                try:
                    figures[depth].append(replay(db, schema, depth, args.measure, args.jit))
                finally:
                    db.drop_schema(schema)
                backend, cluster, wal = figures[depth][-1]
                print(
                    f"repeat {repeat + 1} depth {depth:>9,}: {backend:6.1f} us backend/job"
                    f"  {cluster:6.1f} us cluster/job  {wal:5.0f} B WAL/job"
                    f"  (load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
    shallow = figures[depths[0]]
    summary = {}
    for depth in depths:
        runs = figures[depth]
        ratio = statistics.median(a[0] / b[0] for a, b in zip(runs, shallow, strict=True))
        summary[depth] = {
            "backend_us": statistics.median(r[0] for r in runs),
            "cluster_us": statistics.median(r[1] for r in runs),
            "wal_bytes": statistics.median(r[2] for r in runs),
            "backend_x_shallowest": ratio,
        }
        print(f"depth {depth:>9,}: {json.dumps(summary[depth])}")
    RESULTS.write_text(json.dumps({"args": vars(args), "medians": summary, "runs": figures}))


if __name__ == "__main__":
    main()

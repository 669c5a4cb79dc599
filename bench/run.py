"""`python -m bench`: start an embedded PostgreSQL, run the scenarios, write the results.

python -m bench                        # the full run (about 10 minutes), into bench/
python -m bench --quick                # small sizes, one repeat: checks the suite runs
python -m bench --scenarios pickup,refill --output /tmp/b
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import report
from bench.config import FULL, QUICK
from bench.harness import REPO_ROOT, Database, Launcher, open_database
from bench.scenarios import Context, Results, runners

DEFAULT_OUTPUT = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat (CI)")
    parser.add_argument("--repeats", type=int, default=None, help="override the repeat count")
    parser.add_argument(
        "--non-durable",
        action="store_true",
        help="fsync, synchronous_commit and full_page_writes off (default: on, as in production)",
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(runners()),
        help=f"comma-separated subset of: {', '.join(runners())}",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=DEFAULT_OUTPUT,
        help="directory for RESULTS.md and results.json (default: bench/)",
    )
    args = parser.parse_args(argv)
    unknown = set(args.scenarios.split(",")) - set(runners())
    if unknown:
        parser.error(f"--scenarios: unknown {', '.join(sorted(unknown))}")
    return args


def machine_facts(db: Database) -> dict[str, Any]:
    cpu_model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu_model,
        "postgres": db.scalar("SHOW server_version"),
        "durability": {
            name: db.scalar(f"SHOW {name}")
            for name in ("fsync", "synchronous_commit", "full_page_writes")
        },
        "python": platform.python_version(),
        "trioq_commit": _git("rev-parse", "--short", "HEAD"),
        "trioq_tree_dirty": bool(_git("status", "--porcelain", "--", "trioq")),
        "load_average_at_start": os.getloadavg(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def _git(*args: str) -> str:
    result = subprocess.run(
        ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    return result.stdout.strip()


def run_scenarios(ctx: Context, names: list[str]) -> dict[str, dict[str, Any]]:
    """Run each runner; returns its duration and the load average when it started."""
    timings = {}
    for name in names:
        start, load = time.monotonic(), os.getloadavg()[0]
        ctx.log(f"== {name} (load average {load:.2f})")
        runners()[name](ctx)
        timings[name] = {
            "seconds": round(time.monotonic() - start, 1),
            "load_average_1min_at_start": round(load, 2),
        }
    return timings


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.repeats is not None:
        import attrs

        sizes = attrs.evolve(sizes, repeats=args.repeats)
    names = [name for name in runners() if name in args.scenarios.split(",")]
    log_dir = Path(tempfile.mkdtemp(prefix="trioq-bench-logs-"))
    results = Results()
    with open_database(durable=not args.non_durable) as db:
        launcher = Launcher(db, log_dir)
        machine = machine_facts(db)
        try:
            timings = run_scenarios(Context(db, launcher, sizes, results, _log), names)
        except BaseException:
            print(f"bench failed; process logs kept in {log_dir}", file=sys.stderr)
            raise
        finally:
            launcher.stop_all()
    machine["load_average_at_end"] = os.getloadavg()
    machine["runners"] = timings
    command = "python -m bench" + "".join(f" {shlex.quote(a)}" for a in (argv or sys.argv[1:]))
    built = report.build(results, sizes, {**machine, "command": command})
    report.write(built, args.output, report.preamble(built))
    print(report.tables(built))
    print(f"wrote {args.output / 'RESULTS.md'} and {args.output / 'results.json'}")
    shutil.rmtree(log_dir, ignore_errors=True)
    return 0


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

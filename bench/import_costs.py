"""Start-up costs of the entry points: wall and CPU time of a fresh interpreter per run.

    python -m bench.import_costs [--runs 11] [--base-python PATH]

Each round runs every case once, in order, so a load change hits all cases alike; medians are
printed with the machine's load average. `python -c pass` and `import psycopg` run in the same
rounds, so a reader can scale the figures to a quieter machine. With `--base` (a checkout of
another commit), the trioq cases also run under `--base-python`: an interpreter whose path finds
that commit's trioq first (a venv with a .pth naming the checkout and this venv's site-packages:
PYTHONPATH loses to the editable install's finder), interleaved.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

# The import statement's own time, printed by the process (its wall time adds the interpreter's
# start and exit, the same for every case).
_TIMED = "import time as t; s = t.perf_counter(); import {}; print((t.perf_counter() - s) * 1e3)"
CASES: dict[str, list[str]] = {
    "python -c pass": ["-c", "pass"],
    "import psycopg": ["-c", _TIMED.format("psycopg")],
    "import trioq.producer": ["-c", _TIMED.format("trioq.producer")],
    "import trioq": ["-c", _TIMED.format("trioq")],
    # What the console script runs (its wrapper adds `import re`, which site has loaded).
    "trioq --help": ["-c", "import sys; from trioq.cli import main; sys.exit(main(['--help']))"],
    "trioq --version": [
        "-c",
        "import sys; from trioq.cli import main; sys.exit(main(['--version']))",
    ],
}
TRIOQ_CASES = [name for name in CASES if "trioq" in name]


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """Process wall and CPU seconds, and the import's own milliseconds (NaN: not printed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # From "/": `-c` puts the working directory first on sys.path, and a checkout's would win.
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, cwd="/")
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    try:
        own = float(done.stdout.strip())
    except ValueError:
        own = math.nan
    return wall, cpu, own


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--base-python", help="an interpreter that imports the base's trioq")
    # An editable install's import finder costs 10-25 ms per process at load 5: compare the
    # base against an interpreter set up the same way (a .pth naming this checkout).
    parser.add_argument("--python", default=sys.executable, help="the interpreter measured")
    args = parser.parse_args()
    plain = dict(os.environ)
    variants: list[tuple[str, list[str], dict[str, str]]] = []
    for name, argv in CASES.items():
        variants.append((name, [args.python, *argv], plain))
        if args.base_python and name in TRIOQ_CASES:
            variants.append((f"{name} [base]", [args.base_python, *argv], plain))
    script = shutil.which("trioq", path=os.path.dirname(args.python))
    if script:
        variants.append(("trioq --help (console script)", [script, "--help"], plain))
        variants.append(("trioq --version (console script)", [script, "--version"], plain))
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _, _ in variants}
    load_before = os.getloadavg()
    for _ in range(args.runs):
        for name, argv, env in variants:
            samples[name].append(_run(argv, env))
    load_after = os.getloadavg()
    print(f"load average (1, 5, 15 min) before {load_before}, after {load_after}")
    print(f"medians of {args.runs} fresh processes per case, rounds interleaved")
    print(f"{'case':40} {'import ms':>9} {'wall ms':>9} {'cpu ms':>9}")
    for name, values in samples.items():
        own = statistics.median(v[2] for v in values)
        wall = statistics.median(v[0] for v in values) * 1000
        cpu = statistics.median(v[1] for v in values) * 1000
        print(f"{name:40} {own:9.0f} {wall:9.0f} {cpu:9.0f}")


if __name__ == "__main__":
    main()

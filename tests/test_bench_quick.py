"""`python -m bench --quick` runs the whole suite end to end (sizes small, no timing checked)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import statement_shape, statement_variants
from bench.harness import Launcher, open_database
from bench.report import SCENARIOS

# Slow tier: the benchmark smoke run takes about 100 s; `pytest -m "not slow"` leaves it out.
pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parent.parent


def run_module(module: str, *argv: str) -> str:
    """`python -m MODULE ARGV...` from the repository root; its output, once it exited 0."""
    result = subprocess.run(
        [sys.executable, "-m", module, *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_quick_bench_runs_every_scenario_and_writes_results(tmp_path: Path) -> None:
    run_module("bench", "--quick", "--output", str(tmp_path))
    report = json.loads((tmp_path / "results.json").read_text())
    assert set(SCENARIOS) <= set(report["scenarios"])
    assert (tmp_path / "RESULTS.md").read_text().startswith("# trioq benchmark results")


def test_worker_cpu_comparison_runs_and_reports_medians(tmp_path: Path) -> None:
    """`python -m bench.worker_cpu`: the two raw floors (keeping the row, deleting it), this
    checkout's worker, the trio floor (with and without a cancel scope per job) and the trio
    floor on the contract's floor (outcome kept, nothing kept), a task that keeps nothing, this
    worker with prefetch, the raw loops with their claim committed asynchronously, one tiny
    repeat, with medians and the ratios to both raw floors (worker and server CPU); its
    cProfile mode writes a profile."""
    profile = tmp_path / "worker.prof"
    outputs = []
    variant = "lean=bench/variants/lean"
    first = ["--trio-floor", "--contract-floor", "--trioq-statements", "--variant", variant]
    first += ["--unkept", "--prefetch", "25", "--raw-async-claim"]
    for extra in (first, ["--cprofile", str(profile)]):
        outputs.append(run_module("bench.worker_cpu", "--jobs", "200", "--repeats", "1", *extra))
    assert "medians:" in outputs[0] and "x raw CPU/job" in outputs[0]
    assert "x raw server/job" in outputs[0] and "x raw-del server/job" in outputs[0]
    medians = outputs[0].split("medians:")[1]
    for system in (
        "raw",
        "raw-del",
        "this",
        "floor",
        "floor-ns",
        "floor-del",
        "contract",
        "contract-del",
        "floor-trioq",
        "lean",
        "unkept",
        "prefetch25",
        "raw-async",
        "raw-del-async",
    ):
        assert f"{system:>10}: " in medians, outputs[0]
    assert "cprofile:" in outputs[1] and profile.stat().st_size > 0


def test_statement_variants_builds_the_claims_guards_and_replays_them(tmp_path: Path) -> None:
    """`python -m bench.statement_variants --build DIR`: the claim with every guard, with none
    and with each alone or left out, each a claim that drains the backlog (the replay checks
    every job claimed and completed), replayed beside trioq's own statements and the lean
    variant, with the ratios to the first."""
    built = tmp_path / "claims"
    argv = ["--jobs", "60", "--repeats", "1", "--build", str(built)]
    out = run_module(
        "bench.statement_variants", *argv, "trioq", "lean=bench/variants/lean", "all", "none",
        "no-lock", "with-probe", "no-fn",
    )  # fmt: skip
    medians = out.split("medians:")[1]
    for name in ("trioq", "lean", "all", "none", "no-lock", "with-probe", "no-fn"):
        assert f"{name:>12}: " in medians, out
    assert medians.count("x trioq") == 7
    assert {path.name for path in built.iterdir()} == {
        "none",
        "all",
        *(f"{kind}-{guard}" for guard in statement_variants.GUARDS for kind in ("with", "no")),
    }


def test_hot_path_cost_replays_the_drain_on_each_variant() -> None:
    """`python -m bench.hot_path_cost`: the claim and flush statements of a tiny drain on the
    table as migrated and without its CHECKs, with the medians and the ratio to `base`."""
    out = run_module(
        "bench.hot_path_cost", "--jobs", "100", "--repeats", "1", "--variant", "no_checks"
    )
    assert "medians:" in out and "x base" in out
    assert "no_checks:" in out


def test_statement_shape_replays_each_system_on_the_drain_and_the_enqueue() -> None:
    """`python -m bench.statement_shape`: trioq's statements, minimal ones on the same tables,
    the raw loop's two floors, the contract's floor and the discarding completion, for a tiny
    drain and a few single inserts, with the ratios to trioq, to raw and to raw-del."""
    out = run_module("bench.statement_shape", "--jobs", "100", "--repeats", "1")
    medians = out.split("medians:")[1]
    systems = statement_shape.SYSTEMS
    assert {"trioq", "minimal", "raw", "raw-del", "floor", "discard"} <= set(systems)
    for replay in ("drain", "enqueue"):
        for system in systems:
            assert f"{replay} {system:>11}:" in medians, out
    assert medians.count("x trioq") == medians.count("x raw-del") == 2 * len(systems)


def test_retention_prunes_workflow_jobs_whole_while_a_worker_serves(tmp_path: Path) -> None:
    """`python -m bench.retention --checkpoints N`: finished jobs with checkpoints in an
    ended id epoch, pruned by a purge while a worker serves an offered load: every job goes,
    and their checkpoints with them, without a dead tuple (TRUNCATE, not DELETE)."""
    results = tmp_path / "retention.json"
    run_module(
        "bench.retention",
        *("--finished", "3000", "--checkpoints", "2", "--clean", "1", "--after", "1"),
        *("--rate", "200", "--results", str(results)),
    )
    [run] = json.loads(results.read_text())["runs"]
    assert run["pruned"] == 3000
    clean, prune = run["clean"], run["prune"]
    # The prune adds at most the offered load's own dead tuples (200 jobs/s), never the
    # 6,000 checkpoints'.
    assert prune["dead_tuples"] - clean["dead_tuples"] < 2000


def test_retention_at_midnight_starts_the_next_epoch_in_the_pass_that_prunes(
    tmp_path: Path,
) -> None:
    """`python -m bench.retention --at-midnight`: the purge's pass starts the next epoch (the
    partitions of the one after made) and prunes the filled one: every job goes."""
    results = tmp_path / "retention.json"
    run_module(
        "bench.retention",
        *("--finished", "2000", "--clean", "1", "--after", "1", "--at-midnight"),
        *("--rate", "200", "--results", str(results)),
    )
    [run] = json.loads(results.read_text())["runs"]
    assert run["pruned"] == 2000


def test_runtime_cpu_counts_task_steps_and_calls_per_job() -> None:
    """`python -m bench.runtime_cpu`: the stub-driver drain of this checkout, one tiny repeat
    with a slow flush (the completer's backlog fills): every job takes at least one task step
    and the medians are printed."""
    argv = ["--jobs", "300", "--repeats", "1", "--flush-ms", "2", "--claim-ms", "0.2"]
    out = run_module("bench.runtime_cpu", *argv)
    assert "medians:" in out
    [medians] = [line for line in out.splitlines() if line.strip().startswith("this:")][-1:]
    steps = float(medians.split("us CPU/job")[1].split("task steps/job")[0])
    assert steps >= 1.0


def test_runtime_cpu_counts_instructions_per_job_under_callgrind() -> None:
    """`python -m bench.runtime_cpu --instructions`: this checkout's drain counted twice under
    callgrind, the difference per job printed (a no-op job takes tens of thousands)."""
    if shutil.which("valgrind") is None:
        raise RuntimeError("valgrind is not installed: apt-get install valgrind (.ci/run does)")
    out = run_module("bench.runtime_cpu", "--instructions", "--jobs", "300")
    [line] = [line for line in out.splitlines() if line.strip().startswith("this:")]
    assert float(line.split(":")[1].split("instructions/job")[0].replace(",", "")) > 10_000


def test_plan_cache_comparison_runs_both_drains_and_reports_medians() -> None:
    """`python -m bench.plan_cache`: this checkout's plain and keyed drains, one tiny repeat."""
    argv = ["--quick", "--repeats", "1", "--plain-jobs", "200", "--keyed-jobs", "200"]
    out = run_module("bench.plan_cache", *argv)
    medians = out.split("medians:")[1]
    assert "plain this" in medians and "keyed this" in medians and "us plan/job" in medians


def test_a_benchmark_run_that_fails_leaves_no_worker_running(tmp_path: Path) -> None:
    """A run that raises with its workers up (a statement error, a bug in a scenario) stops
    them as its cluster stops: an orphaned worker went on retrying its connection, taking CPU
    from the next run's measurement."""

    class Failed(Exception):
        pass

    with pytest.raises(Failed), open_database() as db:
        launcher = Launcher(db, tmp_path)
        worker = launcher.baseline_worker(db.fresh_schema(), expect=10)
        assert worker.popen.poll() is None
        raise Failed
    assert worker.popen.poll() is not None


def test_statement_cost_times_each_hot_statement_on_an_empty_queue() -> None:
    """`python -m bench.statement_cost`: the fixed cost per call of the hot statements, beside
    `SELECT 1` and the raw loop's claim, one tiny round."""
    output = run_module("bench.statement_cost", "--calls", "20", "--rounds", "1")
    for name in ("SELECT 1", "job_claim_plain", "ready_ring_take, 25 addresses"):
        assert f"{name}: " in output, output


def test_epoch_claims_drains_the_write_once_layout_over_epochs() -> None:
    """`python -m bench.epoch_claims`: trioq's replayed drain beside the planned write-once
    layout's claim and completion naming the epoch-partitioned parents and the newest epoch's
    partitions, one tiny repeat (each drain raises unless it completed every job)."""
    output = run_module(
        "bench.epoch_claims", "--jobs", "60", "--repeats", "1", "--epochs", "1", "--epochs", "2"
    )
    for name in ("trioq", "parent-1", "current-1", "parent-2", "current-2"):
        assert f"{name}: " in output, output

"""Turn the recorded repeats into medians, spreads, ratios to the baseline and target checks;
write them as JSON and as bench/RESULTS.md."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from bench.config import Sizes
from bench.metrics import Metric, metrics
from bench.scenarios import Results
from bench.stats import summarize

SCENARIOS = (
    "throughput",
    "enqueue",
    "pickup_latency",
    "refill_latency",
    "database_load",
    "worker_cost",
    "partition_fairness",
    "workflows",
    "event_latency",
    "fanout",
    "message_latency",
    "message_drain",
    "get_value",
    "scaling",
    "prefetch",
    "baseline",
    "peer",
)


def ratio_to_baseline(values: list[float], base: list[float] | None) -> float | None:
    """Median of the per-repeat ratios (each trioq run against the baseline of its repeat);
    the ratio of medians when the repeat counts differ."""
    if not base or not all(base):  # e.g. CPU below the clock tick in --quick runs
        return None
    if len(base) == len(values):
        return statistics.median(v / b for v, b in zip(values, base, strict=True))
    return statistics.median(values) / statistics.median(base)


def summarize_metric(metric: Metric, results: Results) -> dict[str, Any] | None:
    values = results.values.get(metric.scenario, {}).get(metric.key)
    if not values:
        return None
    summary: dict[str, Any] = {"label": metric.label, "unit": metric.unit, **summarize(values)}
    base = results.values.get("baseline", {}).get(metric.baseline) if metric.baseline else None
    summary["ratio_to_baseline"] = ratio_to_baseline(values, base)
    peer = results.values.get("peer", {}).get(metric.baseline) if metric.peer else None
    summary["ratio_to_peer"] = ratio_to_baseline(values, peer) if metric.baseline else None
    if metric.target is not None:
        summary["target"] = metric.target.text
        summary["met"] = metric.target.met(
            summary["median"], summary["ratio_to_baseline"], summary["ratio_to_peer"]
        )
    return summary


def build(results: Results, sizes: Sizes, machine: dict[str, Any]) -> dict[str, Any]:
    scenarios: dict[str, dict[str, Any]] = {}
    for metric in metrics(sizes):
        summary = summarize_metric(metric, results)
        if summary is not None:
            scenarios.setdefault(metric.scenario, {})[metric.key] = summary
    return {
        "machine": machine,
        "sizes": _plain(sizes),
        "scenarios": scenarios,
        "notes": results.notes,
    }


def _plain(sizes: Sizes) -> dict[str, Any]:
    import attrs

    return attrs.asdict(sizes)


# --- rendering --------------------------------------------------------------------------------


def _number(value: float) -> str:
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 0.1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _met(summary: dict[str, Any]) -> str:
    if "met" not in summary:
        return ""
    return {True: "yes", False: "**NO**", None: "?"}[summary["met"]]


def table(name: str, scenario: dict[str, Any]) -> list[str]:
    lines = [
        f"### {name}",
        "",
        "| metric | median | spread (min-max) | trioq/raw | trioq/PgQueuer | target | met |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for summary in scenario.values():
        ratio, peer = summary["ratio_to_baseline"], summary.get("ratio_to_peer")
        lines.append(
            f"| {summary['label']} | {_number(summary['median'])} {summary['unit']} | "
            f"{_number(summary['min'])}-{_number(summary['max'])} | "
            f"{'-' if ratio is None else f'{ratio:.2f}x'} | "
            f"{'-' if peer is None else f'{peer:.2f}x'} | {summary.get('target', '')} | "
            f"{_met(summary)} |"
        )
    return [*lines, ""]


def tables(report: dict[str, Any]) -> str:
    lines: list[str] = []
    for name in SCENARIOS:
        if name in report["scenarios"]:
            lines += table(name, report["scenarios"][name])
    return "\n".join(lines + where_the_time_goes(report["notes"]))


def where_the_time_goes(notes: dict[str, dict[str, Any]]) -> list[str]:
    """Server time by statement (planning vs execution) per scenario and process, and the
    worker's CPU by function, from the notes the scenarios recorded."""
    lines = ["## Where the time goes", ""]
    for scenario, entries in notes.items():
        for key, rows in entries.items():
            if key.endswith("_statements") and rows:
                lines += [
                    f"### {scenario}: {key.removesuffix('_statements')} (server, by statement)",
                    "",
                    "| calls | exec ms (mean) | exec ms (total) | plans | plan ms (mean) "
                    "| statement |",
                    "|---:|---:|---:|---:|---:|---|",
                    *[
                        f"| {r['calls']} | {r['mean_exec_ms']} | {r['total_exec_ms']} | "
                        f"{r['plans']} | {r['mean_plan_ms']} | `{r['query']}` |"
                        for r in rows
                    ],
                    "",
                ]
    profile = notes.get("worker_cost", {}).get("profile_one_worker_noop")
    if profile:
        lines += [
            "### worker CPU by function (cProfile, one extra untimed 1-worker noop drain)",
            "",
            "| own s | share | cumulative s | calls | function |",
            "|---:|---:|---:|---:|---|",
            *[
                f"| {r['own_s']} | {r['own_share']:.1%} | {r['cumulative_s']} | {r['calls']} | "
                f"`{r['function']}` |"
                for r in profile
            ],
            "",
        ]
    return lines


def write(report: dict[str, Any], output: Path, preamble: str) -> None:
    output.mkdir(parents=True, exist_ok=True)
    (output / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    markdown = output / "RESULTS.md"
    markdown.write_text(preamble + "\n" + tables(report) + "\n" + kept_analysis(markdown))


ANALYSIS_MARKER = "<!-- analysis: text below this line is kept when the file is regenerated -->"

METHOD = """\
## Method

- Every scenario runs real `trioq worker` processes (`python -m trioq.cli worker bench.app:app`)
  against an embedded PostgreSQL started for the run, on a unix socket, with `pg_stat_statements`
  loaded (`track_utility` and `track_planning` on). Each run uses a fresh schema and fresh
  processes; each process connects as a role of its own, so pg_stat_statements tells its
  statements (calls, execution and planning time) apart from the harness's polling. Those
  per-statement figures are in the JSON file under `notes`.
- Throughput: workers start first and idle; the backlog is enqueued with `enqueue_many` in ONE
  transaction, so it appears at COMMIT (t0). Time = t0 -> last `finished_at`. Worker CPU is
  user+sys from `/proc/<pid>/stat` over the same window (start-up excluded); peak RSS is VmHWM.
- Latencies use one clock, this machine's wall clock. Pickup runs from the harness's
  `time.time()` just before the enqueue call (so the enqueue itself counts) to the handler's
  `time.time()` as it starts (returned as the job result); refill and partition waits from right
  after the backlog's COMMIT.
  Pickup is also split at the claim statement's start (`started_at`, the database's `now()`).
- Durability: the cluster runs with production durability (`fsync`, `synchronous_commit` and
  `full_page_writes` on: every COMMIT waits for its WAL flush), unless `--non-durable` is given.
  The settings used are listed under Machine.
- Baseline (`bench/baseline.py`): the minimal correct batched loop in plain asyncio + asyncpg, on
  its OWN minimal table (one partial index on ready rows): one `FOR UPDATE SKIP LOCKED` claim of
  at most the free slots on one connection, handlers as asyncio tasks, completions written in
  batches on a second connection with one flush in flight while the next claim runs. For pickup
  and refill it waits on its own ready notification (LISTEN) when idle. It runs in the same
  repeat as the trioq run it is compared with; a ratio is the median of the per-repeat ratios
  (trioq / baseline).
- Peer (`bench/pgq.py`): PgQueuer 1.6 from PyPI, its own tables installed in the run's schema,
  one QueueManager with batch size = slots and its defaults otherwise (log aggregation off so
  completions stay countable), for drain, enqueue (single and list), pickup (its LISTEN) and idle
  statements. Ratios trioq/PgQueuer are per repeat as well. '-' marks figures without a
  counterpart.
- Each scenario repeats; tables show the median and the min-max spread.
"""


def preamble(built: dict[str, Any]) -> str:
    machine = built["machine"]
    load_start = ", ".join(f"{x:.2f}" for x in machine["load_average_at_start"])
    load_end = ", ".join(f"{x:.2f}" for x in machine["load_average_at_end"])
    dirty = " (with uncommitted changes under trioq/)" if machine["trioq_tree_dirty"] else ""
    return f"""# trioq benchmark results

Reproduce: `{machine["command"]}` from the repository root (sizes: `bench/config.py`).

## Machine

- {machine["nproc"]} CPUs ({machine["cpu"]}); PostgreSQL {machine["postgres"]} on the same machine
- Python {machine["python"]}; trioq commit {machine["trioq_commit"]}{dirty}
- run started {machine["started"]}
- per runner (duration, 1-min load average at its start): {_runners(machine["runners"])}
- load average (1, 5, 15 min) at start: {load_start}; at end: {load_end}
- The machine is shared: other engineers run test suites on the same 2 cores, so absolute
  figures move between runs; the ratios to the baseline of the same repeat move much less.

{METHOD}
## Results
"""


def _runners(timings: dict[str, dict[str, float]]) -> str:
    return ", ".join(
        f"{name} {t['seconds']:.0f} s (load {t['load_average_1min_at_start']:.1f})"
        for name, t in timings.items()
    )


def kept_analysis(path: Path) -> str:
    """The hand-written part of an existing RESULTS.md (after the marker), if any."""
    if not path.exists():
        return ""
    text = path.read_text()
    _, marker, analysis = text.partition(ANALYSIS_MARKER)
    return marker + analysis if marker else ""

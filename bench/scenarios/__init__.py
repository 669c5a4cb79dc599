"""The scenarios. Each runner repeats its workload `sizes.repeats` times and records one value
per repeat and metric in `Results`; `bench.report` turns those into medians, spreads, ratios to
the baseline and target checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from bench.config import Sizes
from bench.harness import Database, Launcher


@attrs.define(eq=False)
class Results:
    """scenario -> metric -> one value per repeat; plus free-form notes per scenario."""

    values: dict[str, dict[str, list[float]]] = attrs.field(factory=dict)
    notes: dict[str, dict[str, Any]] = attrs.field(factory=dict)

    def add(self, scenario: str, metric: str, value: float) -> None:
        self.values.setdefault(scenario, {}).setdefault(metric, []).append(float(value))

    def note(self, scenario: str, key: str, value: Any) -> None:
        self.notes.setdefault(scenario, {})[key] = value


@attrs.define(eq=False)
class Context:
    db: Database
    launcher: Launcher
    sizes: Sizes
    results: Results
    log: Callable[[str], None] = print


Runner = Callable[[Context], None]


def runners() -> dict[str, Runner]:
    """Runner name -> function, in the order a full run executes them."""
    from bench.scenarios import (
        enqueue,
        fairness,
        idle,
        latency,
        messages,
        scaling,
        throughput,
        waits,
        workflows,
    )

    return {
        "throughput": throughput.run,  # also: baseline, worker cost, statements per job
        "enqueue": enqueue.run,
        "pickup": latency.run_pickup,
        "refill": latency.run_refill,
        "idle": idle.run,
        "fairness": fairness.run,
        "workflows": workflows.run,
        "event_latency": waits.run_event_latency,
        "fanout": waits.run_fanout,
        "message_latency": messages.run_message_latency,
        "message_drain": messages.run_message_drain,
        "get_value": messages.run_get_value,
        "scaling": scaling.run,
        "prefetch": scaling.run_prefetch,
    }

"""Pure helpers the pages share: JSON pretty-printing of stored values, the workflow timeline,
the throughput chart's geometry. No I/O; `now` is a parameter."""

from __future__ import annotations

import contextlib
import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any

COLLAPSE_CHARACTERS = 2_000  # longer values start collapsed (<details>)
CHART_WIDTH = 240
CHART_HEIGHT = 40


def pretty_json(text: str | None, full_length: int | None = None) -> dict[str, Any]:
    """A stored JSON value (as text, already cut) for display: indented when it parses, as is
    otherwise; `truncated` when the database held more than was read."""
    if text is None:
        return {"text": "null", "collapsed": False, "truncated": False, "length": 0}
    shown = text
    # Left as is when cut mid-value, or nested past Python's recursion limit.
    with contextlib.suppress(ValueError, RecursionError):
        shown = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    length = full_length if full_length is not None else len(text)
    return {
        "text": shown,
        "collapsed": len(shown) > COLLAPSE_CHARACTERS,
        "truncated": length > len(text),
        "length": length,
    }


def age_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if abs(seconds) >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


def count_text(count: int, cap: int, estimate: int | None, *, capped: bool = False) -> str:
    """An exact count below the cap; past it (or when the walk that counted it stopped early:
    `capped`) the planner's estimate when it is larger, else "count+"."""
    if count < cap and not capped:
        return f"{count:,}"
    if estimate is not None and estimate > count:
        return f"≈{estimate:,}"
    return f"{count:,}+"


def _parse(value: str | None) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return None


def _moment(text: Any) -> datetime.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.datetime.fromisoformat(text)
    except ValueError:
        return None


def timeline(
    job: Mapping[str, Any],
    history: Sequence[Mapping[str, Any]],
    children: Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """The workflow's history as timeline entries, in order.

    A step's duration is the time from the end of the previous checkpoint (its commit, or a
    sleep's wake time) to the step's own commit: checkpoints store when they were written, not
    when the primitive began, so this includes any replay before it (shown as "about")."""
    child_states = {child["id"]: child["state"] for child in children}
    entries: list[dict[str, Any]] = []
    previous_end: datetime.datetime | None = job.get("created_at")
    for point in history:
        value = _parse(point["value"])
        at: datetime.datetime = point["created_at"]
        entry: dict[str, Any] = {
            "position": point["position"],
            "kind": point["kind"],
            "name": point["name"],
            "at": at,
            "value": pretty_json(point["value"]),
            "duration_seconds": None,
            "detail": "",
            "link": None,
        }
        end = at
        if point["kind"] == "step" and previous_end is not None:
            entry["duration_seconds"] = max(0.0, (at - previous_end).total_seconds())
        elif point["kind"] == "sleep" and isinstance(value, dict):
            wake = _moment(value.get("wake_at"))
            entry["detail"] = f"wakes at {value.get('wake_at')}"
            if wake is not None:
                entry["duration_seconds"] = max(0.0, (wake - at).total_seconds())
                end = max(at, wake)
        elif point["kind"] == "event" and isinstance(value, dict):
            entry["detail"] = _event_detail(point["name"], value)
            emitted = point.get("emitted_at")
            if emitted is not None and "payload" in value:  # emitted before the wait: no wait
                entry["duration_seconds"] = max(0.0, (emitted - at).total_seconds())
                end = max(at, emitted)
        elif point["kind"] == "spawn" and isinstance(value, dict):
            child_id = value.get("child_id")
            entry["link"] = child_id
            entry["detail"] = f"child {child_id}: {child_states.get(child_id, 'unknown')}"
        elif point["kind"] in ("child", "gather") and isinstance(value, dict):
            entry["detail"] = _children_detail(value)
        entries.append(entry)
        previous_end = end
    return entries


def _event_detail(key: str, value: Mapping[str, Any]) -> str:
    if value.get("timeout"):
        return f"waited for event {key!r}: timed out"
    if "payload" in value:
        return f"waited for event {key!r}: received"
    return f"waiting for event {key!r} (deadline {value.get('deadline') or 'none'})"


def _children_detail(value: Mapping[str, Any]) -> str:
    rows = value.get("children") or []
    if isinstance(rows, list):
        states = [f"{row[0]}: {row[1]}" for row in rows if isinstance(row, list) and len(row) > 1]
        return "children " + ", ".join(states)
    return ""


def timeline_bars(entries: Sequence[dict[str, Any]]) -> None:
    """Give each entry a bar width (percent of the longest duration), in place."""
    longest = max((e["duration_seconds"] or 0.0 for e in entries), default=0.0)
    for entry in entries:
        duration = entry["duration_seconds"]
        if duration is None or longest <= 0:
            entry["bar_percent"] = 0
        else:
            entry["bar_percent"] = max(1, round(100 * duration / longest))


def chart_bars(completed: Sequence[int], failed: Sequence[int]) -> dict[str, Any]:
    """Geometry of a 60-minute stacked bar chart (completed below, failed on top) for an SVG
    drawn by the template: no chart library, nothing vendored, readable without JavaScript."""
    peak = max((c + f for c, f in zip(completed, failed, strict=True)), default=0)
    width = CHART_WIDTH / max(len(completed), 1)
    bars = []
    for index, (done, bad) in enumerate(zip(completed, failed, strict=True)):
        scale = 0.0 if peak == 0 else (CHART_HEIGHT - 2) / peak
        done_height = round(done * scale, 2)
        bad_height = round(bad * scale, 2)
        bars.append(
            {
                "x": round(index * width, 2),
                "width": round(max(width - 0.5, 0.5), 2),
                "done_y": round(CHART_HEIGHT - done_height, 2),
                "done_height": done_height,
                "bad_y": round(CHART_HEIGHT - done_height - bad_height, 2),
                "bad_height": bad_height,
                "title": f"{60 - index} min ago: {done} completed, {bad} failed",
            }
        )
    return {
        "bars": bars,
        "width": CHART_WIDTH,
        "height": CHART_HEIGHT,
        "peak": peak,
        "completed": sum(completed),
        "failed": sum(failed),
    }

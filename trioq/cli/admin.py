"""`trioq jobs | job | retry | cancel | purge | queue`: inspect and redrive jobs from a shell.

Every command prints a table (or `--json`), reads the schema given by `--schema`, and exits 0 on
success, 1 when something asked for does not exist or cannot change (see docs/cli.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._core.concurrency import LIMIT_FORM as KEY_LIMIT_FORM
from .._core.concurrency import MAX_LIMIT, validate_pattern
from .._core.deadlines import describe as describe_deadline
from .._core.errors import JobNotFound
from .._core.identifiers import validate_name, validate_schema
from .._core.limits import LIMIT_FORM, RATE_FORM, Rate, parse_global_limit, parse_rate
from .._core.states import TERMINAL_IN_ORDER, JobState
from .workflows import print_workflow

if TYPE_CHECKING:  # imported when a command runs: `trioq --help` builds this parser
    from .._seam.admin import (
        ConcurrencyKeyStatus,
        ConcurrencyLimit,
        ConcurrencyRate,
        KeyRateStatus,
        QueueLimit,
    )
    from .._seam.driver import JobRecord
    from ..app import App
    from ..client import Client

FINISHED = tuple(state.value for state in TERMINAL_IN_ORDER)  # plain strings: argparse choices
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
Command = Callable[[argparse.Namespace], Any]


def duration(text: str) -> float:
    """`90`, `45s`, `30m`, `12h`, `7d`, `2w` -> seconds (argparse type)."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration (a number with an optional unit s, m, h, d or w: 7d)"
        )
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def job_id(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a job id (a positive integer)")
    return int(text)


def _app(args: argparse.Namespace) -> App:
    from ..app import App

    return App(
        args.database_url,
        schema=validate_schema(args.schema),
        prepared_statements=getattr(args, "prepared_statements", None) or "auto",
    )


def _plain(value: Any) -> Any:
    import attrs  # here: the parser that `trioq --help` builds needs none of it

    return attrs.asdict(value) if attrs.has(type(value)) else value


def _print_json(value: Any) -> None:
    print(json.dumps(value, default=str, indent=2))


def _age(moment: datetime.datetime | None) -> str:
    if moment is None:
        return "-"
    seconds = (datetime.datetime.now(datetime.UTC) - moment).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if abs(seconds) >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


# --- commands ---------------------------------------------------------------------------------


async def cmd_jobs(args: argparse.Namespace) -> int:
    async with _app(args).client() as client:
        records = await client.jobs(
            states=args.state,
            task=args.task,
            queue=args.queue,
            partition_key=args.partition_key,
            older_than=args.older_than,
            before_id=args.before,
            limit=args.limit,
        )
    if args.json:
        _print_json({"jobs": [_plain(r) for r in records], "next_before": _next(records, args)})
        return 0
    # `runs` counts executions (claims); `try` only those that may fail: a workflow's sleep or
    # wait gives its attempt back, so `try` alone read 0/5 for a workflow that had run twice.
    print(
        f"{'id':>10} {'state':<10} {'task':<24} {'queue':<14} {'runs':>4} {'try':>5} {'age':>6}"
        "  error"
    )
    for r in records:
        error = (r.error or {}).get("message", "") if isinstance(r.error, dict) else ""
        print(
            f"{r.id:>10} {r.state:<10} {r.task[:24]:<24} {r.queue[:14]:<14} {r.executions:>4} "
            f"{r.attempt:>2}/{r.max_attempts:<2} {_age(r.created_at):>6}  {str(error)[:40]}"
        )
    following = _next(records, args)
    if following is not None:
        print(f"(more: --before {following})")
    return 0


def _next(records: Sequence[JobRecord], args: argparse.Namespace) -> int | None:
    return records[-1].id if len(records) == args.limit else None


async def cmd_job(args: argparse.Namespace) -> int:
    async with _app(args).client() as client:
        record = await client.get_job(args.job_id)
        attempts = await client.attempts(args.job_id)
        history = await client.history(args.job_id)
        values = await client.values(args.job_id)
    if args.json:
        _print_json(
            {
                "job": _plain(record),
                "attempts": [_plain(a) for a in attempts],
                "history": [_plain(h) for h in history],
                "patches": [h.name for h in history if h.kind == "patch"],
                "values": {v.key: v.value for v in values},
            }
        )
        return 0
    import attrs

    for field in attrs.fields(type(record)):
        value = getattr(record, field.name)
        shown = json.dumps(value, default=str) if isinstance(value, dict | list) else value
        print(f"{field.name:>16}: {shown}")
    deadline = describe_deadline(record.deadline_at, record.deadline_source, record.error)
    if deadline is not None:
        print(f"\ndeadline: {deadline}")
    print(f"\nattempts ({len(attempts)} that did not complete):")
    for a in attempts:
        print(f"  #{a.attempt} {a.outcome} at {a.finished_at}: {a.error_type}: {a.error_message}")
        if a.traceback and args.tracebacks:
            print("    " + a.traceback.rstrip().replace("\n", "\n    "))
    print_workflow(history, values)
    patches = [f"{h.name} (position {h.position})" for h in history if h.kind == "patch"]
    if patches:
        print(f"\npatches: {', '.join(patches)}")
    return 0


async def cmd_retry(args: argparse.Namespace) -> int:
    if bool(args.job_ids) == bool(args.failed):
        raise ValueError("retry: give job ids, or --failed (with --task/--queue), not both")
    async with _app(args).client() as client:
        ids = list(args.job_ids)
        if args.failed:
            ids = await _all_ids(client, (JobState.FAILED,), args.task, args.queue)
        outcomes = [(job, await _retry_one(client, job)) for job in ids]
    return _report("retried", outcomes, args, wanted=JobState.READY)


async def _retry_one(client: Client, job: int) -> str:
    try:
        return await client.retry(job)
    except JobNotFound:
        return "missing"


async def _all_ids(
    client: Client, states: tuple[str, ...], task: str | None, queue: str | None
) -> list[int]:
    ids: list[int] = []
    before: int | None = None
    while True:
        page = await client.jobs(states=states, task=task, queue=queue, before_id=before, limit=500)
        ids.extend(record.id for record in page)
        if len(page) < 500:
            return ids
        before = page[-1].id


async def cmd_cancel(args: argparse.Namespace) -> int:
    trees: dict[int, list[tuple[int, str, str]]] = {}
    async with _app(args).client() as client:
        outcomes = []
        for job in args.job_ids:
            before = await client.descendants(job) if args.tree else []
            try:
                outcomes.append((job, await client.cancel(job, tree=args.tree)))
            except JobNotFound:
                outcomes.append((job, "missing"))
                continue
            if before:
                after = {member.id: member.state for member in await client.descendants(job)}
                trees[job] = [(m.id, m.state, after.get(m.id, "gone")) for m in before]
    # running, ready (a suspended workflow woken to run its cleanup) and waiting (for children)
    # are on their way to cancelled.
    return _report(
        "cancelled",
        outcomes,
        args,
        wanted=JobState.CANCELLED,
        also=(JobState.RUNNING, JobState.READY, JobState.WAITING),
        trees=trees,
    )


# What a descendant's state after `cancel --tree` means, in the report's words.
_TREE_OUTCOMES: dict[str, str] = {
    JobState.CANCELLED: "cancelled",
    JobState.RUNNING: "running, cancel requested",
    JobState.READY: "woken to run their cleanup",
    JobState.WAITING: "waiting for their own children",
}


def describe_tree(members: Sequence[tuple[int, str, str]]) -> str:
    """One line for what `cancel --tree` did to a job's descendants (id, state before, after):
    counts by outcome with their ids, and how many had already finished."""
    by_outcome: dict[str, list[int]] = {}
    finished = 0
    for member_id, before, after in members:
        if before in FINISHED:
            finished += 1
            continue
        outcome = _TREE_OUTCOMES.get(after, f"now {after}")  # JobState values are str
        by_outcome.setdefault(outcome, []).append(member_id)
    parts = [f"{len(ids)} {outcome} ({_ids(ids)})" for outcome, ids in by_outcome.items()]
    if finished:
        parts.append(f"{finished} already finished")
    return f"{len(members)} descendant(s): " + "; ".join(parts)


def _ids(ids: Sequence[int], shown: int = 10) -> str:
    text = ", ".join(str(job) for job in ids[:shown])
    return text if len(ids) <= shown else f"{text}, ... {len(ids) - shown} more"


def _report(
    verb: str,
    outcomes: Sequence[tuple[int, str]],
    args: argparse.Namespace,
    *,
    wanted: str,
    also: tuple[str, ...] = (),
    trees: dict[int, list[tuple[int, str, str]]] | None = None,
) -> int:
    """One line per job (or JSON), and under it what became of its descendants (`cancel
    --tree`); exit 1 if any job was missing or could not change."""
    trees = trees or {}
    if args.json:
        jobs: list[dict[str, Any]] = []
        for job, state in outcomes:
            entry: dict[str, Any] = {"id": job, "state": state}
            if job in trees:
                entry["descendants"] = [
                    {"id": member, "before": before, "state": after}
                    for member, before, after in trees[job]
                ]
            jobs.append(entry)
        _print_json({"jobs": jobs})
    else:
        for job, state in outcomes:
            note = "" if state in (wanted, *also) else "  (left alone)"
            print(f"{job}: {state}{note}")
            if job in trees:
                print(f"  {describe_tree(trees[job])}")
        print(f"{sum(state in (wanted, *also) for _, state in outcomes)} {verb}")
    return 0 if all(state in (wanted, *also) for _, state in outcomes) else 1


async def cmd_purge(args: argparse.Namespace) -> int:
    states = tuple(args.state)
    for state in states:
        if state not in FINISHED:
            raise ValueError(
                f"--state: {state!r} is not finished; purge takes {', '.join(FINISHED)}"
            )
    async with _app(args).client() as client:
        deleted = await client.purge(
            states=states, older_than=args.older_than, task=args.task, queue=args.queue
        )
    if args.json:
        _print_json({"deleted": deleted})
    else:
        print(
            f"deleted {deleted} job(s) ({', '.join(states)}) finished over {args.older_than}s ago"
        )
    return 0


async def cmd_queue(args: argparse.Namespace) -> int:
    if args.action != "list" and args.name is None:
        raise ValueError(f"queue {args.action}: name the queue (trioq queue {args.action} NAME)")
    if args.action in ("limit", "rate"):
        return await _queue_limits(args)
    if args.value is not None:
        raise ValueError(f"queue {args.action}: takes only the queue's name, not {args.value!r}")
    async with _app(args).client() as client:
        if args.action == "pause":
            changed = await client.pause_queue(args.name)
        elif args.action == "resume":
            changed = await client.resume_queue(args.name)
        else:
            changed = True
        paused = await client.paused_queues()
        limits = await client.queue_limits() if args.action == "list" else []
    if args.json:
        shown = {"changed": changed, "paused": [_plain(p) for p in paused]}
        if args.action == "list":
            shown["limits"] = [_limit_json(limit) for limit in limits]
        _print_json(shown)
    elif args.action != "list":
        verb = "paused" if args.action == "pause" else "resumed"
        print(f"queue {args.name}: {verb}" + ("" if changed else f" (it already was {verb})"))
    else:
        for p in paused:
            print(f"{p.queue}: paused since {p.paused_at}")
        for limit in limits:
            print(_limit_line(limit))
        if not paused and not limits:
            print("no paused or limited queues")
    return 0


def key_limit(text: str) -> int | None:
    """`trioq key limit PATTERN N|none`: a limit, or None to remove the pattern's."""
    if text == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_LIMIT:
        raise ValueError(f"key limit: {text!r} must be none or {KEY_LIMIT_FORM}")
    return value


async def cmd_key(args: argparse.Namespace) -> int:
    """`trioq key limit|rate PATTERN VALUE`, `trioq key list`: the value and the pattern are
    checked before connecting, so a bad one changes nothing."""
    if args.action != "list" and (args.pattern is None or args.limit is None):
        form = "N|none" if args.action == "limit" else "N/PERIOD|none"
        raise ValueError(
            f"key {args.action}: name the pattern and the {args.action} "
            f"(trioq key {args.action} PATTERN {form})"
        )
    limit = key_limit(args.limit) if args.action == "limit" else None
    rate = parse_rate("key rate", args.limit) if args.action == "rate" else None
    if args.action != "list":
        validate_pattern(args.pattern)
    async with _app(args).client() as client:
        changed = True
        if args.action == "limit":
            changed = await client.set_key_limit(args.pattern, limit)
        elif args.action == "rate":
            changed = await client.set_key_rate(args.pattern, rate)
        limits = await client.key_limits()
        rates = await client.key_rates()
        keys = await client.key_status()
        rated = await client.key_rate_status()
    if args.json:
        _print_json(
            {
                "changed": changed,
                "limits": [_plain(limit) for limit in limits],
                "rates": [{**_plain(row), "rate": str(row.rate)} for row in rates],
                "keys": [_plain(key) for key in keys],
                "rated_keys": [{**_plain(key), "rate": str(key.rate)} for key in rated],
            }
        )
        return 0
    if args.action != "list":
        print(_key_change_line(args.action, args.pattern, limit, rate, changed))
        return 0
    _print_key_list(limits, rates, keys, rated)
    return 0


def _key_change_line(
    action: str, pattern: str, limit: int | None, rate: Rate | None, changed: bool
) -> str:
    if action == "limit" and limit is not None:
        return f"key {pattern}: at most {limit} running"
    if action == "rate" and rate is not None:
        return f"key {pattern}: at most {rate} starts"
    return f"key {pattern}: {action} removed" + ("" if changed else " (it had none)")


def _print_key_list(
    limits: Sequence[ConcurrencyLimit],
    rates: Sequence[ConcurrencyRate],
    keys: Sequence[ConcurrencyKeyStatus],
    rated: Sequence[KeyRateStatus],
) -> None:
    for row in limits:
        print(f"{row.pattern}: at most {row.max_running} running (set {row.updated_at})")
    if not limits:
        print("no key limits set (keys use their task's limit, else 1)")
    for rate_row in rates:
        print(f"{rate_row.pattern}: at most {rate_row.rate} starts (set {rate_row.updated_at})")
    for key in keys:
        state = "at its limit" if key.saturated else "runs"
        print(f"key {key.key} {state} {key.running}/{key.limit}")
    for entry in rated:
        line = f"key {entry.key} rate {entry.rate}: {entry.recent_starts} started in the window"
        if entry.rate_limited_until is not None:
            line += f", rate limited until {entry.rate_limited_until}"
        print(line)


async def _queue_limits(args: argparse.Namespace) -> int:
    """`trioq queue limit NAME N|none`, `trioq queue rate NAME N/PERIOD|none`: the value is
    checked before connecting, so a bad one changes nothing."""
    validate_name("queue", args.name)
    if args.value is None:
        form = LIMIT_FORM if args.action == "limit" else RATE_FORM
        raise ValueError(f"queue {args.action} {args.name}: give a value, {form}")
    async with _app(args).client() as client:
        if args.action == "limit":
            limit = parse_global_limit("limit", args.value)
            await client.set_queue_limit(args.name, limit)
        else:
            await client.set_queue_rate(args.name, parse_rate("rate", args.value))
        limits = {limit.queue: limit for limit in await client.queue_limits()}
    current = limits.get(args.name)
    if args.json:
        _print_json({"queue": args.name, "limits": _limit_json(current)})
    elif current is None:
        print(f"queue {args.name}: no global or rate limit")
    else:
        print(_limit_line(current))
    return 0


def _limit_json(limit: QueueLimit | None) -> dict[str, Any] | None:
    if limit is None:
        return None
    return {**_plain(limit), "rate": None if limit.rate is None else str(limit.rate)}


def _limit_line(limit: QueueLimit) -> str:
    parts = []
    if limit.global_limit is not None:
        parts.append(f"global limit {limit.global_limit} ({limit.running} running)")
    if limit.rate is not None:
        parts.append(f"rate {limit.rate} ({limit.recent_starts} in the current window)")
        if limit.rate_limited_until is not None:
            parts.append(f"rate limited until {limit.rate_limited_until}")
    return f"{limit.queue}: " + ", ".join(parts)


# --- parsing ----------------------------------------------------------------------------------


def add_commands(
    command: Callable[[str, str], argparse.ArgumentParser], table: dict[str, Command]
) -> None:
    """Register the commands on the main parser (`command(name, help)` makes a subparser)."""

    def common(cmd: argparse.ArgumentParser) -> argparse.ArgumentParser:
        cmd.add_argument("--schema", default="trioq", help="trioq's schema (default: %(default)s)")
        cmd.add_argument("--json", action="store_true", help="print JSON instead of a table")
        return cmd

    def filters(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("--task", default=None, help="only this task (default: any)")
        cmd.add_argument("--queue", default=None, help="only this queue (default: any)")

    jobs = common(command("jobs", "list jobs, newest first (filters, paging)"))
    filters(jobs)
    jobs.add_argument(
        "--state",
        action="append",
        default=None,
        choices=[state.value for state in JobState],
        help="only this state (repeatable; default: any)",
    )
    jobs.add_argument("--partition-key", default=None, help="only this partition key")
    jobs.add_argument(
        "--older-than", type=duration, default=None, metavar="AGE", help="created over AGE ago (7d)"
    )
    jobs.add_argument("--limit", type=int, default=50, help="page size (default: %(default)s)")
    jobs.add_argument(
        "--before", type=job_id, default=None, metavar="ID", help="the page after this id"
    )
    table["jobs"] = cmd_jobs

    job = common(command("job", "one job: its row, failed attempts, workflow history"))
    job.add_argument("job_id", type=job_id, metavar="JOB_ID")
    job.add_argument(
        "--no-tracebacks", dest="tracebacks", action="store_false", help="hide tracebacks"
    )
    table["job"] = cmd_job

    retry = common(command("retry", "redrive failed or cancelled jobs (keeping their history)"))
    retry.add_argument("job_ids", type=job_id, nargs="*", metavar="JOB_ID")
    retry.add_argument("--failed", action="store_true", help="every failed job (with filters)")
    filters(retry)
    table["retry"] = cmd_retry

    cancel = common(command("cancel", "cancel jobs (running ones through their worker)"))
    cancel.add_argument("job_ids", type=job_id, nargs="+", metavar="JOB_ID")
    cancel.add_argument(
        "--tree",
        action="store_true",
        help="cancel every descendant too, whatever its spawn's on_parent_cancel policy",
    )
    table["cancel"] = cmd_cancel

    purge = common(command("purge", "delete finished jobs older than an age"))
    purge.add_argument(
        "--state", action="append", required=True, choices=FINISHED, help="repeatable"
    )
    purge.add_argument(
        "--older-than", type=duration, required=True, metavar="AGE", help="finished over AGE ago"
    )
    filters(purge)
    table["purge"] = cmd_purge

    queue = common(
        command("queue", "pause, resume or limit a queue (limit: N|none, rate: N/PERIOD|none)")
    )
    queue.add_argument("action", choices=("pause", "resume", "list", "limit", "rate"))
    queue.add_argument("name", nargs="?", default=None, metavar="NAME")
    queue.add_argument("value", nargs="?", default=None, metavar="VALUE")
    table["queue"] = cmd_queue

    key = common(
        command("key", "limit how many jobs of a concurrency key run at once, or start per period")
    )
    key.add_argument("action", choices=("limit", "rate", "list"))
    key.add_argument(
        "pattern", nargs="?", default=None, metavar="PATTERN", help="a key, or a prefix ending in *"
    )
    key.add_argument(
        "limit",
        nargs="?",
        default=None,
        metavar="VALUE",
        help="limit: N (at most N running) or none; rate: N/PERIOD (5/s, 100/m) or none",
    )
    table["key"] = cmd_key


__all__ = ["add_commands", "duration"]

"""`trioq workflows`: unfinished workflows and what each waits on; and the workflow parts of
`trioq job ID` (its history as a timeline, its published values). See docs/cli.md."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._core.identifiers import validate_schema
from ..workflow_view import WORKFLOW_STATES, timeline

if TYPE_CHECKING:
    from .._seam.driver import WorkflowValue
    from .._seam.workflow import Checkpoint

Command = Callable[[argparse.Namespace], Any]


async def cmd_workflows(args: argparse.Namespace) -> int:
    from ..app import App  # here: `trioq --help` builds this parser (docs/cli.md)

    app = App(
        args.database_url,
        schema=validate_schema(args.schema),
        prepared_statements=getattr(args, "prepared_statements", None) or "auto",
    )
    async with app.client() as client:
        views = await client.workflows(
            states=args.state, task=args.task, before_id=args.before, limit=args.limit
        )
    following = views[-1].id if len(views) == args.limit else None
    if args.json:
        out = {"workflows": [view.as_json() for view in views], "next_before": following}
        print(json.dumps(out, indent=2))
        return 0
    print(f"{'id':>10} {'state':<9} {'task':<24} {'steps':>5}  waits on")
    for view in views:
        print(
            f"{view.id:>10} {view.state:<9} {view.task[:24]:<24} {view.checkpoints:>5}  "
            f"{view.waits_on}"
        )
    if following is not None:
        print(f"(more: --before {following})")
    return 0


def print_workflow(history: Sequence[Checkpoint], values: Sequence[WorkflowValue]) -> None:
    """The workflow sections of `trioq job ID`."""
    if values:
        print(f"\nvalues ({len(values)}, set with ctx.set_value):")
        for value in values:
            shown = json.dumps(value.value, default=str)
            print(f"  {value.key}: {shown[:100]}  (at {value.updated_at})")
    if history:
        print(f"\ntimeline ({len(history)} checkpoints):")
        for line in timeline(history):
            print(f"  {line}")


def add_commands(
    command: Callable[[str, str], argparse.ArgumentParser], table: dict[str, Command]
) -> None:
    workflows = command("workflows", "unfinished workflows and what each one waits on")
    workflows.add_argument("--schema", default="trioq", help="trioq's schema")
    workflows.add_argument("--json", action="store_true", help="print JSON")
    workflows.add_argument(
        "--state",
        action="append",
        choices=[state.value for state in WORKFLOW_STATES],
        default=None,
        help="only this state (repeatable; default: all three)",
    )
    workflows.add_argument("--task", default=None, help="only this task (default: any)")
    workflows.add_argument("--limit", type=int, default=50, help="page size")
    workflows.add_argument(
        "--before", type=int, default=None, metavar="ID", help="the page after this id"
    )
    table["workflows"] = cmd_workflows


__all__ = ["add_commands", "print_workflow"]

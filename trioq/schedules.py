"""Schedule declarations: what `@app.periodic` and `client.schedule` validate and store."""

from __future__ import annotations

from typing import Any

from ._core import codec
from ._core.identifiers import validate_name
from ._core.retry import DEFAULT_MAX_ATTEMPTS
from ._core.schedule import (
    DEFAULT_CATCHUP_LIMIT,
    Cron,
    validate_catchup_limit,
    validate_misfire,
)
from ._enqueue.rows import TaskLike, check_payload_type
from ._seam.schedules import NewSchedule


def new_schedule(
    name: str,
    spec: TaskLike,
    *,
    cron: str,
    timezone: str = "UTC",
    payload: Any = None,
    misfire: str = "latest",
    catchup_limit: int = DEFAULT_CATCHUP_LIMIT,
    origin: str = "runtime",
) -> NewSchedule:
    """Validate a schedule declaration (one-line errors naming the field) before any SQL."""
    validate_name("schedule", name)
    parsed = Cron(cron, timezone)
    check_payload_type(spec, payload, "payload")
    return NewSchedule(
        name=name,
        task=spec.name,
        queue=spec.queue,
        payload_json=codec.encode(payload, root="payload"),
        cron=parsed.expression,
        timezone=parsed.timezone,
        misfire=validate_misfire(misfire).value,
        catchup_limit=validate_catchup_limit(catchup_limit),
        # A schedule row stores its jobs' attempts (NOT NULL): the declaration's, else 5.
        max_attempts=DEFAULT_MAX_ATTEMPTS if spec.max_attempts is None else spec.max_attempts,
        version=getattr(spec, "version", 1),
        origin=origin,
    )

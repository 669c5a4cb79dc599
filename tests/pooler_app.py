"""The app `trioq worker` serves behind PgBouncer in tests/test_pooler.py (`tests.pooler_app:app`);
its schema comes from TRIOQ_TEST_SCHEMA, its connection options from the command line."""

from __future__ import annotations

import os
from typing import Any

import trioq

app = trioq.App(schema=os.environ.get("TRIOQ_TEST_SCHEMA", "trioq"))


@app.task("double")
async def double(ctx: trioq.Context, payload: dict[str, Any]) -> int:
    return int(payload["n"]) * 2

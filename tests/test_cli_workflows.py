"""`trioq workflows` and the workflow parts of `trioq job ID`, on states built in SQL."""

from __future__ import annotations

import datetime
import json
from typing import Any

import psycopg
import pytest

from tests.support import force_sleeping, force_waiting
from trioq import cli
from trioq.producer import SyncProducer

# Jobs are enqueued by name before a worker serves them: the unserved-name warning is expected.
pytestmark = pytest.mark.filterwarnings("ignore::trioq.UnservedTaskWarning")


def trioq_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    code = cli.main([*argv])
    out = capsys.readouterr().out
    return code, json.loads(out) if "--json" in argv else out


def test_workflows_lists_waits_and_job_shows_the_timeline_and_values(
    pg_url: str, pg_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--database-url", pg_url, "--schema", pg_schema]
    assert cli.main(["migrate", *base]) == 0
    capsys.readouterr()
    with SyncProducer(pg_url, schema=pg_schema) as producer:
        on_topic, on_event, sleeper, ready = (
            producer.enqueue("review", {"n": n}).id for n in range(4)
        )
    with psycopg.connect(pg_url, autocommit=True) as conn:
        force_waiting(conn, pg_schema, on_topic, topic="approval", checkpoint_count=2)
        force_waiting(
            conn, pg_schema, on_event, event_key="paid:7", wake_in=datetime.timedelta(hours=1)
        )
        force_sleeping(conn, pg_schema, sleeper, datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC))
        conn.execute(
            f"INSERT INTO {pg_schema}.checkpoints (job_id, position, kind, name, value,"
            " created_at) VALUES (%s, 0, 'step', 'draft', '\"v1\"', now()),"
            " (%s, 1, 'receive', 'approval', '{\"messages\": [{\"ok\": false}]}', now())",
            (on_topic, on_topic),
        )
        conn.execute(
            f"INSERT INTO {pg_schema}.workflow_values (job_id, key, value, updated_at)"
            " VALUES (%s, 'stage', '\"amending\"', now())",
            (on_topic,),
        )

    code, listed = trioq_cli(capsys, "workflows", *base, "--json")
    assert code == 0
    waits = {w["id"]: w["waits_on"] for w in listed["workflows"]}
    assert ready not in waits  # not started: not a workflow yet
    assert waits[on_topic] == "message 'approval'"
    assert waits[on_event].startswith("event 'paid:7' (until ")
    assert waits[sleeper] == "sleeping until 2030-01-01 00:00:00 UTC"
    code, sleeping = trioq_cli(capsys, "workflows", *base, "--json", "--state", "sleeping")
    assert [w["id"] for w in sleeping["workflows"]] == [sleeper]
    code, table = trioq_cli(capsys, "workflows", *base, "--task", "review")
    assert code == 0 and "message 'approval'" in table and "sleeping until 2030" in table
    with pytest.raises(SystemExit) as usage:
        cli.main(["workflows", *base, "--state", "completed"])  # not a workflow state
    assert usage.value.code == 2
    assert "invalid choice: 'completed'" in capsys.readouterr().err

    code, text = trioq_cli(capsys, "job", *base, str(on_topic))
    assert code == 0
    assert "values (1, set with ctx.set_value):" in text and 'stage: "amending"' in text
    assert "timeline (2 checkpoints):" in text
    assert "step     draft" in text
    assert 'receive  approval  received 1: [{"ok":false}]' in text
    code, shown = trioq_cli(capsys, "job", *base, str(on_topic), "--json")
    assert shown["values"] == {"stage": "amending"}

"""The enqueue fast paths (`job_insert_one` for a single job, `job_insert_batch` for a batch):
without dedup keys they write exactly the rows the full `job_insert_many` writes, return the
ids in payload order even when batches interleave, and send one ready notification per
statement. Also the cheaper name CHECKs of migration 0009 and the payload check's inline walk,
each against the rule it replaced."""

from __future__ import annotations

import datetime
import json
import math
from typing import Any

import hypothesis
import psycopg
import pytest
import trio
from hypothesis import strategies as st

from tests.support import make_app
from tests.test_enqueue import listening, notifications_until
from trioq._core import codec
from trioq._core.errors import PayloadError, SchemaNotMigrated
from trioq._enqueue.rows import (
    FINISHED_STATES,
    UNFINISHED_STATES,
    EnqueueOptions,
    TaskDeclaration,
    build_jobs,
)
from trioq._pg.inserts import insert_params, insert_statement
from trioq._seam.driver import NewJob, NewJobs
from trioq._sql import queries

TASK = TaskDeclaration("noop", version=3)
PAYLOADS: list[Any] = [
    {},
    None,
    {"n": 1, "text": 'naïve "quoted" \\ back', "list": [1, 2.5, True, None]},
    [1, {"nested": {"deep": ["x"]}}],
    "just a string with a } and a {",
    12345678901234567890,
]
OPTION_SETS = {
    "defaults": EnqueueOptions(),
    "delayed": EnqueueOptions(delay=3600, priority=-5, queue="later"),
    "run_at_past": EnqueueOptions(
        run_at=datetime.datetime(2020, 1, 2, 3, 4, 5, tzinfo=datetime.UTC), partition_key="k1"
    ),
    "run_at_future": EnqueueOptions(
        run_at=datetime.datetime(2100, 1, 1, tzinfo=datetime.UTC), max_attempts=9
    ),
    "everything": EnqueueOptions(priority=32767, partition_key="p", max_attempts=1, delay=0.5),
}


async def test_insert_statement_takes_the_fast_path_only_for_a_batch_without_keys() -> None:
    plain = build_jobs(TASK, [{}, {}], EnqueueOptions())
    keyed = build_jobs(TASK, [{}, {}], EnqueueOptions(), dedup_keys=["a", None])
    assert insert_statement(plain)[0] == "job_insert_batch"
    single = build_jobs(TASK, [{}], EnqueueOptions(), single=True)
    assert insert_statement(single)[0] == "job_insert_one"
    assert insert_statement(build_jobs(TASK, [{}], EnqueueOptions()))[0] == "job_insert_one"
    assert insert_statement(build_jobs(TASK, [{}], EnqueueOptions(dedup_key="k"), single=True))[
        0
    ] == ("job_insert_many")
    assert insert_statement(keyed)[0] == "job_insert_many"
    assert insert_statement(list(plain))[0] == "job_insert_many"  # rows from anywhere else


def test_a_batch_is_the_sequence_of_jobs_it_stands_for() -> None:
    """Only the keyed jobs of a batch carry the uniqueness options (as build_jobs made them)."""
    batch = build_jobs(
        TASK,
        [{"a": 1}, {"b": 2}, None],
        EnqueueOptions(unique_for=60, partition_key="p"),
        dedup_keys=["k1", None, "k3"],
    )
    assert isinstance(batch, NewJobs)
    common: dict[str, Any] = {"queue": "default", "task": "noop", "partition_key": "p"}
    keyed: dict[str, Any] = {"unique_for_seconds": 60.0, "unique_states": ("completed",)}
    expected = [
        NewJob(payload_json='{"a":1}', dedup_key="k1", version=3, **common, **keyed),
        NewJob(payload_json='{"b":2}', version=3, **common),
        NewJob(payload_json="null", dedup_key="k3", version=3, **common, **keyed),
    ]
    assert list(batch) == expected
    assert [batch[0], batch[1], batch[-1]] == expected
    assert batch[1:] == expected[1:]
    assert len(batch) == 3


@pytest.mark.parametrize("options", OPTION_SETS.values(), ids=list(OPTION_SETS))
async def test_fast_and_full_statements_write_identical_rows(
    pg_url: str, pg_schema: str, options: EnqueueOptions
) -> None:
    """The same batch through both statements, in one transaction (one now()): every column
    but the id is equal, row by row, and both return the ids in payload order."""
    async with make_app(pg_url, pg_schema).client(migrate=True):
        pass
    batch = build_jobs(TASK, PAYLOADS, options)
    name, fast_params = insert_statement(batch)
    assert name == "job_insert_batch"
    statements = queries(pg_schema)
    with psycopg.connect(pg_url) as conn:  # one transaction, rolled back
        fast = conn.execute(statements["job_insert_batch"], fast_params).fetchall()
        full = conn.execute(statements["job_insert_many"], insert_params(list(batch))).fetchall()
        [(fast_ids, _sent)] = fast  # one row: the ids as one array, in payload order
        full_ids = [row[1] for row in full]
        assert [row[2] for row in full] == [True] * len(PAYLOADS)
        one_ids = []
        for payload in PAYLOADS:
            name, one_params = insert_statement(build_jobs(TASK, [payload], options, single=True))
            assert name == "job_insert_one"
            [(one_id, _notified)] = conn.execute(statements[name], one_params).fetchall()
            one_ids.append(one_id)
        rows = dict(
            conn.execute(
                f"SELECT id, to_jsonb(j) - 'id' FROM {pg_schema}.jobs j WHERE id = ANY(%s)",
                [fast_ids + full_ids + one_ids],
            ).fetchall()
        )
        conn.rollback()
    assert len(rows) == 3 * len(PAYLOADS)
    for fast_id, full_id, one_id, payload in zip(
        fast_ids, full_ids, one_ids, PAYLOADS, strict=True
    ):
        assert rows[fast_id] == rows[full_id] == rows[one_id]
        assert rows[fast_id]["payload"] == json.loads(codec.encode(payload))
    future = options.run_at is not None and options.run_at.year > 2050
    due_later = bool(options.delay) or future
    assert {row["state"] for row in rows.values()} == {"scheduled" if due_later else "ready"}


async def test_interleaved_batches_each_get_the_ids_of_their_own_payloads(
    pg_url: str, pg_schema: str
) -> None:
    """The fast path matches ids to payloads by order (ids ascend in insertion order): batches
    inserted at the same time on four connections still each get their own rows back."""
    app = make_app(pg_url, pg_schema, pool_size=4)
    results: dict[int, list[Any]] = {}

    async with app.client(migrate=True) as client:

        async def enqueue(batch: int) -> None:
            payloads = [{"batch": batch, "i": i} for i in range(400)]
            jobs = await client.enqueue_many("noop", payloads, queue=f"q{batch}")
            pairs = zip(jobs, payloads, strict=True)
            results[batch] = [(job.id, job.queue, payload) for job, payload in pairs]

        @app.task("noop")
        async def noop(ctx: Any, payload: Any) -> None:
            return None

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for batch in range(4):
                    nursery.start_soon(enqueue, batch)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        stored = dict(conn.execute(f"SELECT id, payload FROM {pg_schema}.jobs").fetchall())
    assert len(stored) == 1600
    for batch, rows in results.items():
        for job_id, queue, payload in rows:
            assert (queue, stored[job_id]) == (f"q{batch}", payload)


async def test_a_batch_sends_one_ready_notification_and_a_delayed_batch_one_too(
    pg_url: str, pg_schema: str
) -> None:
    """Notifications arrive in commit order: after a 50-job batch, a delayed batch of the same
    queue (it wakes the queue's loop, which sets its timer to the new due time) and a single job
    of another, the listener has seen exactly `bulk`, `bulk`, `end`."""
    app = make_app(pg_url, pg_schema)

    @app.task("noop")
    async def noop(ctx: Any, payload: Any) -> None:
        return None

    async with app.client(migrate=True) as client:
        channels = await client.driver.ready_channels(["bulk", "end"])
        with listening(pg_url, channels) as listener:
            await client.enqueue_many("noop", [{"i": i} for i in range(50)], queue="bulk")
            await client.enqueue_many("noop", [{}, {}], queue="bulk", delay=3600)
            await client.enqueue("noop", {}, queue="end")
            seen = await trio.to_thread.run_sync(notifications_until, listener, "end")
    assert seen == ["bulk", "bulk", "end"]


async def test_the_sql_enqueue_of_a_delayed_job_sends_its_ready_notification_too(
    pg_url: str, pg_schema: str
) -> None:
    """As the Python statements do: a job enqueued from SQL for later wakes its queue's idle
    workers, which set their timers to its due time (without it they learned it at the next
    poll). Notifications arrive in commit order, so `later` before `end` means it was sent."""
    app = make_app(pg_url, pg_schema)
    async with app.client(migrate=True) as client:
        channels = await client.driver.ready_channels(["later", "end"])
    with listening(pg_url, channels) as listener, psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            f"SELECT {pg_schema}.enqueue('noop', queue => 'later',"
            " run_at => now() + interval '1 hour')"
        )
        conn.execute(f"SELECT {pg_schema}.enqueue('noop', queue => 'end')")
        seen = await trio.to_thread.run_sync(notifications_until, listener, "end")
        [[state]] = conn.execute(
            f"SELECT state FROM {pg_schema}.jobs WHERE queue = 'later'"
        ).fetchall()
    assert seen == ["later", "end"]
    assert state == "scheduled"


OLD_NAME_RULE = "^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$"
NAMES = [
    "a",
    "default",
    "A_b.c:d-e",
    "0",
    "_",
    "x" * 128,
    "x" * 129,
    "",
    "-a",
    ".a",
    ":a",
    "a b",
    "a\n",
    "\na",
    "é",
    "aé",
    "a/b",
    "a@1",
    "a*",
]


@pytest.mark.parametrize("column", ["queue", "task"])
async def test_the_name_checks_accept_exactly_what_the_old_regex_accepted(
    pg_url: str, pg_schema: str, column: str
) -> None:
    """Migration 0009 rewrote the jobs table's queue and task CHECKs (same rule, cheaper to
    evaluate): a raw INSERT succeeds exactly for the names the old regex matched."""
    async with make_app(pg_url, pg_schema).client(migrate=True):
        pass
    values = {"queue": "q", "task": "t"}
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for name in NAMES:
            old_accepts = conn.execute("SELECT %s ~ %s", [name, OLD_NAME_RULE]).fetchone()
            row = {**values, column: name}
            try:
                conn.execute(
                    f"INSERT INTO {pg_schema}.job_rows (queue, task, payload, run_at,"
                    " created_at)"
                    " VALUES (%(queue)s, %(task)s, '{}', now(), now())",
                    row,
                )
                accepted = True
            except psycopg.errors.CheckViolation as exc:
                assert exc.diag.constraint_name == f"jobs_{column}_check"
                accepted = False
            assert (name, accepted) == (name, old_accepts is not None and old_accepts[0])


# --- the payload check's inline walk against the walk it replaced ---------------------------


def reference_encode(value: Any, root: str = "$") -> str:
    """codec.encode as it was before its inline walk (copy the JSON, then check every node)."""
    if value is None:
        return "null"
    plain = codec.to_json_value(value)
    reference_check(plain, root, 0)
    text = json.dumps(plain, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    size = len(text.encode("utf-8"))
    if size > codec.MAX_PAYLOAD_BYTES:
        raise PayloadError(root, f"encodes to {size} bytes, more than the limit of 1000000")
    return text


def reference_check(value: Any, path: str, depth: int) -> None:
    if depth > codec.MAX_DEPTH:
        raise PayloadError(path, f"nested deeper than {codec.MAX_DEPTH} levels")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        reference_text(value, path)
    elif isinstance(value, int):
        if value.bit_length() > codec.MAX_INT_BITS:
            raise PayloadError(path, f"integer of {value.bit_length()} bits is too large for JSON")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadError(path, f"{value!r} is not a finite number (JSON has no NaN/inf)")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            reference_check(item, f"{path}[{index}]", depth + 1)
    elif type(value) is dict:
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(path, f"key {key!r} is not a string")
            reference_text(key, f"{path} key {key!r}")
            reference_check(item, f"{path}.{key}", depth + 1)
    else:
        raise PayloadError(
            path,
            f"{type(value).__name__} is not JSON (use dict, list, str, int, float, bool, "
            f"None or an attrs class)",
        )


def reference_text(text: str, path: str) -> None:
    if "\x00" in text:
        raise PayloadError(path, "contains a NUL character, which PostgreSQL cannot store")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PayloadError(path, f"is not valid Unicode ({exc.reason})") from None


def outcome(encode: Any, value: Any) -> tuple[str, str]:
    try:
        return ("ok", encode(value))
    except PayloadError as exc:
        return ("error", str(exc))


LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**10001]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from("\x00\ud800a}"), max_size=8),
)
KEYS = st.one_of(
    st.text(max_size=4), st.sampled_from(["a\x00", "\udfff", "ok"]), st.integers(0, 3), st.none()
)
VALUES = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(KEYS, children, max_size=4),
    ),
    max_leaves=20,
)


def nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


@hypothesis.settings(max_examples=400, deadline=None)
@hypothesis.given(VALUES)
def test_encode_accepts_and_refuses_exactly_what_the_plain_walk_did(value: Any) -> None:
    assert outcome(codec.encode, value) == outcome(reference_encode, value)


@pytest.mark.parametrize("depth", [63, 64, 65, 66])
@pytest.mark.parametrize("leaf", [1, "x", None, [], {}, 2**64])
def test_encode_refuses_nesting_at_the_same_depth_as_before(depth: int, leaf: Any) -> None:
    value = nested(depth, leaf)
    assert outcome(codec.encode, value) == outcome(reference_encode, value)


# --- migration 0012: the state, run_at and unique_states CHECKs against the rules they replaced


# Over `phase` (migration 0047 renamed `state`, and its check, jobs_phase_check, has `claimed`
# where `running` was: a running job is one with a run; since migration 0049 `done` where the
# final states were: a finished job is one with an outcome).
OLD_STATE_RULES = {
    "jobs_phase_check": "phase IN ('scheduled', 'ready', 'claimed', 'sleeping', 'waiting', 'done')",
    "jobs_run_at_check": "run_at IS NOT NULL OR phase IN ('waiting', 'done')",
    "jobs_unique_states_check": "unique_states <@ ARRAY['completed', 'failed', 'cancelled']",
}
CANDIDATE_STATES = [*FINISHED_STATES, *UNFINISHED_STATES, "Ready", "", "ready ", "done", None]
STATE_CASES = [
    *[
        (state, run_at, unique_states)
        for state in CANDIDATE_STATES
        for run_at in ["2030-01-01 00:00+00", None]
        for unique_states in [[], ["completed"]]
    ],
    *[
        ("ready", "2030-01-01 00:00+00", unique_states)
        for unique_states in [
            ["completed", "failed", "cancelled"],
            ["failed", "failed"],
            ["ready"],
            ["completed", "running"],
            ["Completed"],
            [None],
            ["completed", None],
            None,
        ]
    ],
]


async def test_the_state_checks_accept_exactly_what_the_old_rules_accepted(
    pg_url: str, pg_schema: str
) -> None:
    """Migration 0012 rewrote three CHECKs with array constants (same rules, cheaper to
    prepare): on every case, each new CHECK as stored evaluates as the rule it replaced (a
    CHECK fails only on false: NULL passes, so NULL and true are compared as passing).
    Migration 0032 made unique_states's a domain's (VALUE is then its column)."""
    async with make_app(pg_url, pg_schema).client(migrate=True):
        pass
    with psycopg.connect(pg_url, autocommit=True) as conn:
        stored = dict(
            conn.execute(
                "SELECT c.conname,"
                " replace(pg_get_constraintdef(c.oid), 'VALUE', coalesce(a.attname, 'VALUE'))"
                " FROM pg_constraint c"
                " LEFT JOIN pg_attribute a ON a.attrelid = %s::regclass"
                "  AND a.atttypid = c.contypid AND c.contypid <> 0"
                " WHERE (c.conrelid = %s::regclass OR a.attname IS NOT NULL)"
                "  AND c.conname = ANY(%s)",
                [
                    f"{pg_schema}.job_rows",
                    f"{pg_schema}.job_rows",
                    list(OLD_STATE_RULES),
                ],
            ).fetchall()
        )
        assert set(stored) == set(OLD_STATE_RULES)
        for name, old_rule in OLD_STATE_RULES.items():
            new_rule = stored[name].removeprefix("CHECK ").removesuffix(" NOT VALID")
            assert "ARRAY[" not in new_rule and " IN (" not in new_rule
            for case in STATE_CASES:
                old, new = conn.execute(
                    f"SELECT coalesce({old_rule}, true), coalesce({new_rule}, true)"
                    " FROM (VALUES (%s::text, %s::timestamptz, %s::text[]))"
                    " AS row(phase, run_at, unique_states)",
                    list(case),
                ).fetchone() or (None, None)
                assert (name, case, new) == (name, case, old)


async def test_the_prepared_single_enqueue_survives_schema_changes_on_its_session(
    pg_url: str, pg_schema: str
) -> None:
    """`job_insert_one` is prepared once per session: after a later migration alters the jobs
    table, and after the schema is dropped (the enqueue says to migrate) and migrated again,
    the same pooled session enqueues again (PostgreSQL re-plans a prepared statement whose
    tables changed; its result columns are named, so a new column does not change them)."""
    app = make_app(pg_url, pg_schema, pool_size=1)
    async with app.client(migrate=True) as client:
        first = await client.enqueue(TASK, {"n": 1})
        async with client.driver._pool.connection() as conn:  # type: ignore[attr-defined]
            prepared = await conn.fetch("SELECT statement FROM pg_prepared_statements")
        assert any(f'INSERT INTO "{pg_schema}".job_rows' in row[0] for row in prepared)
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"ALTER TABLE {pg_schema}.job_rows ADD COLUMN extra integer DEFAULT 7")
            second = await client.enqueue(TASK, {"n": 2})
            admin.execute(f"DROP SCHEMA {pg_schema} CASCADE")
            with pytest.raises(SchemaNotMigrated, match="trioq migrate"):
                await client.enqueue(TASK, {"n": 3})
        await client.driver.migrate()
        third = await client.enqueue(TASK, {"n": 4})
        pool = client.driver._pool  # type: ignore[attr-defined]
        assert pool.statistics().opened_total == 1  # one session throughout
    assert second.id > first.id and third.created
    with psycopg.connect(pg_url, autocommit=True) as conn:
        stored = conn.execute(f"SELECT id, payload FROM {pg_schema}.jobs").fetchall()
    assert stored == [(third.id, {"n": 4})]

"""Fault test 8: hostile input through every public entry point of the producer, inside the
caller's own transaction. Each value is either stored exactly or refused with a clear trioq
error before any SQL; nothing is written by a refused call, the caller's transaction stays
usable, and PostgreSQL never sees a syntax error (SQLSTATE class 42)."""

from __future__ import annotations

import decimal
import math
from typing import Any

import pytest
from hypothesis import strategies as st

import trioq
from tests.support import make_app, scalar
from tests.test_enqueue import Pickled, deeply_nested
from tests.test_identifiers import HOSTILE, names, run_property
from trioq._core import codec

REFUSALS = (ValueError, trioq.PayloadError, trioq.UnknownTask, trioq.TrioqError)

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),  # NaN and infinities included
    st.text(),  # lone surrogates and NUL included
    st.binary(max_size=8),
    st.sampled_from([set(), frozenset({1}), object(), Pickled(), b"\x00", math.nan]),
    st.builds(lambda: 2**20000),  # built lazily: hypothesis cannot even print it
)
payloads = st.one_of(
    st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(st.one_of(st.text(), st.integers()), inner, max_size=4)
        ),
        max_leaves=12,
    ),
    st.sampled_from(
        [deeply_nested(codec.MAX_DEPTH + 1), "x" * codec.MAX_PAYLOAD_BYTES, {"k": "\ud800"}]
    ),
)
FIELDS = ("queue", "task", "partition_key", "dedup_key", "payload")
inputs = st.tuples(st.sampled_from(FIELDS), st.one_of(names, payloads))


def as_json_numbers(value: Any) -> Any:
    """Numbers as the decimal values JSON means. jsonb keeps a number's decimal value, not
    Python's int/float split: 3.246038018056351e+16 comes back as the integer
    32460380180563510, the same JSON number."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return decimal.Decimal(repr(value))
    if isinstance(value, list):
        return [as_json_numbers(item) for item in value]
    return {key: as_json_numbers(item) for key, item in value.items()}


async def test_hostile_input_at_every_entry_point_is_stored_exactly_or_refused_before_sql(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema, pool_size=2)

    @app.task("t")
    async def t(ctx: trioq.Context, payload: Any) -> None:
        return None

    outcomes = {"stored": 0, "refused": 0}
    async with app.client(migrate=True) as client:

        def inserts() -> int:
            return client.driver.statistics().calls.get("job_insert_many", 0)

        async def example(case: tuple[str, Any]) -> None:
            field, value = case
            task, payload, options = "t", {"v": 1}, {}
            if field == "task":
                task = value
            elif field == "payload":
                payload = value
            else:
                options[field] = value
            async with client.transaction() as tx:
                await tx.execute(f"INSERT INTO {pg_schema}.notes VALUES ('before')")
                before = inserts()
                try:
                    job = await tx.enqueue(task, payload, **options)
                except REFUSALS as exc:
                    assert inserts() == before, f"{field}={value!r}: SQL ran before {exc!r}"
                    assert "\n" not in str(exc).strip(), str(exc)
                    outcomes["refused"] += 1
                else:
                    stored = await tx.fetch(
                        f"SELECT payload, queue, partition_key, dedup_key FROM {pg_schema}.jobs "
                        "WHERE id = %s",
                        (job.id,),
                    )
                    expected_payload = codec.decode(codec.encode(payload))
                    stored = [(as_json_numbers(row[0]), *row[1:]) for row in stored]
                    assert stored == [
                        (
                            as_json_numbers(expected_payload),
                            options.get("queue") or "default",
                            options.get("partition_key"),
                            options.get("dedup_key"),
                        )
                    ]
                    outcomes["stored"] += 1
                    await tx.execute(
                        f"DELETE FROM {pg_schema}.job_rows_legacy WHERE id = %s", (job.id,)
                    )
                # the caller's transaction is still usable either way
                assert await tx.fetch("SELECT 1") == [(1,)]
            for bad_id in ("1; DROP TABLE jobs", None, -1):
                with pytest.raises(ValueError, match=r"^job_id: "):
                    await client.cancel(bad_id)  # type: ignore[arg-type]

        async with client.transaction() as tx:
            await tx.execute(f"CREATE TABLE {pg_schema}.notes (body text)")
        explicit = [(field, value) for field in FIELDS for value in HOSTILE[:6]]
        # wrong types: a dict or list as the task name used to escape as a TypeError
        explicit += [("task", {"x": 1}), ("task", ["x"]), ("queue", ["x"]), ("dedup_key", 5)]
        # jsonb returns an integral float in exponent form as an integer (the same JSON number)
        explicit += [("payload", 3.246038018056351e16), ("payload", [1e300, -0.0, 2.5e-300])]
        await run_property(example, inputs, explicit)
    assert outcomes["stored"] >= 5 and outcomes["refused"] >= 5, outcomes
    assert await scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.jobs") == 0
    # every example's own row committed with its transaction, refused enqueue or not
    assert await scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.notes") == sum(outcomes.values())

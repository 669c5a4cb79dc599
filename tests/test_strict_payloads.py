"""Strict payloads: an attrs payload class refuses unknown keys and wrong JSON types at enqueue
(no coercion), naming every offending path; a missing payload is said in words."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

import trioq
from trioq._core import codec
from trioq._enqueue.rows import EnqueueOptions, build_jobs


@attrs.frozen
class Line:
    sku: str
    quantity: int


@attrs.frozen
class Order:
    order_id: str
    total: float
    paid: bool
    lines: list[Line] = attrs.field(factory=list)


@attrs.frozen
class Defaults:
    limit: int = 10


ORDER = trioq.declare_task("place_order", payload_type=Order)
GOOD = {"order_id": "o1", "total": 2.5, "paid": True, "lines": [{"sku": "a", "quantity": 2}]}


def refusal(payload: Any, task: trioq.TaskDeclaration = ORDER) -> str:
    with pytest.raises(trioq.PayloadError) as caught:
        build_jobs(task, [payload], EnqueueOptions(), single=True)
    return str(caught.value)


@pytest.mark.parametrize(
    ("change", "path", "expected"),
    [
        ({"lines": [{"sku": "a", "quantity": 2.7}]}, "$.lines[0].quantity", "expected int"),
        ({"lines": [{"sku": "a", "quantity": True}]}, "$.lines[0].quantity", "expected int"),
        ({"lines": [{"sku": 5, "quantity": 1}]}, "$.lines[0].sku", "expected str"),
        ({"order_id": 5}, "$.order_id", "expected str"),
        ({"paid": 1}, "$.paid", "expected bool"),
        ({"paid": "yes"}, "$.paid", "expected bool"),
        ({"total": "2.5"}, "$.total", "expected float"),
        ({"total": True}, "$.total", "expected float"),
    ],
)
def test_wrong_json_type_is_refused_not_coerced_naming_the_path(
    change: dict[str, Any], path: str, expected: str
) -> None:
    message = refusal({**GOOD, **change})
    assert f"{expected}" in message and f"@ {path}" in message, message


def test_unknown_and_misspelt_keys_are_refused_at_every_level() -> None:
    message = refusal({**GOOD, "totl": 3, "lines": [{"sku": "a", "quantity": 1, "qty": 1}]})
    assert "extra fields found (totl) @ $" in message
    assert "extra fields found (qty) @ $.lines[0]" in message


def test_every_offending_path_is_named_in_one_error() -> None:
    message = refusal({"order_id": 1, "total": "x", "paid": True, "extra": 0})
    for part in ("@ $.order_id", "@ $.total", "extra fields found (extra) @ $"):
        assert part in message, message


def test_missing_payload_for_a_class_that_needs_one_is_said_in_words() -> None:
    assert refusal(None) == (
        "payload $: task 'place_order' needs a Order payload "
        "(required: order_id, total, paid); none was given"
    )


def test_missing_required_field_is_named() -> None:
    assert "required field missing @ $.paid" in refusal({"order_id": "o", "total": 1.0})


def test_int_is_a_valid_float_and_a_valid_payload_passes_unchanged() -> None:
    [job] = build_jobs(ORDER, [{**GOOD, "total": 3}], EnqueueOptions(), single=True)
    assert codec.decode(job.payload_json)["total"] == 3
    assert codec.structure(codec.decode(job.payload_json), Order).total == 3.0


def test_batch_errors_name_the_index_of_the_offending_payload() -> None:
    with pytest.raises(trioq.PayloadError, match=r"@ \[1\]\.paid"):
        build_jobs(ORDER, [GOOD, {**GOOD, "paid": 0}], EnqueueOptions())


def test_no_payload_for_a_class_with_only_defaults_builds_the_defaults() -> None:
    defaults = trioq.declare_task("defaults", payload_type=Defaults)
    [job] = build_jobs(defaults, [None], EnqueueOptions(), single=True)
    assert job.payload_json == "null"


async def test_handler_gets_the_defaults_class_when_no_payload_was_given() -> None:
    app = trioq.App(schema="strict_defaults")
    seen: list[Any] = []

    @app.task("defaults")
    async def handler(ctx: trioq.Context, payload: Defaults) -> None:
        seen.append(payload)

    assert app.tasks["defaults"].load_payload(None) == Defaults()
    with pytest.raises(trioq.PayloadError, match=r"expected int, got str '10' @ \$\.limit"):
        app.tasks["defaults"].load_payload({"limit": "10"})

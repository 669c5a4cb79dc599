"""The payload codec (pure): JSON-only validation with field paths, and attrs round trips."""

from __future__ import annotations

import datetime
import enum
import json
import math
import pathlib
import uuid
from collections import OrderedDict
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import trioq
from trioq._core import codec


@attrs.frozen
class Author:
    id: uuid.UUID
    name: str


@attrs.frozen
class Message:
    author: Author
    sent_at: datetime.datetime
    day: datetime.date
    tags: list[str]
    replies: list[Author] = attrs.field(factory=list)
    note: str | None = None


def roundtrip(value: Any, cls: Any) -> Any:
    return codec.structure(codec.decode(codec.encode(value)), cls)


def test_attrs_class_with_datetime_date_and_uuid_round_trips() -> None:
    message = Message(
        author=Author(uuid.uuid4(), "Ada"),
        sent_at=datetime.datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.UTC),
        day=datetime.date(2030, 1, 2),
        tags=["a", "ünïcode", ""],
        replies=[Author(uuid.uuid4(), "Bob")],
    )
    assert roundtrip(message, Message) == message


def test_datetime_keeps_its_utc_offset_and_microseconds() -> None:
    tz = datetime.timezone(datetime.timedelta(hours=5, minutes=30))
    sent_at = datetime.datetime(1999, 12, 31, 23, 59, 59, 1, tzinfo=tz)
    message = Message(Author(uuid.UUID(int=1), "x"), sent_at, datetime.date(1, 1, 1), [])
    back = roundtrip(message, Message)
    assert back.sent_at == sent_at
    assert back.sent_at.utcoffset() == datetime.timedelta(hours=5, minutes=30)


def test_uuid_is_stored_as_its_canonical_text() -> None:
    value = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert json.loads(codec.encode(Author(value, "a")))["id"] == str(value)
    assert codec.structure(str(value), uuid.UUID) == value


def test_attrs_instances_inside_plain_containers_are_unstructured() -> None:
    author = Author(uuid.UUID(int=7), "Ada")
    assert json.loads(codec.encode({"who": [author, (author,)]})) == {
        "who": [{"id": str(author.id), "name": "Ada"}, [{"id": str(author.id), "name": "Ada"}]]
    }


def test_tuples_become_lists_and_dict_subclasses_plain_objects() -> None:
    assert codec.encode((1, (2, 3))) == "[1,[2,3]]"
    assert codec.encode(OrderedDict([("b", 1), ("a", 2)])) == '{"b":1,"a":2}'


def test_text_is_stored_as_utf8_not_ascii_escapes() -> None:
    assert codec.encode({"text": "héllo 🌍"}) == '{"text":"héllo 🌍"}'


def test_decode_of_null_column_is_none() -> None:
    assert codec.decode(None) is None


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**200), max_value=2**200)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(
            st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8),
            children,
            max_size=5,
        )
    ),
    max_leaves=30,
)


@given(json_values)
def test_any_json_value_round_trips_exactly(value: Any) -> None:
    assert codec.decode(codec.encode(value)) == value


# --- rejection -------------------------------------------------------------------------------


class Pickled:
    """Something pickle could rebuild; the codec must refuse it, not serialise it."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (print, ("never called",))


class Colour(enum.Enum):
    RED = "red"


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("payload", "path", "reason"),
    [
        ({"a": {"b": [0, 1, 2, {1, 2}]}}, "$.a.b[3]", "set is not JSON"),
        ({"x": object()}, "$.x", "object is not JSON"),
        ({"x": [float("nan")]}, "$.x[0]", "not a finite number"),
        ({"x": float("inf")}, "$.x", "not a finite number"),
        ({"x": -float("inf")}, "$.x", "not a finite number"),
        ({"x": "\ud800"}, "$.x", "not valid Unicode"),
        ({"x": "a\x00b"}, "$.x", "NUL"),
        ({"a": {1: "one"}}, "$.a", "key 1 is not a string"),
        ({"a": {("t",): 1}}, "$.a", "is not a string"),
        ({"a\x00": 1}, "$ key 'a\\x00'", "NUL"),
        ({"a": b"bytes"}, "$.a", "bytes is not JSON"),
        ({"a": bytearray(b"x")}, "$.a", "bytearray is not JSON"),
        ({"p": Pickled()}, "$.p", "Pickled is not JSON"),
        ({"c": Colour.RED}, "$.c", "Colour is not JSON"),
        ({"when": datetime.datetime(2030, 1, 1)}, "$.when", "datetime is not JSON"),
        ({"n": 10**5000}, "$.n", "too large"),
        (nested(codec.MAX_DEPTH + 1), "$" + "[0]" * (codec.MAX_DEPTH + 1), "nested deeper"),
        (Pickled(), "$", "Pickled is not JSON"),
        (frozenset(), "$", "frozenset is not JSON"),
    ],
)
def test_non_json_payload_raises_payload_error_naming_the_path(
    payload: Any, path: str, reason: str
) -> None:
    with pytest.raises(trioq.PayloadError) as caught:
        codec.encode(payload)
    assert caught.value.path == path
    assert reason in caught.value.reason
    assert str(caught.value).startswith(f"payload {path}: ")


def test_payload_error_is_a_value_error() -> None:
    assert issubclass(trioq.PayloadError, ValueError)


def test_nesting_up_to_the_limit_is_accepted() -> None:
    assert codec.decode(codec.encode(nested(codec.MAX_DEPTH))) == nested(codec.MAX_DEPTH)


def test_pathologically_deep_nesting_is_a_payload_error_not_a_recursion_error() -> None:
    with pytest.raises(trioq.PayloadError, match="nested deeper"):
        codec.encode(nested(100_000))
    deep_dict: Any = {}
    for _ in range(100_000):
        deep_dict = {"k": deep_dict}
    with pytest.raises(trioq.PayloadError, match="nested deeper"):
        codec.encode(deep_dict)


def test_self_referential_payload_is_rejected() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(trioq.PayloadError, match="nested deeper"):
        codec.encode({"loop": loop})


@attrs.frozen
class Box:
    content: Any


def test_attrs_value_nested_far_too_deep_is_rejected() -> None:
    box: Any = None
    for _ in range(50_000):
        box = Box(box)
    with pytest.raises(trioq.PayloadError, match="nested deeper"):
        codec.encode(box)


def test_attrs_field_holding_a_set_names_the_field() -> None:
    with pytest.raises(trioq.PayloadError) as caught:
        codec.encode({"box": Box({1, 2})})
    assert caught.value.path == "$.box.content"


def test_size_limit_counts_utf8_bytes_of_the_encoded_text() -> None:
    assert codec.encode("x" * 98, max_bytes=100) == '"' + "x" * 98 + '"'  # 100 bytes: fits
    with pytest.raises(trioq.PayloadError, match="101 bytes, more than the limit of 100"):
        codec.encode("x" * 99, max_bytes=100)
    with pytest.raises(trioq.PayloadError, match="more than the limit"):
        codec.encode("é" * 50, max_bytes=100)  # 50 characters, 102 bytes


def test_default_size_limit_rejects_one_byte_over() -> None:
    limit = codec.MAX_PAYLOAD_BYTES
    codec.encode("x" * (limit - 2))
    with pytest.raises(trioq.PayloadError, match="more than the limit"):
        codec.encode("x" * (limit - 1))


def test_custom_root_prefixes_the_path() -> None:
    with pytest.raises(trioq.PayloadError) as caught:
        codec.encode({"ids": {1}}, root="result")
    assert caught.value.path == "result.ids"


def test_floats_that_are_finite_survive_including_negative_zero() -> None:
    text = codec.encode([-0.0, 1e308, 5e-324])
    back = codec.decode(text)
    assert back == [0.0, 1e308, 5e-324]
    assert math.copysign(1, back[0]) == -1


def test_nothing_in_trioq_imports_pickle() -> None:
    package = pathlib.Path(trioq.__file__).parent
    offenders = [
        str(path)
        for path in package.rglob("*.py")
        if "import pickle" in path.read_text() or "pickle." in path.read_text()
    ]
    assert offenders == []

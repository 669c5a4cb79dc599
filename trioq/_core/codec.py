"""The payload codec: the one cattrs converter, JSON-only validation and encoding.

Everything a job stores (payloads, results, step outputs) goes through `encode`, which raises
`PayloadError` naming the offending field *before* any SQL runs. Nothing is ever pickled.
"""

from __future__ import annotations

import datetime
import json
import math
import uuid
from collections.abc import Mapping
from typing import Any

import attrs
import cattrs

from .errors import PayloadError

MAX_PAYLOAD_BYTES = 1_000_000  # of JSON text; the table's CHECK is a looser backstop (4 MB)
MAX_DEPTH = 64
# Python refuses to print an int of more than 4300 digits (sys.int_info); stay well below that.
MAX_INT_BITS = 10_000

converter = cattrs.Converter()
converter.register_unstructure_hook(datetime.datetime, lambda value: value.isoformat())
converter.register_structure_hook(
    datetime.datetime, lambda value, _: datetime.datetime.fromisoformat(value)
)
converter.register_unstructure_hook(datetime.date, lambda value: value.isoformat())
converter.register_structure_hook(
    datetime.date, lambda value, _: datetime.date.fromisoformat(value)
)
converter.register_unstructure_hook(uuid.UUID, str)
converter.register_structure_hook(uuid.UUID, lambda value, _: uuid.UUID(value))

_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def to_json_value(value: Any, depth: int = 0) -> Any:
    """Unstructure attrs instances (anywhere in the value) into plain JSON values.

    Stops below MAX_DEPTH (the rest is left as is for `_check` to reject), so a deeply nested or
    self-referential value cannot exhaust the stack.
    """
    if depth > MAX_DEPTH:
        return value
    if attrs.has(type(value)):
        return converter.unstructure(value)
    if isinstance(value, list | tuple):
        return [to_json_value(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {key: to_json_value(item, depth + 1) for key, item in value.items()}
    return value


def encode(value: Any, *, root: str = "$", max_bytes: int = MAX_PAYLOAD_BYTES) -> str:
    """Validate `value` as storable JSON and return its text; PayloadError names the field."""
    if value is None:  # the common result of a handler: skip the walk
        return "null"
    try:
        plain = to_json_value(value)
    except RecursionError:  # inside cattrs: an attrs value nested far too deep, or a cycle
        raise PayloadError(root, f"nested deeper than {MAX_DEPTH} levels") from None
    _check(plain, root, 0)
    text = _ENCODER.encode(plain)
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise PayloadError(root, f"encodes to {size} bytes, more than the limit of {max_bytes}")
    return text


def decode(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def structure(value: Any, cls: Any) -> Any:
    """Turn a stored JSON value into `cls` (an attrs class or any type cattrs knows)."""
    return converter.structure(value, cls)


def _check(value: Any, path: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise PayloadError(path, f"nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        _check_text(value, path)
    elif isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise PayloadError(path, f"integer of {value.bit_length()} bits is too large for JSON")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadError(path, f"{value!r} is not a finite number (JSON has no NaN/inf)")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check(item, f"{path}[{index}]", depth + 1)
    elif isinstance(value, Mapping) and type(value) is dict:
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(path, f"key {key!r} is not a string")
            _check_text(key, f"{path} key {key!r}")
            _check(item, f"{path}.{key}", depth + 1)
    else:
        raise PayloadError(
            path,
            f"{type(value).__name__} is not JSON (use dict, list, str, int, float, bool, "
            f"None or an attrs class)",
        )


def _check_text(text: str, path: str) -> None:
    if "\x00" in text:
        raise PayloadError(path, "contains a NUL character, which PostgreSQL cannot store")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PayloadError(path, f"is not valid Unicode ({exc.reason})") from None

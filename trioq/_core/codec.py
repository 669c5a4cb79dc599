"""The payload codec: the one cattrs converter, JSON-only validation and encoding.

Everything a job stores (payloads, results, step outputs) goes through `encode`, which raises
`PayloadError` naming the offending field *before* any SQL runs. Nothing is ever pickled.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import cattrs

import attrs

from .errors import PayloadError

# The one payload limit, in bytes of the compact JSON text. The table's CHECK measures the stored
# jsonb instead, which is up to 6x the text; it is set to exactly that worst case at this limit
# (migration 0006), so the database accepts every payload this limit accepts.
MAX_PAYLOAD_BYTES = 1_000_000
JSONB_BYTES_PER_TEXT_BYTE = 6
JSONB_OVERHEAD_BYTES = 64
MAX_DEPTH = 64
# Python refuses to print an int of more than 4300 digits (sys.int_info); stay well below that.
MAX_INT_BITS = 10_000


class StrictTypeError(TypeError):
    """A JSON value of the wrong type for a payload field (never coerced)."""


def _strict(kind: type) -> Any:
    def structure_exactly(value: Any, _: Any) -> Any:
        if type(value) is kind:
            return value
        if kind is float and type(value) is int:
            return float(value)
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise StrictTypeError(f"expected {kind.__name__}, got {type(value).__name__} {shown}")

    return structure_exactly


@functools.cache
def converter() -> cattrs.Converter:
    """The one converter, built at first use: a producer that enqueues plain JSON never
    imports cattrs (a fifth of `import trioq.producer`, bench/RESULTS.md "Import costs").

    Strict structuring: unknown (misspelt) keys are refused, and a JSON value of the wrong type
    is never coerced (cattrs' default would turn 2.7 into 2, true into 1 and 5 into "5"). An int
    is accepted where a float is declared: JSON has one number type, and 5 is a valid float."""
    import cattrs

    made = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    for kind in (int, float, str, bool):
        made.register_structure_hook(kind, _strict(kind))
    made.register_unstructure_hook(datetime.datetime, lambda value: value.isoformat())
    made.register_structure_hook(
        datetime.datetime, lambda value, _: datetime.datetime.fromisoformat(value)
    )
    made.register_unstructure_hook(datetime.date, lambda value: value.isoformat())
    made.register_structure_hook(datetime.date, lambda value, _: datetime.date.fromisoformat(value))
    made.register_unstructure_hook(uuid.UUID, str)
    made.register_structure_hook(uuid.UUID, lambda value, _: uuid.UUID(value))
    return made


_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _one_encoder() -> Any:
    """`_ENCODER.encode` builds a C encoder on every call (1.3 of its 1.5 us for `{}`); build
    it once, exactly as JSONEncoder.iterencode does, without its cycle markers (`_check` has
    already refused anything nested deeper than MAX_DEPTH, so a cycle never gets here). Falls
    back to `_ENCODER.encode` where the C accelerator is missing or takes other arguments."""
    make: Any = getattr(json.encoder, "c_make_encoder", None)
    try:
        encoder = make(
            None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",",
            False, False, False,
        )  # fmt: skip
        sample = {"a": [1, 2.5, "é\n", None, True], "": {}}
        if "".join(encoder(sample, 0)) != _ENCODER.encode(sample):
            return _ENCODER.encode
    except Exception:  # not CPython's _json, or another signature
        return _ENCODER.encode

    def encode(value: Any) -> str:
        return "".join(encoder(value, 0))

    return encode


_encode_json: Callable[[Any], str] = _one_encoder()


_SCALARS = frozenset({str, int, float, bool, type(None)})


def to_json_value(value: Any, depth: int = 0) -> Any:
    """Unstructure attrs instances (anywhere in the value) into plain JSON values.

    Stops below MAX_DEPTH (the rest is left as is for `_check` to reject), so a deeply nested or
    self-referential value cannot exhaust the stack.
    """
    if type(value) in _SCALARS or depth > MAX_DEPTH:
        return value
    if attrs.has(type(value)):
        return converter().unstructure(value)
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
        _check(value, root, 0)
        plain = value  # plain JSON already: no copy to make (the common case)
    except PayloadError:
        # attrs instances or tuples inside, or not JSON at all: unstructure, then check again
        # (this check raises the error if the value is not storable).
        try:
            plain = to_json_value(value)
        except RecursionError:  # inside cattrs: an attrs value nested far too deep, or a cycle
            raise PayloadError(root, f"nested deeper than {MAX_DEPTH} levels") from None
        _check(plain, root, 0)
    text = _encode_json(plain)
    # UTF-8 takes at most 4 bytes per character: a short text needs no measuring.
    if len(text) * 4 > max_bytes and (size := len(text.encode("utf-8"))) > max_bytes:
        raise PayloadError(root, f"encodes to {size} bytes, more than the limit of {max_bytes}")
    return text


@attrs.frozen
class Undecodable:
    """What the database loader returns for stored JSON Python cannot decode (a 3,000-deep
    array written by SQL: RecursionError in the decoder). Raising there would take down the
    whole statement's results, and with them the worker; this value fails only the job that
    carries it, when the runtime loads its payload."""

    reason: str
    path: str | None = None  # what holds it, when not what the caller names

    def error(self, path: str) -> PayloadError:
        return PayloadError(self.path or path, f"the stored JSON cannot be decoded ({self.reason})")


def loads_or_undecodable(text: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        return Undecodable(f"nested deeper than Python's recursion limit; the limit is {MAX_DEPTH}")


def decode(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def structure(value: Any, cls: Any) -> Any:
    """Turn a stored JSON value into `cls` (an attrs class or any type cattrs knows)."""
    return converter().structure(value, cls)


def structure_payload(value: Any, cls: Any, *, root: str = "$") -> Any:
    """`structure`, but a misfit raises PayloadError naming every offending path."""
    try:
        return converter().structure(value, cls)
    except Exception:
        problems = structure_problems(value, cls, root=root)
        raise PayloadError(root, f"does not fit {cls.__name__}: {'; '.join(problems)}") from None


def structure_problems(value: Any, cls: Any, *, root: str = "$") -> list[str]:
    """Every reason `value` does not structure into `cls`, each naming its path (empty: fits)."""
    import cattrs

    try:
        converter().structure(value, cls)
    except cattrs.BaseValidationError as exc:
        return cattrs.transform_error(exc, path=root, format_exception=_describe)
    except Exception as exc:  # a hook that raised outside a validation group
        return [f"{exc} @ {root}"]
    return []


def _describe(exc: BaseException, kind: Any) -> str:
    if isinstance(exc, StrictTypeError | ValueError):
        return str(exc)
    from cattrs.v import format_exception

    return format_exception(exc, kind)


def _check(value: Any, path: str, depth: int) -> None:
    """Raise PayloadError naming the first part of `value` that is not storable JSON.

    Plain containers of ASCII strings, small ints and bools are checked inline, without a call
    or a path string per item (a payload's usual shape); anything else takes `_check_other`.
    """
    if depth > MAX_DEPTH:
        raise PayloadError(path, f"nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if kind is dict and depth < MAX_DEPTH:
        for key, item in value.items():
            if type(key) is not str or not (key.isascii() and "\x00" not in key):
                _check_key(key, path)
            if not _plain_leaf(item):
                _check(item, f"{path}.{key}", depth + 1)
    elif kind is list and depth < MAX_DEPTH:
        for index, item in enumerate(value):
            if not _plain_leaf(item):
                _check(item, f"{path}[{index}]", depth + 1)
    elif not _plain_leaf(value):
        _check_other(value, path, depth)


def _plain_leaf(value: Any) -> bool:
    """True for a value nothing can be wrong with: None, a bool, an ASCII str without NUL, an
    int of at most 63 bits (False only means "look closer")."""
    kind = type(value)
    if kind is str:
        return value.isascii() and "\x00" not in value
    if kind is int:
        return bool(-(2**63) <= value < 2**63)
    return value is None or kind is bool


def _check_key(key: Any, path: str) -> None:
    if not isinstance(key, str):
        raise PayloadError(path, f"key {key!r} is not a string")
    _check_text(key, f"{path} key {key!r}")


def _check_other(value: Any, path: str, depth: int) -> None:
    if isinstance(value, bool):
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
            _check_key(key, path)
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

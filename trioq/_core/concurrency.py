"""Concurrency keys (docs/flow-control.md): at most N running jobs per key, cluster-wide,
and at most N starts per period per key.

Pure: validation of keys, limits and patterns, a task's key template applied to a payload, and
which limit or rate applies to a key (`claim_limit`: one rule for the claim and for `explain`).
The PostgreSQL claim and `job_explain` apply it as the SQL function `concurrency_limit_of`
(migration 0027) over the key's head (queries.sql: `concurrency_room`, `job_explain`), and
`rate_for` as `concurrency_rate_of` (migration 0028); the memory driver calls them directly.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import attrs

from .identifiers import validate_key
from .limits import Rate

_Value = TypeVar("_Value")

MAX_LIMIT = 10_000
DEFAULT_LIMIT = 1  # a key nobody gave a limit runs one job at a time
LIMIT_FORM = "a whole number from 1 to 10000"
PATTERN_FORM = "a key (tenant:42) or a prefix ending in * (tenant:*), at most 512 characters"

# A task's key: a template over the payload's fields ("tenant:{tenant_id}") or a callable of
# the payload returning the key (None: that job has no key).
KeyTemplate = str | Callable[[Any], str | None]


def validate_limit(field: str, value: object) -> int:
    """A concurrency limit, or one ValueError line naming the field and the accepted form."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        raise ValueError(f"{field}: {value!r} must be {LIMIT_FORM}")
    return value


def validate_pattern(pattern: object) -> str:
    """A limit's pattern: a whole key, or a prefix followed by one trailing `*`."""
    if not isinstance(pattern, str) or "*" in pattern[:-1]:
        raise ValueError(f"pattern: {pattern!r} must be {PATTERN_FORM}")
    try:
        validate_key("pattern", pattern)
    except ValueError:
        raise ValueError(f"pattern: {pattern!r} must be {PATTERN_FORM}") from None
    return pattern


def validate_template(template: object) -> KeyTemplate | None:
    """A task's `concurrency_key`: None, a callable, or a template naming payload fields."""
    if template is None or callable(template):
        return template
    if not isinstance(template, str) or not template:
        raise ValueError(
            f"concurrency_key: {template!r} must be a key template such as "
            "'tenant:{tenant_id}' or a callable of the payload"
        )
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(template) if name]
    except ValueError as exc:
        raise ValueError(f"concurrency_key: {template!r} is not a valid template ({exc})") from None
    if not fields:
        validate_key("concurrency_key", template)  # a constant key: every job shares it
    return template


def key_of(template: KeyTemplate | None, payload: Any, where: str = "$") -> str | None:
    """The concurrency key a task's template gives `payload`; ValueError naming the field."""
    if template is None:
        return None
    if callable(template):
        key = template(payload)
    else:
        if attrs.has(type(payload)):
            payload = attrs.asdict(payload)
        if not isinstance(payload, Mapping):
            raise ValueError(
                f"concurrency_key: the template {template!r} needs an object payload, "
                f"got {type(payload).__name__} at {where}"
            )
        try:
            key = template.format_map(payload)
        except KeyError as exc:
            raise ValueError(
                f"concurrency_key: the template {template!r} names {exc}, which {where} lacks"
            ) from None
    return validate_key("concurrency_key", key)


def matches(pattern: str, key: str) -> bool:
    if pattern.endswith("*"):
        return key.startswith(pattern[:-1])
    return pattern == key


def longest_match(key: str, patterns: Iterable[tuple[str, _Value]]) -> _Value | None:
    """The value of the longest pattern matching `key` (the whole key before a prefix of the
    same length); None: no pattern matches."""
    best: tuple[int, bool] | None = None
    value: _Value | None = None
    for pattern, candidate in patterns:
        rank = (len(pattern), not pattern.endswith("*"))
        if matches(pattern, key) and (best is None or rank > best):
            best, value = rank, candidate
    return value


def limit_for(key: str, patterns: Iterable[tuple[str, int]], job_limit: int | None) -> int:
    """The limit of `key`: the longest matching pattern's, else the job's own, else 1."""
    limit = longest_match(key, patterns)
    if limit is not None:
        return limit
    return DEFAULT_LIMIT if job_limit is None else job_limit


def rate_for(key: str, patterns: Iterable[tuple[str, Rate]]) -> Rate | None:
    """The rate of `key`: the longest matching pattern's; None: the key has no rate."""
    return longest_match(key, patterns)


# One ready job of a key, as `claim_limit` reads it: (its claim order, e.g. (priority, run_at,
# id), its id, its own concurrency_limit).
ReadyJob = tuple[Any, int, int | None]


@attrs.frozen
class KeyLimit:
    limit: int
    head_id: int | None  # the key's next job, whose own limit applies unless a pattern's does


def claim_limit(
    key: str,
    patterns: Iterable[tuple[str, int]],
    ready: Iterable[ReadyJob],
    own_limit: int | None = None,
) -> KeyLimit:
    """The limit a claim applies to `key` in a queue, and `explain` reports for any job of it:
    the longest matching pattern's, else the `concurrency_limit` of the key's head (its first
    ready job of the queue in claim order), else 1. The claim decides a key's room once per
    visit, from its head, before it picks jobs, so every job of the key starts under that one
    limit, whatever its own; with no ready job of the key (nothing for a claim to decide),
    `own_limit` (the explained job's) stands in for the head's."""
    head = min(ready, default=None, key=lambda job: job[0])
    if head is None:
        return KeyLimit(limit_for(key, patterns, own_limit), None)
    return KeyLimit(limit_for(key, patterns, head[2]), head[1])

"""All of trioq's SQL: named statements (`queries.sql`), SQL functions (`functions/`) and
numbered migrations (`migrations/`).

Each SQL function lives in one file of `functions/` holding only its current body
(`CREATE OR REPLACE FUNCTION`), applied by `migrate` before the pending migrations (so a
migration's trigger or data move finds the functions it names) whenever they differ from what it
applied last (their digest is kept in the schema); migrations hold only what must
happen in order: tables, indexes, triggers, data moves, and the DROP of a function signature
that is gone. The rule for a function's change (docs/operations.md, "Upgrading"): its body
changes in place at the next migrate, and old workers call the new body from then on; a change
CREATE OR REPLACE cannot make (another return type, a parameter renamed or its default removed)
or that old callers cannot live with gets a new function name, and a later release drops the
old one.

Every function either pins `SET search_path = pg_catalog, pg_temp` or, when the hot statements
call it per row or PostgreSQL inlines it (a SET clause stops the inlining and costs ~2.5 us a
call), names every function, operator and type it uses by schema (`pg_catalog.now()`,
`OPERATOR(pg_catalog.=)`); either way trioq's own objects are always `{schema}.name`, and a
caller's search_path cannot swap anything in (tests/test_search_path.py).

Statements are loaded once per schema: `{schema}` becomes the quoted, validated schema name
and `{schema_name}` the bare one (it matches `[a-z_][a-z0-9_]*`, so it is safe in a literal).
Nothing else is ever substituted into SQL text; values are bound parameters.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping
from typing import Any

import attrs

from .._core.identifiers import quote_ident, validate_schema

_BLOCK_START = re.compile(r"^-- (name|fragment): ([a-z_]+)(?:\(([a-z_, ]*)\))?\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"^-- include: ([a-z_]+)(?:\(([a-z_, ]*)\))?\s*$")
_MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
#: The first line of a migration that must run outside a transaction (`CREATE INDEX
#: CONCURRENTLY`, a `VALIDATE CONSTRAINT` that must not hold the table's lock for long, data
#: moved in batches): its statements end with `;` at a line's end and run one by one.
NO_TRANSACTION = "-- trioq: no-transaction"


@attrs.frozen
class Migration:
    version: int
    name: str
    sql: str

    @property
    def transactional(self) -> bool:
        return not self.sql.startswith(NO_TRANSACTION)

    def statements(self) -> list[str]:
        """A no-transaction migration's statements, one by one (no `$$` bodies in them)."""
        parts = re.split(r";[ \t]*$", self.sql, flags=re.MULTILINE)
        code = ["\n".join(_code_lines(part)) for part in parts]
        return [statement + ";" for statement in code if statement]


def _code_lines(text: str) -> list[str]:
    stripped = (line.strip() for line in text.splitlines())
    return [line for line in stripped if line and not line.startswith("--")]


def _substitute(text: str, schema: str) -> str:
    validate_schema(schema)
    return text.replace("{schema}", quote_ident(schema)).replace("{schema_name}", schema)


def _names(text: str | None) -> list[str]:
    return [] if not text else [name.strip() for name in text.split(",")]


@attrs.frozen
class _Blocks:
    """A file of blocks: each body by name, whether it is a fragment, and its parameters."""

    bodies: dict[str, tuple[str, str]]
    parameters: dict[str, list[str]]
    fragments: dict[str, str] = attrs.field(init=False)

    @fragments.default
    def _fragments(self) -> dict[str, str]:
        return {name: body for name, (kind, body) in self.bodies.items() if kind == "fragment"}

    def expand(self, body: str) -> list[str]:
        """`body`'s lines with each `-- include:` line replaced by its fragment's lines."""
        lines: list[str] = []
        for line in body.splitlines():
            include = _INCLUDE.match(line.strip())
            if include is None:
                lines.append(line)
                continue
            name, values = include.group(1), _names(include.group(2))
            if name not in self.fragments:
                raise ValueError(f"queries.sql: no fragment {name!r} to include")
            if len(values) != len(self.parameters[name]):
                raise ValueError(
                    f"queries.sql: fragment {name!r} takes {len(self.parameters[name])} names "
                    f"({', '.join(self.parameters[name])}), given {len(values)}"
                )
            # A parameterised fragment's @param@ markers become the include's identifiers
            # (fixed names in this file, never user input).
            included = self.fragments[name]
            for parameter, value in zip(self.parameters[name], values, strict=True):
                included = included.replace(f"@{parameter}@", value)
            lines.extend(self.expand(included))
        return lines


def _parse(text: str) -> _Blocks:
    starts = list(_BLOCK_START.finditer(text))
    bodies: dict[str, tuple[str, str]] = {}
    parameters: dict[str, list[str]] = {}
    for index, match in enumerate(starts):
        end = starts[index + 1].start() if index + 1 < len(starts) else len(text)
        kind, name, names = match.groups()
        if name in bodies:
            raise ValueError(f"queries.sql: block {name!r} is defined twice")
        bodies[name] = (kind, text[match.end() : end])
        parameters[name] = _names(names)
    return _Blocks(bodies, parameters)


def parse_blocks(text: str) -> dict[str, str]:
    """Split a file of `-- name: x` blocks into {name: statement}; names must be unique.

    A `-- fragment: y` block is not a statement: a line `-- include: y` in a statement is
    replaced by its lines, so two statements that must agree (the claim's SET list and the
    columns `_claimed_job` reads) are written once. A fragment may take names,
    `-- fragment: y(a, b)`, written `@a@` in its body and given by `-- include: y(x, z)` (the
    same loose index scan visits partition keys and concurrency keys). Fragments come from
    this file only; a SQL function's file may include them too (`functions`)."""
    return _statements(_parse(text))


def _statements(parsed: _Blocks) -> dict[str, str]:
    blocks: dict[str, str] = {}
    for name, (kind, body) in parsed.bodies.items():
        if kind != "name":
            continue
        # Whole-line comments are documentation for readers; the driver never sends them (a
        # placeholder quoted in a comment would otherwise be parsed as a parameter).
        # Indentation is dropped too: psycopg caches the conversion of statements only up to
        # 4 KiB, and the hot statements are several times that.
        lines = [line.strip() for line in parsed.expand(body)]
        blocks[name] = "\n".join(line for line in lines if line and not line.startswith("--"))
    return blocks


@functools.cache
def _queries_blocks() -> _Blocks:
    """queries.sql, read and parsed once: its statements and the fragments functions include."""
    from importlib import resources  # here: its import is a tenth of the producer's

    return _parse(resources.files(__package__).joinpath("queries.sql").read_text())


@functools.cache
def _raw_queries() -> dict[str, str]:
    return _statements(_queries_blocks())


@functools.cache
def queries(schema: str) -> dict[str, str]:
    """The named statements for `schema` (psycopg `%(name)s` placeholders)."""
    return {name: _substitute(sql, schema) for name, sql in _raw_queries().items()}


_PLACEHOLDER = re.compile(r"%\(([a-z_][a-z0-9_]*)\)s|%%")


@attrs.frozen
class PositionalStatement:
    """A named statement with PostgreSQL's own `$1..$n` placeholders, converted once.

    The driver sends these as they are (no per-call placeholder parsing by the client library),
    so the cost of a hot statement does not depend on how long it is, and so not on the length
    of the schema name repeated in it (psycopg caches its conversion only for statements up to
    4 KiB: the claim statement crosses that for schema names of 8 characters or more).
    """

    text: bytes
    names: tuple[str, ...]  # the parameter of $1, $2, ...

    def values(self, params: Mapping[str, Any]) -> list[Any]:
        return [params[name] for name in self.names]


def to_positional(sql: str) -> PositionalStatement:
    names: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"  # an escaped percent sign
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return PositionalStatement(_PLACEHOLDER.sub(replace, sql).encode(), tuple(names))


@functools.cache
def positional_queries(schema: str) -> dict[str, PositionalStatement]:
    """`queries(schema)` with positional placeholders (see `PositionalStatement`)."""
    return {name: to_positional(sql) for name, sql in queries(schema).items()}


def query_names() -> frozenset[str]:
    return frozenset(_raw_queries())


@attrs.frozen
class SqlFunction:
    name: str
    sql: str


def functions_digest(found: list[SqlFunction]) -> str:
    """What `migrate` keeps to tell whether the bodies changed since it last applied them."""
    digest = hashlib.sha256()
    for function in found:
        digest.update(function.name.encode() + b"\0" + function.sql.encode() + b"\0")
    return digest.hexdigest()


def functions(schema: str) -> list[SqlFunction]:
    """The SQL functions' current bodies (one file each, sorted by name), schema substituted.
    A `-- include:` line takes a fragment of queries.sql (enqueue() inserts its job through
    job_insert, as every other writer does)."""
    from importlib import resources

    folder = resources.files(__package__).joinpath("functions")
    blocks = _queries_blocks()
    found = [
        SqlFunction(
            entry.name.removesuffix(".sql"),
            _substitute("\n".join(blocks.expand(entry.read_text())) + "\n", schema),
        )
        for entry in folder.iterdir()
        if entry.name.endswith(".sql")
    ]
    return sorted(found, key=lambda function: function.name)


def migrations(schema: str) -> list[Migration]:
    """The numbered migrations, in order, with the schema substituted."""
    from importlib import resources

    folder = resources.files(__package__).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = _MIGRATION_NAME.match(entry.name)
        if match:
            sql = _substitute(entry.read_text(), schema)
            found.append(Migration(int(match.group(1)), match.group(2), sql))
    found.sort(key=lambda migration: migration.version)
    return found

"""docs/life-of-a-job.md names real code, and the life of a job stays small enough to read.

Every `` `trioq/file` `name` `` pair of the doc must name a definition of that file: a
function, class or method (`Class.method`, an attribute assigned in the class body counts) of a
Python file, found with `ast`, or a `-- name:` statement of a .sql file. The Python files the
doc names are the job's path from enqueue to its stored outcome: at most `MAX_FILES` files and
`MAX_LINES` lines together (whole files), so that what a job does not use lives elsewhere.
"""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).parent.parent
DOC = ROOT / "docs" / "life-of-a-job.md"
MAX_FILES = 15
MAX_LINES = 6000

# `trioq/...` optionally followed by `Name` or `Name.attr` (the same line, one space apart).
REFERENCE = re.compile(r"`(trioq/[\w/.]+)`(?: `([A-Za-z_][\w.]*)`)?")


def _references(text: str) -> list[tuple[str, str | None]]:
    return [(match[1], match[2]) for match in REFERENCE.finditer(text.replace("\n    ", " "))]


def _definitions(tree: ast.Module) -> set[str]:
    """Top-level functions, classes and assignments, and `Class.name` for what a class
    body defines or assigns (nested classes too)."""
    found: set[str] = set()

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(prefix + node.name)
                if isinstance(node, ast.ClassDef):
                    walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.Assign):
                found.update(prefix + t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                found.add(prefix + node.target.id)

    walk(tree.body, "")
    return found


def _statements(sql: str) -> set[str]:
    return set(re.findall(r"^-- name: (\w+)", sql, flags=re.MULTILINE))


def _missing(references: list[tuple[str, str | None]]) -> list[str]:
    missing = []
    for file, name in references:
        path = ROOT / file
        if not path.exists():
            missing.append(f"{file}: no such file")
        elif name is None or path.is_dir():
            continue
        elif path.suffix == ".sql":
            if name not in _statements(path.read_text()):
                missing.append(f"{file}: no statement named {name}")
        elif name not in _definitions(ast.parse(path.read_text())):
            missing.append(f"{file}: {name} is not defined there")
    return missing


def job_life_files() -> list[pathlib.Path]:
    """The Python files the doc names, in the order it first names them."""
    files = dict.fromkeys(ROOT / file for file, _ in _references(DOC.read_text()))
    return [path for path in files if path.suffix == ".py"]


def test_every_file_and_definition_the_doc_names_exists() -> None:
    references = _references(DOC.read_text())
    assert len(references) > 40, "the doc's references were not found"
    assert not _missing(references), "\n".join(_missing(references))


def test_the_check_finds_a_renamed_method_a_missing_file_and_a_missing_statement() -> None:
    assert _missing([("trioq/_runtime/job/completer.py", "Completer._flush")]) == []
    assert _missing([("trioq/_runtime/job/completer.py", "Completer.flush_all")])
    assert _missing([("trioq/_runtime/completer.py", "Completer._flush")])
    assert _missing([("trioq/_sql/queries.sql", "job_claim")]) == []
    assert _missing([("trioq/_sql/queries.sql", "job_claim_all")])


def test_the_life_of_a_job_stays_within_its_budget() -> None:
    files = job_life_files()
    lines = sum(len(path.read_text().splitlines()) for path in files)
    listing = "\n".join(str(path.relative_to(ROOT)) for path in files)
    assert len(files) <= MAX_FILES, f"{len(files)} files:\n{listing}"
    assert lines <= MAX_LINES, f"{lines} lines in:\n{listing}"

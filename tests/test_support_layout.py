"""Tests build job states through tests/support.py, not with their own writes to the jobs tables.

Where a job's state, lease and outcome are stored is planned to change
(bench/plans/write_once_layout.md): the helpers of tests/support.py are the one place in the tests
that knows the columns. This check reads every string literal of tests/**/*.py (f-strings with
their placeholders blanked, implicitly joined pieces as one string) and finds the SQL writes to
`jobs`, `jobs_live` or a history partition (`jobs_d*`, `jobs_before`, `jobs_unfiled`). Each one
outside tests/support.py must be in ALLOWED, under the test (or module-level name) holding it,
with the reason it stays: the raw write is what the test is about, the layout of an old
migration, or a bulk fill of thousands of rows (the planner's statistics, a chunked count). It
reads literals only: SQL assembled from pieces at run time escapes it.
"""

from __future__ import annotations

import ast
import pathlib
import re
from collections import Counter

TESTS = pathlib.Path(__file__).parent
SUPPORT = TESTS / "support.py"

JOB_WRITE = re.compile(
    r"\b(?:UPDATE|INSERT\s+INTO|DELETE\s+FROM|TRUNCATE(?:\s+TABLE)?|MERGE\s+INTO)\s+(?:ONLY\s+)?"
    r'(?:[\w{}"]+\.)?"?(?:jobs|jobs_live|jobs_d\d+|jobs_before|jobs_unfiled|job_rows_legacy'
    r"|job_rows|job_outcomes|job_runs)\b",
    re.IGNORECASE,
)

SUBJECT = "the raw write is the test's subject"
OLD_LAYOUT = "an old migration's layout: rows written before the current migrations ran"
PLANNER_FILL = "a bulk fill for the planner's statistics (thousands of rows in one INSERT)"

# (file, top-level function or module-level name) -> (how many writes, why they stay). A site
# converted to a helper leaves this list (the check fails while it is listed); a new one joins it
# only for a reason of the three kinds above, or when the literal runs no write at all.
ALLOWED: dict[tuple[str, str], tuple[int, str]] = {
    ("test_claim_path.py", "SUSPENDED_FILL"): (2, PLANNER_FILL),
    (
        "test_claim_path.py",
        "test_a_generic_plan_made_on_an_empty_table_probes_keyed_heads_by_primary_key",
    ): (1, PLANNER_FILL),
    ("test_claim_path.py", "test_the_statements_of_running_jobs_find_them_by_primary_key"): (
        2,
        PLANNER_FILL + ": 20,000 rows, 20 of them running under a lease (their rows and runs)",
    ),
    (
        "test_claim_path.py",
        "test_the_completions_find_their_runs_by_key_in_a_job_runs_bloated_since_planned",
    ): (
        3,
        PLANNER_FILL + ": 20,000 runs inserted and deleted, the bloat job_runs_finish() must not"
        " scan, around 26 runs of its own",
    ),
    ("test_plain_rounds.py", "test_the_generic_plan_reads_no_table_in_full_on_a_backlog"): (
        1,
        PLANNER_FILL,
    ),
    (
        "test_ready_keyed.py",
        "test_migration_0048_files_the_ready_keyed_rows_and_drops_the_keyed_indexes",
    ): (1, OLD_LAYOUT + " (ready, delayed and claimed keyed rows at version 47)"),
    ("test_status.py", "test_vacuum_never_truncates_the_hot_tables_and_rows_survive"): (
        1,
        OLD_LAYOUT + " (ready rows before migration 24)",
    ),
    (
        "test_concurrency_keys.py",
        "test_migration_0027_keeps_live_rows_claimable_and_old_sql_enqueue_calls_working",
    ): (1, OLD_LAYOUT + " (a running row at version 26)"),
    (
        "test_workflows.py",
        "test_a_deleted_jobs_checkpoints_go_with_it_and_other_jobs_keep_theirs",
    ): (1, SUBJECT + ": a DELETE of several jobs fires the trigger deleting their checkpoints"),
    ("test_roles.py", "test_only_the_owner_can_migrate"): (
        1,
        SUBJECT + ": the roles are refused it",
    ),
    (
        "test_roles.py",
        "test_producers_and_the_sql_entry_points_run_under_the_producer_role",
    ): (1, SUBJECT + ": the producer role is refused it"),
    (
        "test_roles.py",
        "test_the_viewer_reads_the_dashboard_and_kedas_query_and_writes_nothing",
    ): (2, SUBJECT + ": the viewer role is refused them"),
    ("test_search_path.py", "_exercise"): (
        1,
        SUBJECT + ": a keyed job's end fires its triggers under a hostile search_path, from a"
        " statement that qualifies every name (the helpers call an unqualified now())",
    ),
    (
        "test_wait_interleavings.py",
        "test_child_finishing_during_the_parents_suspension_is_never_missed",
    ): (
        3,
        SUBJECT + ": a child's final statement (its run's delete, its row's move, the parent's"
        " row) holding its parent's row, in a transaction left open on the async session while"
        " the parent's wait statement runs into it",
    ),
    ("test_job_due.py", "_seed_every_state"): (
        2,
        OLD_LAYOUT + " (every state at version 43, before migrations 0044-0047)",
    ),
    (
        "test_runs.py",
        "test_a_job_running_when_migration_0047_runs_keeps_its_lease_as_a_run",
    ): (1, OLD_LAYOUT + " (a running row with its lease, at version 46)"),
    (
        "test_identifiers.py",
        "test_check_constraint_accepts_exactly_the_names_the_validator_accepts",
    ): (1, SUBJECT + ": a raw INSERT meets the table's CHECK constraints"),
    (
        "test_enqueue_fast_path.py",
        "test_the_name_checks_accept_exactly_what_the_old_regex_accepted",
    ): (1, SUBJECT + ": a raw INSERT meets the table's CHECK constraints"),
    (
        "test_enqueue_fast_path.py",
        "test_the_prepared_single_enqueue_survives_schema_changes_on_its_session",
    ): (1, "not a write: the prepared enqueue's text, looked for in pg_prepared_statements"),
}


def _literal_text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            str(part.value) if isinstance(part, ast.Constant) else "{}" for part in node.values
        )
    return None


def _owner(statement: ast.stmt) -> str:
    """The name a write is filed under: the top-level function or class, else the names a
    module-level assignment binds."""
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return statement.name
    if isinstance(statement, ast.Assign | ast.AnnAssign):
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        return ", ".join(ast.unparse(target) for target in targets)
    return "<module>"


def _line(node: ast.expr, text: str, offset: int) -> int:
    """The line of `text[offset]`: counted through a triple-quoted string's own line breaks,
    else the line where the string starts (pieces joined, or a "\\n" escape, break no line)."""
    end = node.end_lineno if node.end_lineno is not None else node.lineno
    if text.count("\n") == end - node.lineno:
        return node.lineno + text.count("\n", 0, offset)
    return node.lineno


def job_writes(path: pathlib.Path) -> list[tuple[str, int, str]]:
    """(owner, line, SQL) of each write to a jobs table in the file's string literals."""
    found = []
    for statement in ast.parse(path.read_text(), str(path)).body:
        owner = _owner(statement)
        for node in ast.walk(statement):
            text = _literal_text(node)
            if text is None:
                continue
            assert isinstance(node, ast.expr)
            for match in JOB_WRITE.finditer(text):
                found.append((owner, _line(node, text, match.start()), match[0]))
    return found


def unlisted_writes(
    root: pathlib.Path, allowed: dict[tuple[str, str], tuple[int, str]]
) -> tuple[list[str], list[str]]:
    """The writes under `root` that `allowed` does not list ("file:line: SQL"), and the entries
    of `allowed` that no longer match what is there (a converted site left the list)."""
    unlisted, stale = [], []
    counts: Counter[tuple[str, str]] = Counter()
    for path in sorted(root.rglob("*.py")):
        if path == SUPPORT:
            continue
        name = path.relative_to(root).as_posix()
        writes = job_writes(path)
        counts.update((name, owner) for owner, _, _ in writes)
        for owner, line, text in writes:
            if counts[name, owner] > allowed.get((name, owner), (0, ""))[0]:
                unlisted.append(f"{name}:{line}: {text!r} (in {owner})")
    for key, (count, _) in allowed.items():
        if counts[key] < count:
            stale.append(f"{key[0]} {key[1]}: {count} allowed, {counts[key]} found")
    return unlisted, stale


def test_no_test_writes_the_jobs_tables_outside_the_support_helpers() -> None:
    unlisted, stale = unlisted_writes(TESTS, ALLOWED)
    assert not unlisted, (
        "build job states with the helpers of tests/support.py (docs/testing.md), or list the "
        "site in ALLOWED with its reason:\n" + "\n".join(unlisted)
    )
    assert not stale, "ALLOWED lists writes that are gone:\n" + "\n".join(stale)


def test_the_check_names_a_new_write_by_file_and_line(tmp_path: pathlib.Path) -> None:
    verb = "UPDATE"  # kept out of this file's literals, which the check reads too
    (tmp_path / "test_new.py").write_text(
        "def test_a():\n"
        '    run("SELECT 1")\n'
        f"    run(f\"{verb} {{schema}}.jobs SET state = 'ready'\")\n"
        "\n"
        f'QUERY = "{verb} jobs_live SET run_at = now()"\n'
    )
    unlisted, stale = unlisted_writes(tmp_path, {("test_new.py", "QUERY"): (1, "a reason")})
    assert unlisted == [f"test_new.py:3: '{verb} {{}}.jobs' (in test_a)"]
    assert stale == []
    unlisted, stale = unlisted_writes(tmp_path, {("test_new.py", "test_a"): (2, "a reason")})
    assert unlisted == [f"test_new.py:5: '{verb} jobs_live' (in QUERY)"]
    assert stale == ["test_new.py test_a: 2 allowed, 1 found"]

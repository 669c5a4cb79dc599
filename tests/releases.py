"""The previous release of trioq, read from this clone's git history: the upgrade test runs its
workers, the schema snapshot test migrates with its code first."""

from __future__ import annotations

import io
import re
import subprocess
import tarfile
from pathlib import Path

from trioq._sql import Migration
from trioq._sql import _substitute as substitute

REPO_ROOT = Path(__file__).resolve().parent.parent
# The release before this one: main as the previous release landed. Move it forward at each
# release (docs/operations.md, "Upgrading", says what tests/test_upgrade.py showed for the pair).
PREVIOUS_RELEASE = "2358787331d66e1e21a9a7ee275cd8b51f98e732"


def extract_previous_release(target: Path) -> Path:
    """The previous release's tree (trioq/ and tests/) in `target`."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "archive", "--format=tar", PREVIOUS_RELEASE],
            check=True,
            capture_output=True,
            timeout=120,
        ).stdout
    except subprocess.CalledProcessError as exc:
        raise AssertionError(
            f"the previous release {PREVIOUS_RELEASE[:7]} is not in this clone "
            f"({exc.stderr.decode().strip()}): fetch the whole history (git fetch --unshallow)"
        ) from None
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return target


def previous_release_migrations(schema: str) -> list[Migration]:
    """The previous release's numbered migrations, schema substituted. They still define the
    SQL functions inline, as each version had them: replaying those below a version builds the
    schema exactly as that version left it (this tree's migrations leave the bodies to
    trioq/_sql/functions/, which hold only the current ones)."""
    listing = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "ls-tree", "--name-only", PREVIOUS_RELEASE,
         "trioq/_sql/migrations/"],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.split()  # fmt: skip
    found = []
    for path in listing:
        match = re.match(r"^(\d{4})_([a-z0-9_]+)\.sql$", Path(path).name)
        if match:
            text = subprocess.run(
                ["git", "-C", str(REPO_ROOT), "show", f"{PREVIOUS_RELEASE}:{path}"],
                check=True, capture_output=True, text=True, timeout=60,
            ).stdout  # fmt: skip
            found.append(Migration(int(match[1]), match[2], substitute(text, schema)))
    return sorted(found, key=lambda migration: migration.version)


def run_previous_cli(source: Path, pg_url: str, *args: str) -> str:
    """`python -m trioq.cli ARGS --database-url URL` of the checkout `source` (its trioq first
    on sys.path: `-m` puts the working directory there)."""
    return _run_previous(source, ["-m", "trioq.cli", *args, "--database-url", pg_url])


def run_previous_python(source: Path, script: str, *args: str) -> str:
    """`python -c SCRIPT ARGS` with the checkout `source`'s trioq first on sys.path."""
    return _run_previous(source, ["-c", script, *args])


def _run_previous(source: Path, argv: list[str]) -> str:
    import sys

    result = subprocess.run(
        [sys.executable, *argv],
        cwd=source,
        env={"PYTHONPATH": str(source), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{argv[:3]} of {source}: {output}"
    return output


# Stage 2 as it was built to ship alone (branch job-due's last commit before its merge into
# write-once): migrations 0044-0046 are online, and their tests replay a writer racing the
# backfill between them. This tree applies 0044-0047 in one stop-first migrate, and its
# functions' bodies name 0047's columns (`phase`, `filed`); those tests run with the bodies
# of that commit, as the release that ships 0044-0046 alone would.
JOB_DUE_RELEASE = "940a9e69f50558d619bbd63d9aa41f4633ffd5db"


def functions_at(commit: str, schema: str) -> list[str]:
    """The SQL functions' bodies as `commit` had them (its trioq/_sql/functions/, its
    queries.sql's fragments included), schema substituted, sorted by name."""
    from trioq._sql import _parse

    def show(path: str) -> str:
        return subprocess.run(
            ["git", "-C", str(REPO_ROOT), "show", f"{commit}:{path}"],
            check=True, capture_output=True, text=True, timeout=60,
        ).stdout  # fmt: skip

    listing = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "ls-tree", "--name-only", commit,
         "trioq/_sql/functions/"],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.split()  # fmt: skip
    blocks = _parse(show("trioq/_sql/queries.sql"))
    return [
        substitute("\n".join(blocks.expand(show(path))) + "\n", schema)
        for path in sorted(listing)
        if path.endswith(".sql")
    ]

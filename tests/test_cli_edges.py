"""The CLI's rough edges a newcomer meets in the first hour, each ending in one line naming the
cause: a broken app module, a missing dependency, JSON from a file or stdin, a bad state name,
the help text."""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import sql_rows
from tests.test_cli import REPO_ROOT, one_line
from trioq.cli import commands


def trioq_in(directory: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`python -m trioq.cli ...` run from `directory` (where the app module lives)."""
    env = {k: v for k, v in os.environ.items() if k != "TRIOQ_DATABASE_URL"}
    env["PYTHONPATH"] = REPO_ROOT  # trioq itself from this tree
    return subprocess.run(
        [sys.executable, "-m", "trioq.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=directory,
        env=env,
        check=False,
    )


def test_a_syntax_error_in_the_app_exits_2_naming_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "broken_app.py").write_text("import trioq\napp = trioq.App()\ndef f(:\n")
    result = trioq_in(tmp_path, "worker", "broken_app:app", "--database-url", "host=/x")
    assert result.returncode == 2, result.stderr
    line = one_line(result)
    assert f"{tmp_path / 'broken_app.py'}, line 3: invalid syntax" in line


def test_a_missing_dependency_of_the_app_is_named_as_such(tmp_path: Path) -> None:
    (tmp_path / "needs_dep.py").write_text("import trioq\nimport not_installed_dep_xyz\n")
    result = trioq_in(tmp_path, "worker", "needs_dep:app", "--database-url", "host=/x")
    assert result.returncode == 2, result.stderr
    line = one_line(result)
    assert "module 'needs_dep' was found, but it imports 'not_installed_dep_xyz'" in line
    assert "run from the directory" not in line


def test_enqueue_reads_json_from_a_file_or_stdin(
    tmp_path: Path,
    pg_url: str,
    pg_schema: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    module = f"json_app_{pg_schema}"  # in this process: a module name of its own
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            f"""
            import trioq
            app = trioq.App(schema={pg_schema!r})

            @app.task("ingest")
            async def ingest(ctx, payload):
                return None
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    url = ["--database-url", pg_url]
    assert commands.main(["migrate", "--schema", pg_schema, *url]) == 0
    big = {"rows": ["x" * 100] * 3000}  # about 300 KB: over Linux's 128 KiB per argument
    (tmp_path / "payload.json").write_text(json.dumps(big))
    assert commands.main(["enqueue", f"{module}:app", "ingest", "@payload.json", *url]) == 0
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"n": 1}'))
    assert commands.main(["enqueue", f"{module}:app", "ingest", "-", *url]) == 0
    payloads = sql_rows(pg_url, f"SELECT payload FROM {pg_schema}.jobs ORDER BY id")
    assert payloads == [(big,), ({"n": 1},)]
    capsys.readouterr()
    assert commands.main(["enqueue", f"{module}:app", "ingest", "@nope.json", *url]) == 2
    error = capsys.readouterr().err
    assert "trioq: JSON: cannot read 'nope.json' (No such file or directory)" in error


def test_jobs_with_an_unknown_state_lists_the_valid_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        commands.build_parser().parse_args(["jobs", "--state", "bogus"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "invalid choice: 'bogus'" in error
    for state in ("scheduled", "ready", "running", "sleeping", "waiting", "completed"):
        assert repr(state) in error


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_help_prints_each_default_once_and_never_none() -> None:
    for name, command in subcommands(commands.build_parser()).items():
        formatter = command._get_formatter()
        for action in command._actions:
            if not action.help:
                continue
            shown = copy.copy(action)
            shown.help = formatter._get_help_string(action)  # with the default appended, if due
            text = formatter._expand_help(shown)
            assert text.count("default:") <= 1, (name, action.dest, text)
            assert "(default: None)" not in text, (name, action.dest)


def test_the_help_summary_names_every_command() -> None:
    parser = commands.build_parser()
    summary = parser.description or ""
    names = subcommands(parser)
    assert set(names) == set(commands.COMMANDS)
    for name in names:
        assert name in summary, name


def test_a_reader_that_closes_the_pipe_early_ends_the_command_quietly(
    pg_url: str, pg_schema: str
) -> None:
    """`trioq jobs --json | head -1`: the reader goes away mid-output; the command exits 0 with
    nothing on stderr (it printed `unexpected BrokenPipeError` and exited 1)."""
    import trio

    import trioq

    async def many_jobs() -> None:
        async with trioq.App(pg_url, schema=pg_schema).client(migrate=True) as client:
            await client.enqueue_many(trioq.TaskDeclaration("noop"), [{"pad": "x" * 200}] * 1000)

    trio.run(many_jobs)
    argv = [sys.executable, "-m", "trioq.cli", "jobs", "--json", "--limit", "1000"]
    argv += ["--database-url", pg_url, "--schema", pg_schema]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.read(100)  # the first bytes of a long output, then the reader goes
        proc.stdout.close()
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=60)
    assert (code, err) == (0, "")

"""The README's "Your own app in five minutes": its app, producer script and tests, run as
written (extracted from README.md) against the session's PostgreSQL."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def section_blocks() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Your own app in five minutes") :]
    section = section[: section.index("\n## ", 1)]
    return [textwrap.dedent(block) for block in re.findall(r"```python\n(.*?)```", section, re.S)]


def test_readme_own_app_section_runs_as_written(
    pytester: pytest.Pytester, pg_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, producer, tests = section_blocks()
    # The app's schema is the test's own, so the worker below runs only these jobs.
    app = app.replace("trioq.App()", f"trioq.App(schema={pg_schema!r})")
    producer = producer.replace("SyncProducer()", f"SyncProducer(schema={pg_schema!r})")
    pytester.makepyfile(myapp=app, test_myapp=tests)
    pytester.makeini("[pytest]\ntrio_mode = true\ntrioq_app = myapp:app\nfilterwarnings = error\n")
    monkeypatch.setenv("TRIOQ_DATABASE_URL", pg_url)
    outcome = pytester.runpytest("-q", "-p", "no:cacheprovider")
    outcome.assert_outcomes(passed=3)

    env = {"TRIOQ_DATABASE_URL": pg_url, "PATH": "/usr/bin:/bin"}
    cli = [sys.executable, "-m", "trioq.cli"]
    run = {"cwd": pytester.path, "env": env, "capture_output": True, "text": True, "timeout": 60}
    assert subprocess.run([*cli, "migrate", "--schema", pg_schema], **run).returncode == 0
    (pytester.path / "enqueue.py").write_text(producer)
    with subprocess.Popen(
        [*cli, "worker", "myapp:app", "--queue", "default", "--grace", "0"],
        cwd=pytester.path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as worker:
        try:
            script = subprocess.run([sys.executable, "enqueue.py"], **run)
        finally:
            worker.terminate()
            worker.wait(timeout=60)
    assert script.returncode == 0, script.stderr
    assert script.stdout.strip() == "hello ada"

"""What `pip install` ships: every package, and a demo that runs from any directory."""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile

import pytest
import setuptools

ROOT = pathlib.Path(__file__).resolve().parent.parent
WHEEL_SOURCES = ("pyproject.toml", "README.md", "trioq", "workflows")


def test_every_package_of_trioq_is_listed_for_the_wheel() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = setuptools.find_packages(str(ROOT), include=["trioq", "trioq.*"])
    assert set(found) <= set(config["packages"]), "add the new package to pyproject.toml"
    assert config["package-dir"] == {"trioq_workflows": "workflows"}


def test_the_pre_commit_hooks_run_every_check_ci_runs_before_the_tests() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    checks = ci[ci.index('echo "--- lint and types"') : ci.index('echo "--- tests')]
    commands = [line.strip() for line in checks.splitlines()[1:] if line.strip()]
    assert commands, "the lint step of .ci/run was not found"
    hooks = (ROOT / ".pre-commit-config.yaml").read_text()
    entries = [
        line.split("entry:", 1)[1].strip() for line in hooks.splitlines() if "entry:" in line
    ]
    assert entries
    missing = [command for command in commands if command not in entries]
    assert not missing, f"add these .ci/run checks to .pre-commit-config.yaml: {missing}"


def _source_digest() -> str:
    digest = hashlib.sha256()
    for name in WHEEL_SOURCES:
        path = ROOT / name
        files = [path] if path.is_file() else sorted(path.rglob("*"))
        for file in files:
            if file.is_file() and "__pycache__" not in file.parts:
                digest.update(str(file.relative_to(ROOT)).encode())
                digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def _pip(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
        check=True,
        capture_output=True,
        timeout=300,
    )


@pytest.fixture
def built_wheel(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> pathlib.Path:
    """The wheel of the current sources, built once per source digest (pytest's cache)."""
    cache = pathlib.Path(request.config.cache.mkdir("trioq-wheel")) / _source_digest()
    wheels = sorted(cache.glob("trioq-*.whl"))
    if wheels:
        return wheels[0]
    source = tmp_path / "source"
    source.mkdir()
    for name in WHEEL_SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy(ROOT / name, source / name)
    _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(cache), str(source))
    return sorted(cache.glob("trioq-*.whl"))[0]


@pytest.mark.slow
def test_the_wheel_ships_py_typed_and_the_embedded_package(built_wheel: pathlib.Path) -> None:
    names = set(zipfile.ZipFile(built_wheel).namelist())
    assert "trioq/py.typed" in names, "users' type checkers would ignore trioq's annotations"
    assert {"trioq/embedded/__init__.py", "trioq/embedded/__main__.py"} <= names


@pytest.mark.slow
def test_demo_runs_from_a_scratch_directory_after_installing_the_wheel(
    built_wheel: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    _pip("--python", str(python), "install", "--no-deps", "--no-index", str(built_wheel))
    # The wheel's dependencies come from this environment's site-packages (a plain path entry:
    # its .pth files, the editable trioq's among them, are not processed), so the test needs no
    # network; trioq and trioq_workflows themselves can only come from the wheel.
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    pathlib.Path(purelib, "_trioq_test_deps.pth").write_text(sysconfig.get_paths()["purelib"])
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("TRIOQ_DATABASE_URL", "PYTHONPATH")}
    where = subprocess.run(
        [
            python,
            "-c",
            "import trioq, trioq_workflows; print(trioq.__file__, trioq_workflows.__file__)",
        ],
        cwd=scratch,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert str(ROOT) not in where, f"imported from the checkout: {where}"
    demo = subprocess.run(
        [venv / "bin" / "trioq", "demo"],
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "summary" in demo.stdout.lower(), demo.stdout[-3000:]
    # The dashboard started: its templates and static files are in the wheel.
    assert "dashboard (read-only, open while the demo runs): http://" in demo.stdout

"""What each entry point imports, read from `sys.modules` in a fresh interpreter (not timed:
the time belongs to docs/producers.md, the modules are what a change can break)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

# What a web process that only enqueues must not pay for.
WORKER_SIDE = ("trio", "trioq._runtime", "hypercorn", "prometheus_client", "rich")
# What a producer imports only once it connects.
CONNECTION_SIDE = ("psycopg", "psycopg_pool", "asyncio")


def _loaded_after(snippet: str) -> list[set[str]]:
    """The modules loaded at each `snapshot()` `snippet` calls in a new interpreter, and at
    its end."""
    prelude = "import json, sys\ndef snapshot(): print(json.dumps(sorted(sys.modules)))\n"
    program = prelude + textwrap.dedent(snippet) + "\nsnapshot()"
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=60
    )
    return [set(json.loads(line)) for line in done.stdout.splitlines() if line.startswith("[")]


def _of(modules: set[str], roots: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == r or m.startswith(r + ".") for r in roots))


def test_importing_the_producer_loads_neither_the_worker_side_nor_psycopg() -> None:
    (loaded,) = _loaded_after(
        "from trioq.producer import AsyncProducer, SyncProducer, declare_task"
    )
    assert _of(loaded, WORKER_SIDE + CONNECTION_SIDE) == []
    assert {
        "trioq.producer.sync",
        "trioq.producer.aio",
    } <= loaded  # the classes were imported, not deferred
    # Nor the driver seam's record classes, cattrs (built at the first typed payload) or the
    # statements' file loader (at the first statement).
    assert _of(loaded, ("trioq._seam.driver", "cattrs", "importlib.resources")) == []


def test_a_typed_payload_builds_the_converter_at_first_use() -> None:
    bare, used = _loaded_after(
        """
        import attrs
        from trioq._core import codec
        snapshot()
        @attrs.frozen
        class Point:
            x: int
        assert codec.encode(Point(1)) == '{"x":1}'
        """
    )
    assert "cattrs" not in bare and "cattrs" in used


def test_a_producer_imports_psycopg_when_built_and_still_not_trio() -> None:
    (loaded,) = _loaded_after(
        """
        from trioq.producer import SyncProducer, ProducerConnectionError
        try:  # nothing listens on port 1: the producer fails its first connection at once
            SyncProducer("postgresql://127.0.0.1:1/none?connect_timeout=1")
        except ProducerConnectionError:
            pass
        """
    )
    assert "psycopg" in loaded
    assert _of(loaded, WORKER_SIDE) == []


def test_import_trioq_defers_every_name_until_it_is_read() -> None:
    bare, used = _loaded_after("import trioq\nsnapshot()\ntrioq.App")
    assert _of(bare, WORKER_SIDE + CONNECTION_SIDE + ("trioq.app", "trioq.client")) == []
    assert {"trio", "trioq.app", "trioq._runtime.services.worker"} <= used


def test_every_public_name_resolves_and_is_listed() -> None:
    import trioq

    missing = [name for name in trioq.__all__ if getattr(trioq, name, None) is None]
    assert missing == []
    assert set(trioq.__all__) <= set(dir(trioq))
    with pytest.raises(AttributeError, match="no attribute 'Wroker'"):
        trioq.Wroker  # noqa: B018


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["worker", "--help"]])
def test_cli_help_and_version_load_only_the_parser(argv: list[str]) -> None:
    (loaded,) = _loaded_after(
        f"""
        from trioq.cli import main
        try:
            main({argv!r})
        except SystemExit:
            pass
        """
    )
    heavy = WORKER_SIDE + CONNECTION_SIDE + ("trioq.app", "trioq._seam.driver", "cattrs")
    assert _of(loaded, heavy) == []
    # Nor the dashboard's security module (hashlib, secrets).
    assert _of(loaded, ("trioq.dashboard.security", "hashlib")) == []


def test_the_dashboard_parser_offers_the_auth_modes_security_accepts() -> None:
    from trioq.dashboard import cli, security

    assert cli.AUTH_MODES == security.AUTH_MODES


def test_a_worker_without_health_port_does_not_load_the_health_server() -> None:
    # Everything `trioq worker` imports up to serving (cmd_worker's imports and the app's),
    # short of connecting: hypercorn comes only with the server `--health-port` starts.
    worker, serving = _loaded_after(
        """
        import trioq.cli.commands, trioq.cli.worker, trioq.cli.processes
        from trioq._runtime.services.health import HealthTarget
        from trioq.app import App, load_app
        async def handler(ctx, payload): ...
        App(database_url="postgresql://unused").task("t")(handler)
        HealthTarget()
        snapshot()
        from trioq._runtime.services.health import _config
        _config("127.0.0.1", 0)  # what serve_health does first
        """
    )
    assert "trioq._runtime.services.worker" in worker
    assert _of(worker, ("hypercorn",)) == []
    assert "hypercorn" in serving

"""A throwaway PgBouncer in front of the test cluster (tests/test_pooler.py, bench/pooler.py).

Debian's `pgbouncer` program (.ci/run installs it), started in the foreground on a unix socket
in a private directory (no TCP port to collide on), with `auth_type = trust`, and stopped by
its pid. PgBouncer refuses to run as root, so a root process runs it as the `postgres` OS user,
the owner of the embedded cluster.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import attrs
import psycopg
from psycopg.conninfo import conninfo_to_dict

PORT = 6432
START_TIMEOUT = 15.0


@attrs.frozen
class PgBouncer:
    """A running PgBouncer: `conninfo(database)` reaches one of its `[databases]` entries."""

    socket_dir: Path
    log_path: Path

    def conninfo(self, database: str = "postgres") -> str:
        return f"host={self.socket_dir} port={PORT} user=postgres dbname={database}"


def find_pgbouncer() -> str:
    """The pgbouncer program; a clear failure (naming the fix) where it is not installed."""
    found = shutil.which("pgbouncer") or shutil.which("/usr/sbin/pgbouncer")
    if found is None:
        raise RuntimeError("pgbouncer is not installed: apt-get install pgbouncer (.ci/run does)")
    return found


@contextmanager
def running_pgbouncer(
    server_conninfo: str, databases: Mapping[str, str], *, pool_mode: str = "transaction"
) -> Iterator[PgBouncer]:
    """PgBouncer in `pool_mode` in front of `server_conninfo` (a unix-socket conninfo: host and
    port are read from it). `databases` maps each entry's name to its extra settings, e.g.
    `{"postgres": "", "single": "dbname=postgres pool_size=1"}`."""
    server = conninfo_to_dict(server_conninfo)
    owner = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
    run_dir = Path(tempfile.mkdtemp(prefix="trioq-pgbouncer-"))
    if owner is not None:
        os.chown(run_dir, owner.pw_uid, owner.pw_gid)
    entries = "\n".join(
        f"{name} = host={server['host']} port={server.get('port', 5432)} {extra}".rstrip()
        for name, extra in databases.items()
    )
    (run_dir / "users.txt").write_text('"postgres" ""\n')
    config = run_dir / "pgbouncer.ini"
    log_path = run_dir / "pgbouncer.log"
    config.write_text(
        f"[databases]\n{entries}\n\n[pgbouncer]\n"
        f"listen_addr =\nlisten_port = {PORT}\nunix_socket_dir = {run_dir}\n"
        f"auth_type = trust\nauth_file = {run_dir / 'users.txt'}\n"
        f"pool_mode = {pool_mode}\nmax_client_conn = 1000\ndefault_pool_size = 20\n"
        f"logfile = {log_path}\nadmin_users = postgres\n"
    )
    process = subprocess.Popen(
        [find_pgbouncer(), str(config)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        user=owner.pw_uid if owner else None,
        group=owner.pw_gid if owner else None,
        extra_groups=[] if owner else None,
    )
    bouncer = PgBouncer(run_dir, log_path)
    try:
        _wait_until_accepting(bouncer, process)
        yield bouncer
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(run_dir, ignore_errors=True)


def _wait_until_accepting(bouncer: PgBouncer, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"pgbouncer exited with {process.returncode}: {_tail(bouncer)}")
        try:
            # The admin console: there whatever the [databases] section holds.
            with psycopg.connect(bouncer.conninfo("pgbouncer"), connect_timeout=2):
                return
        except psycopg.OperationalError as exc:
            if time.monotonic() > deadline:
                message = f"pgbouncer did not accept connections: {_tail(bouncer)}"
                raise RuntimeError(message) from exc
        time.sleep(0.05)  # a process starting: nothing to wait on but its socket


def _tail(bouncer: PgBouncer) -> str:
    try:
        return " | ".join(bouncer.log_path.read_text().splitlines()[-5:])
    except OSError as exc:
        return f"(no log: {exc})"

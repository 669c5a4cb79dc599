"""A throwaway local PostgreSQL cluster for tests, the demo and development.

`EmbeddedPostgres` runs `initdb` and `pg_ctl` from binaries found on this machine into a private
directory under /tmp and serves on a unix socket only (``listen_addresses = ''``), so clusters never
compete for a TCP port. Durability is switched off (``fsync``, ``synchronous_commit`` and
``full_page_writes`` are all ``off``): a crash of the machine can corrupt the cluster, which is
fine for data that is deleted on `stop` anyway. Never point it at data you want to keep.

PostgreSQL refuses to run as root; when this process is root, the server programs run as the
``postgres`` OS user and the private directories are handed to that user.

Everything here blocks (initdb takes about a second). From trio code, call it through
`trio.to_thread.run_sync`.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import importlib
import importlib.util
import os
import pwd
import re
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType, TracebackType
from urllib.parse import quote

import attrs

__all__ = [
    "SEARCH_GLOBS",
    "EmbeddedPostgres",
    "EmbeddedPostgresError",
    "EmbeddedSettings",
    "embedded_postgres",
    "find_postgres_bindir",
]

SettingValue = str | int | float | bool

#: Where distro packages put the server programs (Debian/Ubuntu, PGDG RPMs); highest version wins.
SEARCH_GLOBS: tuple[str, ...] = ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin")

_SERVER_PROGRAMS = ("initdb", "pg_ctl", "postgres")
# Short and fixed: a unix socket path must stay under 107 bytes, whatever $TMPDIR says.
_RUN_DIR_PARENT = "/tmp"
_LOG_TAIL_LINES = 40
_PG_CTL_TIMEOUT = "60"  # seconds
# Trust auth on a socket only this machine's users reach; --no-sync because nothing here is kept.
_INITDB_OPTIONS = ("-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--no-locale")


class EmbeddedPostgresError(RuntimeError):
    """The embedded cluster could not be found, created, started or stopped."""


def _absolute(path: Path | str | None) -> Path | None:
    return None if path is None else Path(path).absolute()


def _frozen_settings(value: Mapping[str, SettingValue]) -> Mapping[str, SettingValue]:
    return MappingProxyType(dict(value))


@attrs.frozen
class EmbeddedSettings:
    """Server settings of an embedded cluster, on top of the fixed throwaway-cluster ones."""

    max_connections: int = 200
    shared_preload_libraries: tuple[str, ...] = ()
    #: Any other ``postgresql.conf`` setting; these win over everything else.
    server_settings: Mapping[str, SettingValue] = attrs.field(
        factory=dict, converter=_frozen_settings, hash=False
    )

    def conf_lines(self, *, socket_dir: Path, port: int) -> list[str]:
        """The ``postgresql.conf`` lines for a cluster serving on `socket_dir` only."""
        values: dict[str, SettingValue] = {
            "listen_addresses": "",
            "unix_socket_directories": str(socket_dir),
            # Only the server's OS user (and root) may connect: the socket is trust-auth.
            "unix_socket_permissions": "0700",
            "port": port,
            "fsync": False,
            "synchronous_commit": False,
            "full_page_writes": False,
            "max_connections": self.max_connections,
        }
        if self.shared_preload_libraries:
            values["shared_preload_libraries"] = ",".join(self.shared_preload_libraries)
        values.update(self.server_settings)
        return [f"{name} = {_conf_literal(value)}" for name, value in values.items()]


def _conf_literal(value: SettingValue) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int | float):
        return str(value)
    return "'" + value.replace("'", "''") + "'"


@attrs.define(eq=False)
class EmbeddedPostgres:
    """A private PostgreSQL cluster that lives from `start` to `stop`.

    Without `data_dir`, the cluster is created in a fresh temporary directory and deleted on
    `stop`. With `data_dir`, an existing cluster there is reused (or a new one created) and kept.
    The socket and the server log live in `socket_dir`, by default a temporary directory of
    their own.
    """

    settings: EmbeddedSettings = attrs.field(factory=EmbeddedSettings)
    # Absolute: the server programs run in the socket directory, not in ours.
    data_dir: Path | None = attrs.field(default=None, converter=_absolute)
    bindir: Path | None = None
    #: Only names the socket file (there is no TCP listener), so clusters cannot collide on it.
    port: int = 5432
    #: Who runs the server when this process is root.
    os_user: str = "postgres"
    #: Where the socket and the server log live (created if missing, removed on `stop`).
    #: None: a fresh temporary directory, so the URL changes at every start; give one (as
    #: `trioq dev-db` does) to get the same URL each time.
    socket_dir: Path | None = attrs.field(default=None, converter=_absolute)

    _run_dir: Path | None = attrs.field(default=None, init=False)
    _server_bindir: Path | None = attrs.field(default=None, init=False)
    _owner: pwd.struct_passwd | None = attrs.field(default=None, init=False)

    @property
    def running(self) -> bool:
        """Between a successful `start` and `stop`."""
        return self._run_dir is not None

    @property
    def conninfo(self) -> str:
        """The libpq key/value connection string of the running cluster."""
        return f"host={self._socket_dir()} port={self.port} user=postgres dbname=postgres"

    @property
    def url(self) -> str:
        """The same target as a ``postgresql://`` URI, for clients that only take URIs."""
        host = quote(str(self._socket_dir()), safe="/")
        return f"postgresql://postgres@/postgres?host={host}&port={self.port}"

    @property
    def log_path(self) -> Path:
        return self._socket_dir() / "postgres.log"

    def start(self) -> str:
        """Create the cluster if needed, start it, wait until it accepts connections.

        Returns `conninfo`; calling it again while running returns the same. On failure, raises
        `EmbeddedPostgresError` carrying the tool output or the tail of the server log, and
        leaves no server or temporary directory behind.
        """
        if self._run_dir is not None:
            return self.conninfo
        bindir = self.bindir or find_postgres_bindir()
        owner = self._server_owner()
        self._refuse_a_running_server()
        if self.socket_dir is None:
            run_dir = Path(tempfile.mkdtemp(prefix="trioq-pg-", dir=_RUN_DIR_PARENT))
        else:
            run_dir = self.socket_dir
            _private_dir(run_dir, owner)
        self._run_dir, self._server_bindir, self._owner = run_dir, bindir, owner
        try:
            _hand_over(run_dir, owner)
            self._create_cluster_unless_present()
            self._write_server_conf()
            self._start_server()
        except BaseException:
            self._discard()
            raise
        atexit.register(self._stop_at_exit)
        return self.conninfo

    def _refuse_a_running_server(self) -> None:
        """Another server already serving this socket or data directory: say so before anything
        is created (starting would fail, and undoing that start must not touch the other)."""
        if self.socket_dir is not None:
            lock = self.socket_dir / f".s.PGSQL.{self.port}.lock"
            pid = _postmaster_pid(lock)  # a socket lock file starts with the server's pid too
            if pid is not None:
                raise EmbeddedPostgresError(
                    f"port {self.port}: a PostgreSQL server (pid {pid}) already serves "
                    f"{self.socket_dir}; stop it, or choose another port"
                )
        if self.data_dir is not None:
            pid = _postmaster_pid(self.data_dir / "postmaster.pid")
            if pid is not None:
                raise EmbeddedPostgresError(
                    f"data directory {self.data_dir} is in use by a PostgreSQL server (pid "
                    f"{pid}); stop it, or choose another data directory"
                )

    def stop(self) -> None:
        """Shut the server down (fast: open sessions are disconnected) and delete its temp dirs.

        Does nothing when not running, so it is safe to call twice. A `data_dir` passed in is kept.
        """
        if self._run_dir is None:
            return
        if _postmaster_pid(self._pid_file()) is not None:
            self._run_pg_ctl("stop", "-m", "fast")
        atexit.unregister(self._stop_at_exit)
        self._remove_created_dirs()

    def restart(self, mode: str = "fast") -> None:
        """Stop the server with `pg_ctl stop -m MODE` and start it again, returning once it
        accepts connections. "immediate" is a crash (no shutdown checkpoint: the start runs
        crash recovery); every session is cut either way. For fault tests."""
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"mode: {mode!r} must be 'smart', 'fast' or 'immediate'")
        self._socket_dir()  # raises unless running
        self._run_pg_ctl("stop", "-m", mode)
        self._start_server()

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _socket_dir(self) -> Path:
        if self._run_dir is None:
            raise EmbeddedPostgresError("the embedded cluster is not running; call start() first")
        return self._run_dir

    def _cluster_dir(self) -> Path:
        return self.data_dir if self.data_dir is not None else self._socket_dir() / "data"

    def _pid_file(self) -> Path:
        return self._cluster_dir() / "postmaster.pid"

    def _server_owner(self) -> pwd.struct_passwd | None:
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam(self.os_user)
        except KeyError:
            raise EmbeddedPostgresError(
                f"this process runs as root, which PostgreSQL refuses, and there is no "
                f"{self.os_user!r} OS user to run the server as. Create one "
                f"(useradd --system {self.os_user}), run as a non-root user, or set "
                f"TRIOQ_DATABASE_URL to an existing server."
            ) from None

    def _create_cluster_unless_present(self) -> None:
        cluster_dir = self._cluster_dir()
        if (cluster_dir / "PG_VERSION").exists():
            return
        if not cluster_dir.exists():
            cluster_dir.mkdir(mode=0o700, parents=True)
            _hand_over(cluster_dir, self._owner)
        self._run_server_program(["initdb", "-D", str(cluster_dir), *_INITDB_OPTIONS])

    def _write_server_conf(self) -> None:
        # Our settings go to a file of their own, rewritten at each start (the socket dir changes),
        # and included last from postgresql.conf so they win over initdb's defaults.
        cluster_dir = self._cluster_dir()
        main_conf = cluster_dir / "postgresql.conf"
        include = "include_if_exists = 'trioq.conf'"
        if include not in main_conf.read_text():
            with main_conf.open("a") as f:
                f.write(f"\n# Written by trioq.embedded at each start.\n{include}\n")
        lines = self.settings.conf_lines(socket_dir=self._socket_dir(), port=self.port)
        trioq_conf = cluster_dir / "trioq.conf"
        trioq_conf.write_text("\n".join(lines) + "\n")
        _hand_over(trioq_conf, self._owner)

    def _start_server(self) -> None:
        # -l is required: without it the postmaster inherits our captured pipes and pg_ctl's
        # output never reaches end-of-file, so this call would never return.
        try:
            self._run_pg_ctl("start", "-l", str(self.log_path))
        except EmbeddedPostgresError as exc:
            tail = self._log_tail()
            raise EmbeddedPostgresError(f"{exc}\n--- server log tail ---\n{tail}") from None

    def _run_pg_ctl(self, action: str, *options: str) -> None:
        """Run pg_ctl `action`, waiting (up to its timeout) until the server is up or gone."""
        cluster = ["-D", str(self._cluster_dir())]
        self._run_server_program(
            ["pg_ctl", action, *cluster, "-w", "-t", _PG_CTL_TIMEOUT, *options]
        )

    def _run_server_program(self, argv: list[str]) -> None:
        assert self._server_bindir is not None
        owner = self._owner
        command = [str(self._server_bindir / argv[0]), *argv[1:]]
        result = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=_server_env(),
            cwd=self._socket_dir(),
            # The server's own session: a Ctrl-C meant for us does not hit it; stop() and the
            # atexit fallback shut it down in order instead.
            start_new_session=True,
            user=owner.pw_uid if owner else None,
            group=owner.pw_gid if owner else None,
            extra_groups=[] if owner else None,
            check=False,
        )
        if result.returncode != 0:
            as_user = f" (as OS user {owner.pw_name})" if owner else ""
            output = (result.stdout + result.stderr).strip()
            raise EmbeddedPostgresError(
                f"{shlex.join(command)}{as_user} exited with {result.returncode}:\n{output}"
            )

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"(no server log: {exc})"
        return "\n".join(lines[-_LOG_TAIL_LINES:])

    def _stop_at_exit(self) -> None:
        """Fallback for a run that ended without `stop`: signal the recorded postmaster only."""
        if self._run_dir is not None and _shut_down_postmaster(self._pid_file()):
            self._remove_created_dirs()

    def _discard(self) -> None:
        """Undo a failed start: stop a server that may have come up, delete what we created."""
        if self._run_dir is None:
            return
        if _shut_down_postmaster(self._pid_file()):
            self._remove_created_dirs()
        else:
            self._run_dir = None

    def _remove_created_dirs(self) -> None:
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
        self._run_dir = None


def _shut_down_postmaster(pid_file: Path, *, wait_seconds: float = 15.0) -> bool:
    """Signal the postmaster named in `pid_file` (fast, then immediate shutdown).

    Returns whether it is gone. A missing or stale pid file counts as gone. Used where running
    pg_ctl is not wanted (interpreter exit, half-started clusters).
    """
    pid = _postmaster_pid(pid_file)
    if pid is None:
        return True
    for shutdown_signal in (signal.SIGINT, signal.SIGQUIT):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, shutdown_signal)
        # The postmaster removes its pid file as its last act. It is not our child, so there is
        # no exit status to wait on; poll the file (this runs at exit or after a failed start).
        deadline = time.monotonic() + wait_seconds
        while _postmaster_pid(pid_file) == pid:
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        else:
            return True
    return False


def _postmaster_pid(pid_file: Path) -> int | None:
    """The pid in `pid_file` if that process is alive and, where /proc can tell, a postgres."""
    try:
        pid = int(pid_file.read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None
    if Path("/proc/self").exists():
        # A reused pid runs something else; a zombie's cmdline is empty.
        try:
            return pid if b"postgres" in Path(f"/proc/{pid}/cmdline").read_bytes() else None
        except OSError:
            return None
    try:
        with contextlib.suppress(PermissionError):  # alive, but another user's
            os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def _private_dir(path: Path, owner: pwd.struct_passwd | None) -> None:
    """Create `path` (0700), or accept it only as a directory of ours: the server's socket in
    it is a trust-auth superuser, so a directory someone else prepared (or may write to, or a
    symlink to one) would hand it to them. Ours: owned by this user, or by the server's OS
    user when we run it as `postgres`, with no group or other permission bits."""
    try:
        path.mkdir(mode=0o700, parents=True)
        return
    except FileExistsError:
        pass
    info = os.lstat(path)
    ours = {os.getuid()} | ({owner.pw_uid} if owner is not None else set())
    if not stat.S_ISDIR(info.st_mode):
        raise EmbeddedPostgresError(
            f"{path} exists and is not a directory (a symlink or a file): remove it, or choose "
            "another --port"
        )
    if info.st_uid not in ours or info.st_mode & 0o077:
        raise EmbeddedPostgresError(
            f"{path} exists and is not private to you (owner uid {info.st_uid}, mode "
            f"{stat.S_IMODE(info.st_mode):o}): whoever prepared it could reach the server's "
            "superuser socket; remove it, or choose another --port"
        )


def _hand_over(path: Path, owner: pwd.struct_passwd | None) -> None:
    if owner is not None:
        os.chown(path, owner.pw_uid, owner.pw_gid, follow_symlinks=False)


def _server_env() -> dict[str, str]:
    # PG* variables (PGDATA, PGPORT, PGHOST...) would redirect pg_ctl; the C locale keeps server
    # messages (and so our error reports) the same on every machine.
    env = {name: value for name, value in os.environ.items() if not name.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


@contextlib.contextmanager
def embedded_postgres(
    settings: EmbeddedSettings | None = None,
    *,
    data_dir: Path | None = None,
    bindir: Path | None = None,
) -> Iterator[str]:
    """Run an `EmbeddedPostgres` for the duration of the block; yields its conninfo."""
    cluster = EmbeddedPostgres(
        settings=settings or EmbeddedSettings(), data_dir=data_dir, bindir=bindir
    )
    with cluster:
        yield cluster.conninfo


def find_postgres_bindir(
    *,
    path: str | None = None,
    search_globs: Sequence[str] = SEARCH_GLOBS,
    include_pgserver: bool = True,
) -> Path:
    """The directory holding initdb, pg_ctl and postgres.

    Looks, in order, at ``pg_config --bindir``, ``initdb`` on `path` (default: $PATH), the
    `search_globs` (highest version first) and the binaries bundled in the ``pgserver`` wheel
    (the ``trioq[embedded]`` extra). Raises `EmbeddedPostgresError` naming what was tried.
    """
    tried: list[str] = []
    for candidate in _candidate_bindirs(path, search_globs, include_pgserver, tried):
        missing = [name for name in _SERVER_PROGRAMS if not (candidate / name).is_file()]
        if not missing:
            return candidate
        tried.append(f"{candidate} has no {', '.join(missing)}")
    raise EmbeddedPostgresError(
        "PostgreSQL server programs (initdb, pg_ctl, postgres) not found.\n"
        f"Tried: {'; '.join(tried)}.\n"
        "Fix it with one of:\n"
        "  - install the PostgreSQL server package (Debian/Ubuntu: apt-get install postgresql;"
        " Fedora: dnf install postgresql-server; macOS: brew install postgresql)\n"
        "  - set TRIOQ_DATABASE_URL to the URL of an existing server\n"
        "  - pip install 'trioq[embedded]' (bundled server binaries from the pgserver wheel)"
    )


def _candidate_bindirs(
    path: str | None, search_globs: Sequence[str], include_pgserver: bool, tried: list[str]
) -> Iterator[Path]:
    """Candidate directories, cheapest lookups first; notes each lookup that gave nothing."""
    pg_config = shutil.which("pg_config", path=path)
    if pg_config is None:
        tried.append("pg_config is not on PATH")
    else:
        bindir = _pg_config_bindir(pg_config)
        if bindir is None:
            tried.append(f"{pg_config} --bindir failed")
        else:
            yield bindir
    initdb = shutil.which("initdb", path=path)
    if initdb is None:
        tried.append("initdb is not on PATH")
    else:
        yield Path(initdb).resolve().parent
    packaged = [Path(found) for pattern in search_globs for found in glob.glob(pattern)]
    if not packaged:
        tried.append(f"nothing matches {', '.join(search_globs) or '(no search globs)'}")
    yield from sorted(packaged, key=_version_key, reverse=True)
    if include_pgserver:
        bundled = _pgserver_bindir()
        if bundled is None:
            tried.append("the pgserver wheel is not installed")
        else:
            yield bundled


def _pg_config_bindir(pg_config: str) -> Path | None:
    try:
        result = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(result.stdout.strip())


def _version_key(bindir: Path) -> tuple[int, ...]:
    return tuple(int(number) for number in re.findall(r"\d+", str(bindir)))


def _pgserver_bindir() -> Path | None:
    """The bin dir bundled in the optional pgserver wheel, if that is installed."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None:
        return None
    for location in spec.submodule_search_locations or ():
        bundled = Path(location) / "pginstall" / "bin"
        if bundled.is_dir():
            return bundled
    # Layouts differ between pgserver releases; these modules name the dir.
    for module_name in ("pgserver._commands", "pgserver.postgres_server"):
        with contextlib.suppress(ImportError, AttributeError):
            return Path(importlib.import_module(module_name).POSTGRES_BIN_PATH)
    return None

"""`trioq worker --processes N`: one command supervising N worker processes (one core each).

Each child is the same `trioq worker` command with `--processes 1` (and, with
`--health-port P`, its own port P+i). The supervisor:
- on the first SIGINT/SIGTERM sends SIGTERM to every child (each drains), on a second one
  SIGTERM again (each stops at once, as a second signal to one worker does);
- restarts a child that exits while no stop was asked for, after a backoff (0.5 s doubling to
  30 s; back to 0.5 s once a child ran for a minute), and says so on stderr;
- stops the group when a child cannot start for a reason a restart does not fix (exit 2, a
  usage or configuration error such as a busy port; exit 3, the database URL);
- exits 0 when every child drained cleanly, 4 when one abandoned jobs or was killed during the
  stop, else the child's code that ended the group (docs/cli.md).

Children run in their own session, so a terminal's Ctrl-C reaches the supervisor only (which
then counts it once, not once per process). Each child holds the read end of a pipe whose
write end only the supervisor has: if the supervisor dies (SIGKILL), the child sees EOF and
drains, so no worker outlives its supervisor unnoticed. Hand-written: trio has no process
supervisor, and a multiprocessing pool would fork a running trio loop.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence

import attrs
import trio

from .errors import ABANDONED, DATABASE, OK, USAGE

MAX_PROCESSES = 256
FIRST_RESTART_SECONDS = 0.5
MAX_RESTART_SECONDS = 30.0
HEALTHY_RUN_SECONDS = 60.0  # a child that ran this long restarts without the built-up backoff
SUPERVISOR_FD_ENV = "TRIOQ_SUPERVISOR_FD"


def validate_processes(processes: int) -> int:
    if not 1 <= processes <= MAX_PROCESSES:
        raise ValueError(
            f"--processes {processes}: must be a whole number from 1 to {MAX_PROCESSES}"
        )
    return processes


def child_command(argv: Sequence[str], index: int, health_port: int | None) -> list[str]:
    """The child's command line: the same options, `--processes 1` and its own health port
    (argparse keeps the last of a repeated option)."""
    command = [sys.executable, "-m", "trioq.cli", *argv, "--processes", "1"]
    if health_port is not None:
        command += ["--health-port", str(health_port + index)]
    return command


@attrs.define(eq=False)
class ProcessGroup:
    argv: Sequence[str]  # the worker command's arguments, as given
    processes: int
    health_port: int | None = None
    signals_seen: int = 0
    restarts: int = 0
    _children: dict[int, trio.Process] = attrs.field(factory=dict)
    _codes: list[int] = attrs.field(factory=list)
    _fatal: int | None = None
    _stop: trio.Event = attrs.field(factory=trio.Event)

    async def run(self) -> int:
        """Run until every child has exited after a stop; return the group's exit code."""
        read_end, write_end = os.pipe()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._on_signals)
                async with trio.open_nursery() as children:
                    for index in range(self.processes):
                        children.start_soon(self._keep_running, index, read_end)
                nursery.cancel_scope.cancel()
        finally:
            os.close(read_end)
            os.close(write_end)
        return self._exit_code()

    def stop(self, signum: int = signal.SIGTERM) -> None:
        self._stop.set()
        for process in list(self._children.values()):
            if process.returncode is None:
                process.send_signal(signum)

    async def _on_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                self.signals_seen += 1
                what = "draining" if self.signals_seen == 1 else "stopping now"
                _say(f"{signal.Signals(signum).name}: {what} {len(self._children)} worker(s)")
                self.stop()

    async def _keep_running(self, index: int, read_end: int) -> None:
        delay = FIRST_RESTART_SECONDS
        while not self._stop.is_set():
            started = trio.current_time()
            process = await trio.lowlevel.open_process(
                child_command(self.argv, index, self.health_port),
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=(read_end,),
                env={**os.environ, SUPERVISOR_FD_ENV: str(read_end)},
            )
            self._children[index] = process
            if self._stop.is_set():  # a signal came while it started
                process.send_signal(signal.SIGTERM)
            # Never cancelled: the group ends only once every child has exited.
            with trio.CancelScope(shield=True):
                code = await process.wait()
            del self._children[index]
            if self._stop.is_set():
                self._codes.append(code)
                return
            if code in (USAGE, DATABASE):
                _say(f"worker process {index} (pid {process.pid}) could not start (exit {code})")
                self._fatal = code
                self.stop()
                return
            if trio.current_time() - started >= HEALTHY_RUN_SECONDS:
                delay = FIRST_RESTART_SECONDS
            self.restarts += 1
            _say(
                f"worker process {index} (pid {process.pid}) {_how(code)}; restarting in {delay:g}s"
            )
            with trio.move_on_after(delay):
                await self._stop.wait()
            delay = min(delay * 2, MAX_RESTART_SECONDS)

    def _exit_code(self) -> int:
        if self._fatal is not None:
            return self._fatal
        if any(code == ABANDONED or code < 0 for code in self._codes):
            return ABANDONED
        return max((code for code in self._codes if code != OK), default=OK)


def _how(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _say(line: str) -> None:
    print(f"trioq: {line}", file=sys.stderr, flush=True)


def is_supervised_child() -> bool:
    """Whether this process is a child of `--processes` (its supervisor speaks for the group)."""
    return SUPERVISOR_FD_ENV in os.environ


async def stop_when_supervisor_dies() -> None:
    """In a child of `--processes`: wait until the supervisor's pipe reaches EOF (it died),
    then signal ourselves, so the worker drains as on SIGTERM. Returns at once elsewhere."""
    fd = os.environ.get(SUPERVISOR_FD_ENV)
    if fd is None:
        return
    await trio.lowlevel.wait_readable(int(fd))
    _say("the --processes supervisor went away: draining")
    os.kill(os.getpid(), signal.SIGTERM)


__all__ = [
    "ProcessGroup",
    "child_command",
    "is_supervised_child",
    "stop_when_supervisor_dies",
    "validate_processes",
]
